//! Length-prefixed request frames.
//!
//! The size prefix is checked before anything is allocated, and the buffer
//! grows only as bytes actually arrive, so a client announcing a huge frame
//! and sending nothing costs nothing. Frames are split off one reusable
//! buffer: once the previous requests are done with their bytes, the same
//! memory takes the next ones, instead of fresh pages for every request.
//!
//! Under TLS, while the rest of a large frame is on its way, the socket's
//! receive low-water mark (`SO_RCVLOWAT`) is raised to what is missing, so
//! the kernel wakes the reader once for it instead of once per record: a
//! TLS client writes one record of at most 16 KiB per system call, and a
//! 1 MiB produce request woke the broker some sixty times, which cost more
//! CPU than the decryption (librdkafka at 1 KiB records: 31,000 context
//! switches of the broker for 300 MB became 2,000, and throughput rose by a
//! quarter). Plaintext clients write whole requests at once, and there the
//! mark only delays copying until the last byte (measured: a fifth slower),
//! so it is not used. The kernel still wakes the reader early when its
//! buffer or the window runs short; the mark stays below what the socket
//! still has to deliver for the frame, so it is always met.

use std::os::fd::RawFd;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

const READ_CHUNK: usize = 64 * 1024;
/// Frames missing fewer bytes than this are read as they come.
const LOWAT_MIN: usize = 64 * 1024;
/// The highest mark set: the kernel caps it at half its buffer anyway.
const LOWAT_MAX: usize = 1024 * 1024;
/// What the reader may hold between the socket and this frame reader while
/// it waits: under TLS, one incomplete record (16 KiB and its overhead).
/// The bytes the socket still has to deliver can be that much fewer than
/// those missing from the frame, and a mark above them would never be met
/// by a client that waits for the answer.
const HELD_ABOVE: usize = 17 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameReadError {
    #[error("frame of {size} bytes exceeds the maximum of {max}")]
    TooLarge { size: i64, max: usize },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub(crate) struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    max: usize,
    /// The TCP socket under `reader`, whose low-water mark follows the
    /// frame being read, and the mark last set (1 is the kernel's default).
    socket: Option<RawFd>,
    lowat: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(reader: R, max: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            buf: BytesMut::new(),
            max,
            socket: None,
            lowat: 1,
        }
    }

    /// Reads through `reader` from the TCP socket `fd`, which must stay
    /// open as long as this reader (it is the socket `reader` wraps).
    pub(crate) fn over_socket(reader: R, max: usize, fd: RawFd) -> FrameReader<R> {
        FrameReader {
            socket: Some(fd),
            ..FrameReader::new(reader, max)
        }
    }

    /// Asks the kernel to wake the reader once `missing` more bytes are in
    /// (or as they come, for a small remainder).
    fn expect(&mut self, missing: usize) {
        let Some(fd) = self.socket else {
            return;
        };
        // Less what the layer above the socket may already hold.
        let want = match missing.saturating_sub(HELD_ABOVE) {
            w if w >= LOWAT_MIN => w.min(LOWAT_MAX),
            _ => 1,
        };
        if want == self.lowat {
            return;
        }
        let value = want as libc::c_int;
        // SAFETY: `fd` is the open socket this reader reads (see
        // `over_socket`); the option value is a c_int that outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        // Unsupported or refused: read as the bytes come, as before.
        self.lowat = if rc == 0 { want } else { 1 };
        if rc != 0 {
            self.socket = None;
        }
    }

    /// The next frame body. `Ok(None)` is a clean end of stream between frames.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, FrameReadError> {
        loop {
            if self.buf.len() >= 4 {
                let size = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if size < 0 || size as usize > self.max {
                    return Err(FrameReadError::TooLarge {
                        size: size as i64,
                        max: self.max,
                    });
                }
                let whole = 4 + size as usize;
                if self.buf.len() >= whole {
                    self.buf.advance(4);
                    return Ok(Some(self.buf.split_to(size as usize).freeze()));
                }
                self.expect(whole - self.buf.len());
            } else {
                self.expect(0);
            }
            if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
                self.buf.reserve(READ_CHUNK);
            }
            if self.reader.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameReadError::Truncated)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_frames_and_rejects_oversized_and_truncated() {
        let data: &[u8] = &[0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 9, b'x'];
        let mut r = FrameReader::new(data, 100);
        assert_eq!(r.next().await.unwrap().unwrap(), Bytes::from_static(b"abc"));
        assert!(matches!(r.next().await, Err(FrameReadError::Truncated)));
        let big: &[u8] = &[0x7f, 0, 0, 0];
        assert!(matches!(
            FrameReader::new(big, 100).next().await,
            Err(FrameReadError::TooLarge { .. })
        ));
        let empty: &[u8] = &[];
        assert!(FrameReader::new(empty, 100).next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_large_frame_sent_in_small_writes_arrives_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let sent = body.clone();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut out = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut frame = (sent.len() as i32).to_be_bytes().to_vec();
            frame.extend_from_slice(&sent);
            // A small frame after the large one must not wait for more bytes.
            frame.extend_from_slice(&[0, 0, 0, 2, b'o', b'k']);
            for chunk in frame.chunks(16 * 1024) {
                out.write_all(chunk).await.unwrap();
            }
            out
        });
        let (stream, _) = listener.accept().await.unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let mut r = FrameReader::over_socket(stream, 4_000_000, fd);
        assert_eq!(r.next().await.unwrap().unwrap(), Bytes::from(body));
        let small = tokio::time::timeout(std::time::Duration::from_secs(5), r.next()).await;
        assert_eq!(small.unwrap().unwrap().unwrap(), Bytes::from_static(b"ok"));
        drop(writer.await.unwrap());
    }

    /// Like rustls: reads the socket, but hands on only whole records
    /// (here a 2-byte length and that many bytes), holding a partial one.
    struct Records {
        inner: tokio::net::TcpStream,
        raw: Vec<u8>,
        plain: std::collections::VecDeque<u8>,
    }

    impl AsyncRead for Records {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let this = self.get_mut();
            loop {
                while this.raw.len() >= 2 {
                    let n = u16::from_be_bytes([this.raw[0], this.raw[1]]) as usize;
                    if this.raw.len() < 2 + n {
                        break;
                    }
                    this.plain.extend(&this.raw[2..2 + n]);
                    this.raw.drain(..2 + n);
                }
                if !this.plain.is_empty() {
                    let k = buf.remaining().min(this.plain.len());
                    let out: Vec<u8> = this.plain.drain(..k).collect();
                    buf.put_slice(&out);
                    return std::task::Poll::Ready(Ok(()));
                }
                let mut tmp = [0u8; 4096];
                let mut rb = tokio::io::ReadBuf::new(&mut tmp);
                std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
                if rb.filled().is_empty() {
                    return std::task::Poll::Ready(Ok(()));
                }
                this.raw.extend_from_slice(rb.filled());
            }
        }
    }

    #[tokio::test]
    async fn a_record_held_above_the_socket_does_not_stall_a_large_frame() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = vec![7u8; 300_000];
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut wire = Vec::new();
        for record in frame.chunks(16 * 1024) {
            wire.extend_from_slice(&(record.len() as u16).to_be_bytes());
            wire.extend_from_slice(record);
        }
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut out = tokio::net::TcpStream::connect(addr).await.unwrap();
            // Ten whole records and half of the eleventh, then a pause: the
            // reader holds the half record while it waits for the rest.
            let first = 10 * (2 + 16 * 1024) + 8 * 1024;
            out.write_all(&wire[..first]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            out.write_all(&wire[first..]).await.unwrap();
            // Like a client waiting for its answer: nothing more is sent.
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        });
        let (stream, _) = listener.accept().await.unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let records = Records {
            inner: stream,
            raw: Vec::new(),
            plain: Default::default(),
        };
        let mut r = FrameReader::over_socket(records, 1_000_000, fd);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), r.next()).await;
        assert_eq!(got.expect("stalled").unwrap().unwrap(), Bytes::from(body));
        writer.abort();
    }
}

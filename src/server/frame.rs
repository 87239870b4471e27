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
//! buffer or the window runs short, so a mark set too high cannot stall
//! the connection.

use std::os::fd::RawFd;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

const READ_CHUNK: usize = 64 * 1024;
/// Frames missing fewer bytes than this are read as they come.
const LOWAT_MIN: usize = 64 * 1024;
/// The highest mark set: the kernel caps it at half its buffer anyway.
const LOWAT_MAX: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("frame of {size} bytes exceeds the maximum of {max}")]
    TooLarge { size: i64, max: usize },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    max: usize,
    /// The TCP socket under `reader`, whose low-water mark follows the
    /// frame being read, and the mark last set (1 is the kernel's default).
    socket: Option<RawFd>,
    lowat: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R, max: usize) -> FrameReader<R> {
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
    pub fn over_socket(reader: R, max: usize, fd: RawFd) -> FrameReader<R> {
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
        let want = if missing >= LOWAT_MIN {
            missing.min(LOWAT_MAX)
        } else {
            1
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
    pub async fn next(&mut self) -> Result<Option<Bytes>, FrameReadError> {
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
}

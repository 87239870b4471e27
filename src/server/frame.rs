//! Length-prefixed request frames.
//!
//! The size prefix is checked before anything is allocated, and the buffer
//! grows only as bytes actually arrive, so a client announcing a huge frame
//! and sending nothing costs nothing. Frames are split off one reusable
//! buffer: once the previous requests are done with their bytes, the same
//! memory takes the next ones, instead of fresh pages for every request.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

const READ_CHUNK: usize = 64 * 1024;

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
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R, max: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            buf: BytesMut::new(),
            max,
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
                if self.buf.len() >= 4 + size as usize {
                    self.buf.advance(4);
                    return Ok(Some(self.buf.split_to(size as usize).freeze()));
                }
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
}

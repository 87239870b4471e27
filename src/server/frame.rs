//! Length-prefixed request frames.
//!
//! The size prefix is checked before anything is allocated, and the body
//! buffer grows only as bytes actually arrive, so a client announcing a huge
//! frame and sending nothing costs nothing.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

const INITIAL_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("frame of {size} bytes exceeds the maximum of {max}")]
    TooLarge { size: i64, max: usize },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Reads one frame body. `Ok(None)` is a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Bytes>, FrameReadError> {
    let mut len_buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut len_buf[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameReadError::Truncated)
            };
        }
        got += n;
    }
    let size = i32::from_be_bytes(len_buf);
    if size < 0 || size as usize > max {
        return Err(FrameReadError::TooLarge {
            size: size as i64,
            max,
        });
    }
    let size = size as usize;
    let mut buf = BytesMut::with_capacity(size.min(INITIAL_CHUNK));
    while buf.len() < size {
        if buf.capacity() == buf.len() {
            buf.reserve((size - buf.len()).min(buf.len().max(INITIAL_CHUNK)));
        }
        let want = size - buf.len();
        let n = (&mut *reader).take(want as u64).read_buf(&mut buf).await?;
        if n == 0 {
            return Err(FrameReadError::Truncated);
        }
    }
    Ok(Some(buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_frames_and_rejects_oversized_and_truncated() {
        let mut data: &[u8] = &[0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 9, b'x'];
        assert_eq!(
            read_frame(&mut data, 100).await.unwrap().unwrap(),
            Bytes::from_static(b"abc")
        );
        assert!(matches!(
            read_frame(&mut data, 100).await,
            Err(FrameReadError::Truncated)
        ));
        let mut big: &[u8] = &[0x7f, 0, 0, 0];
        assert!(matches!(
            read_frame(&mut big, 100).await,
            Err(FrameReadError::TooLarge { .. })
        ));
        let mut empty: &[u8] = &[];
        assert!(read_frame(&mut empty, 100).await.unwrap().is_none());
    }
}

//! Provides compression utilities for encoding records.
//!
//! This module has implementations of gzip, Snappy, as well as a noop compression format that
//! allows encoding and decoding records into a [`Record`](crate::records::Record).

use crate::protocol::buf::{ByteBuf, ByteBufMut};
use anyhow::Result;

#[cfg(feature = "gzip")]
mod gzip;
#[cfg(feature = "lz4")]
mod lz4;
mod none;
#[cfg(feature = "snappy")]
mod snappy;
#[cfg(feature = "zstd")]
mod zstd;

#[cfg(feature = "gzip")]
pub use gzip::Gzip;
#[cfg(feature = "lz4")]
pub use lz4::Lz4;
pub use none::None;
#[cfg(feature = "snappy")]
pub use snappy::Snappy;
#[cfg(feature = "zstd")]
pub use zstd::Zstd;

/// Strata: the most bytes one compressed record area may expand to. A
/// decompressor stops with an error past it instead of following a
/// decompression bomb (a few kilobytes of zstd or gzip that expand to
/// gigabytes) or a snappy header declaring a length its block cannot hold.
/// Kafka limits batches by their compressed size (message.max.bytes, 1 MiB
/// by default), so no real batch comes near this.
pub const MAX_DECOMPRESSED_BYTES: usize = 128 << 20;

/// A sink for decompressed bytes that refuses to grow past
/// [`MAX_DECOMPRESSED_BYTES`]: it holds only what the decoder produced.
#[cfg(any(feature = "gzip", feature = "lz4", feature = "zstd"))]
pub(crate) struct CappedWriter(pub(crate) Vec<u8>);

#[cfg(any(feature = "gzip", feature = "lz4", feature = "zstd"))]
impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_DECOMPRESSED_BYTES {
            return Err(std::io::Error::other(format!(
                "decompressed data exceeds {MAX_DECOMPRESSED_BYTES} bytes"
            )));
        }
        // Grown exactly (doubling, but never past the cap), so the largest
        // allocation is the cap, not twice it.
        if self.0.capacity() - self.0.len() < buf.len() {
            let want = (self.0.len() + buf.len()).max(self.0.len() * 2);
            self.0
                .reserve_exact(want.min(MAX_DECOMPRESSED_BYTES) - self.0.len());
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A trait for record compression algorithms.
pub trait Compressor<B: ByteBufMut> {
    /// Target buffer type for compression.
    type BufMut: ByteBufMut;
    /// Compresses into provided [`ByteBufMut`], with records encoded by `F` into `R`.
    fn compress<R, F>(buf: &mut B, f: F) -> Result<R>
    where
        F: FnOnce(&mut Self::BufMut) -> Result<R>;
}

/// A trait for record decompression algorithms.
pub trait Decompressor<B: ByteBuf> {
    /// Target buffer type for decompression.
    type Buf: ByteBuf;
    /// Decompress records from `B` mapped using `F` into `R`.
    fn decompress<R, F>(buf: &mut B, f: F) -> Result<R>
    where
        F: FnOnce(&mut Self::Buf) -> Result<R>;
}

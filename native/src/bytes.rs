//! Reading big-endian fields out of a frame without ever reading past its end.
//!
//! Every read is checked: a read that would pass `end` answers `None`, and the readers above turn that into
//! "not for the fast path" (the general path then judges the frame). Nothing here can panic on any input.

use pyo3::buffer::ReadOnlyCell;

/// Bytes the readers can look at: a plain slice (Rust's own tests) or a Python buffer's cells (the proxy:
/// `bytes` from the socket, read in place, never copied; a cell read is a plain load, no `unsafe` needed).
pub trait Bytes {
    fn byte(&self, i: usize) -> Option<u8>;
    fn size(&self) -> usize;
}

impl Bytes for [u8] {
    #[inline]
    fn byte(&self, i: usize) -> Option<u8> {
        self.get(i).copied()
    }
    #[inline]
    fn size(&self) -> usize {
        self.len()
    }
}

impl Bytes for [ReadOnlyCell<u8>] {
    #[inline]
    fn byte(&self, i: usize) -> Option<u8> {
        self.get(i).map(ReadOnlyCell::get)
    }
    #[inline]
    fn size(&self) -> usize {
        self.len()
    }
}

/// A position in `buf`, moving forward, that never passes `end` (itself at most the buffer's size).
pub struct Cursor<'a, B: Bytes + ?Sized> {
    buf: &'a B,
    pub pos: usize,
    pub end: usize,
}

impl<'a, B: Bytes + ?Sized> Cursor<'a, B> {
    pub fn new(buf: &'a B, start: usize, end: usize) -> Option<Self> {
        (start <= end && end <= buf.size()).then_some(Cursor { buf, pos: start, end })
    }

    /// A cursor over the next bytes up to `end` (within this one's), for a part read on its own.
    pub fn within(&self, end: usize) -> Option<Cursor<'a, B>> {
        (self.pos <= end && end <= self.end).then_some(Cursor { buf: self.buf, pos: self.pos, end })
    }

    #[inline]
    pub fn left(&self) -> usize {
        self.end - self.pos
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        if self.left() < N {
            return None;
        }
        let mut out = [0u8; N];
        for (k, slot) in out.iter_mut().enumerate() {
            *slot = self.buf.byte(self.pos + k)?;
        }
        self.pos += N;
        Some(out)
    }

    #[inline]
    pub fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }
    #[inline]
    pub fn i8(&mut self) -> Option<i8> {
        self.array::<1>().map(i8::from_be_bytes)
    }
    #[inline]
    pub fn i16(&mut self) -> Option<i16> {
        self.array::<2>().map(i16::from_be_bytes)
    }
    #[inline]
    pub fn i32(&mut self) -> Option<i32> {
        self.array::<4>().map(i32::from_be_bytes)
    }
    #[inline]
    pub fn i64(&mut self) -> Option<i64> {
        self.array::<8>().map(i64::from_be_bytes)
    }

    /// Skip `n` bytes, which must be there.
    #[inline]
    pub fn skip(&mut self, n: usize) -> Option<()> {
        if self.left() < n {
            return None;
        }
        self.pos += n;
        Some(())
    }

    /// An unsigned varint of at most 5 bytes (Kafka's compact lengths and counts), as the general path's
    /// `bounds.read_uvarint` reads it.
    pub fn uvarint(&mut self) -> Option<u64> {
        let mut value: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            value |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Some(value);
            }
            shift += 7;
            if shift > 28 {
                return None;
            }
        }
    }

    /// `n` bytes as a string; `None` past the end or when they are not UTF-8 (strict, as Python decodes).
    pub fn string(&mut self, n: usize) -> Option<String> {
        if self.left() < n {
            return None;
        }
        let mut raw = Vec::with_capacity(n);
        for k in 0..n {
            raw.push(self.buf.byte(self.pos + k)?);
        }
        self.pos += n;
        String::from_utf8(raw).ok()
    }
}

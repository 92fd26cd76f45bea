//! The pieces of Kafka's flexible (compact) encoding that several readers walk: tagged fields, compact
//! byte strings, compact array counts. Every length is checked against what is left before it is used.

use crate::bytes::{Bytes, Cursor};

/// Tagged fields: a count, then (tag, size, bytes) each; skipped whole.
pub fn skip_tags<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<()> {
    for _ in 0..c.uvarint()? {
        c.uvarint()?; // the tag
        let size = c.uvarint()?;
        c.skip(usize::try_from(size).ok()?)?;
    }
    Some(())
}

/// Tagged fields some of whose tags kio knows: each of `known` (tag, size of its fixed fields) holds a struct of
/// those fields and its own tagged fields, which must fill the tag exactly (kio reads a known tag whole and
/// refuses one that does not parse); any other tag is skipped by its size, as kio skips unknown tags.
pub fn skip_tags_known<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>, known: &[(u64, usize)]) -> Option<()> {
    for _ in 0..c.uvarint()? {
        let tag = c.uvarint()?;
        let size = usize::try_from(c.uvarint()?).ok()?;
        let end = c.pos.checked_add(size)?;
        let mut inner = c.within(end)?;
        if let Some(&(_, fixed)) = known.iter().find(|(t, _)| *t == tag) {
            inner.skip(fixed)?;
            skip_tags(&mut inner)?;
            if inner.left() != 0 {
                return None;
            }
        }
        c.skip(size)?;
    }
    Some(())
}

/// A compact (nullable) string or byte array (records): its length + 1, then its bytes.
pub fn skip_bytes<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<()> {
    let n = c.uvarint()?;
    c.skip(usize::try_from(n.saturating_sub(1)).ok()?)
}

/// A compact array's length; each element takes at least `smallest` bytes, so more cannot fit. A null array
/// (where `nullable`) counts 0.
pub fn count<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>, smallest: u64, nullable: bool) -> Option<u64> {
    let n = c.uvarint()? as i64 - 1;
    if n == -1 && nullable {
        return Some(0);
    }
    if n < 0 || (n as u64) * smallest > c.left() as u64 {
        return None; // null where it may not be, or more than fits
    }
    Some(n as u64)
}

/// A body read field by field, in the fixed-width encoding or the flexible (compact) one: lengths and strings
/// as the general path's field-by-field reader reads them. The readers add what is their own (lifecycle.rs).
pub struct Fields<'a, B: Bytes + ?Sized> {
    pub c: Cursor<'a, B>,
    pub flexible: bool,
}

impl<B: Bytes + ?Sized> Fields<'_, B> {
    /// An array's (`wide`: int32) or a string's (int16) length, compact (unsigned varint, minus one) when
    /// flexible; -1 for null.
    pub fn length(&mut self, wide: bool) -> Option<i64> {
        if self.flexible {
            Some(self.c.uvarint()? as i64 - 1)
        } else if wide {
            Some(i64::from(self.c.i32()?))
        } else {
            Some(i64::from(self.c.i16()?))
        }
    }

    /// A string; `Some(None)` for a null one where `nullable`, `None` (unreadable) for any other negative length.
    pub fn string_or_null(&mut self, nullable: bool) -> Option<Option<String>> {
        let n = self.length(false)?;
        if n < 0 {
            return (nullable && n == -1).then_some(None);
        }
        Some(Some(self.c.string(usize::try_from(n).ok()?)?))
    }

    pub fn string(&mut self) -> Option<String> {
        self.string_or_null(false)?
    }

    /// Tagged fields, skipped whole when flexible (none in the fixed-width encoding).
    pub fn skip_tags(&mut self) -> Option<()> {
        if self.flexible {
            skip_tags(&mut self.c)?;
        }
        Some(())
    }
}

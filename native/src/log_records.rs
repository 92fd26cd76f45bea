//! The records of one uncompressed v2 record batch, read in place: (offset, key bounds, value bounds).
//!
//! The transaction log follower reads `__transaction_state`, which the coordinator writes uncompressed;
//! the caller (codecs/transaction_log.py) checks the batch's magic, compression and control bit first and
//! hands over one whole batch. Strict: the batch's CRC-32C must match its bytes (as kio's reader checks it),
//! every record's length must match what it holds, the record count must match the records, the batch must
//! end where its length says. `None` otherwise (the caller then calls the batch malformed). The property tests
//! hold this reader to kio's batch reader.

use crate::bytes::{Bytes, Cursor};

const MAGIC: usize = 16;
const CRC: usize = 17;
const ATTRIBUTES: usize = 21;
const RECORD_COUNT: usize = 57;
const HEADER: usize = 61;
const COMPRESSION: i16 = 0x07;
const CONTROL: i16 = 0x20;
const COMPRESSION_OR_CONTROL: i16 = COMPRESSION | CONTROL;
const SMALLEST_RECORD: u64 = 7; // length, attributes, timestamp delta, offset delta, key, value, headers

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as Kafka checks a v2 batch: over its bytes from the
/// attributes to its end. A table of 256 entries, built at compile time.
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

fn crc32c<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize) -> Option<u32> {
    let mut crc = !0u32;
    for i in start..stop {
        let b = buf.byte(i)?;
        crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    Some(!crc)
}

/// (offset, key bounds, value bounds): a bound is `None` for a null key or value.
pub type LogRecord = (i64, Option<(usize, usize)>, Option<(usize, usize)>);

/// A zigzag varint of at most `max_bytes` bytes (5: int32, 10: int64).
fn varint<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>, max_bytes: u32) -> Option<i64> {
    let mut raw: u64 = 0;
    for k in 0..max_bytes {
        let b = c.u8()?;
        raw |= u64::from(b & 0x7F) << (7 * k);
        if b & 0x80 == 0 {
            return Some(((raw >> 1) as i64) ^ -((raw & 1) as i64));
        }
    }
    None
}

/// A varint length then that many bytes: their bounds, `None` inside for a null (-1); `None` outside for a
/// length past the end or below -1.
fn bounded<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<Option<(usize, usize)>> {
    let n = varint(c, 5)?;
    if n == -1 {
        return Some(None);
    }
    let size = usize::try_from(n).ok()?;
    let start = c.pos;
    c.skip(size)?;
    Some(Some((start, start + size)))
}

fn record<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>, base_offset: i64) -> Option<LogRecord> {
    let length = usize::try_from(varint(c, 5)?).ok()?;
    let end = c.pos.checked_add(length)?;
    if end > c.end {
        return None;
    }
    c.skip(1)?; // attributes
    varint(c, 10)?; // timestamp delta
    let offset = base_offset.checked_add(varint(c, 5)?)?;
    let key = bounded(c)?;
    let value = bounded(c)?;
    let headers = varint(c, 5)?;
    if headers < 0 || headers as u64 * 2 > c.left() as u64 {
        return None;
    }
    for _ in 0..headers {
        bounded(c)??; // a header's key: never null
        bounded(c)?; // its value
    }
    (c.pos == end).then_some((offset, key, value))
}

/// The bytes within `bounds` (a key or a value), copied out of the buffer.
pub fn copied<B: Bytes + ?Sized>(buf: &B, bounds: Option<(usize, usize)>) -> Option<Option<Vec<u8>>> {
    let Some((start, stop)) = bounds else { return Some(None) };
    (start..stop).map(|i| buf.byte(i)).collect::<Option<Vec<u8>>>().map(Some)
}

/// `buf[start..stop]`: exactly one batch, from its base offset to its last record.
pub fn read_batch_records<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize) -> Option<Vec<LogRecord>> {
    let mut head = Cursor::new(buf, start, stop)?;
    if head.left() < HEADER {
        return None;
    }
    let base_offset = head.i64()?;
    let length = head.i32()?;
    if i64::from(length) != (stop - start) as i64 - 12 {
        return None;
    }
    head.skip(MAGIC - 12)?;
    if head.u8()? != 2 {
        return None;
    }
    let stored = head.i32()? as u32;
    debug_assert_eq!(head.pos, start + CRC + 4);
    if crc32c(buf, start + ATTRIBUTES, stop)? != stored {
        return None;
    }
    if head.i16()? & COMPRESSION_OR_CONTROL != 0 {
        return None;
    }
    head.skip(RECORD_COUNT - ATTRIBUTES - 2)?;
    let n = head.i32()?;
    debug_assert_eq!(head.pos, start + HEADER);
    if n < 0 || n as u64 * SMALLEST_RECORD > head.left() as u64 {
        return None;
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push(record(&mut head, base_offset)?);
    }
    (head.left() == 0).then_some(out)
}

/// What stopped reading a record set at a batch (its position in the buffer): a batch this reader does not know
/// (magic, compression) or one that does not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetFailure {
    Unknown(usize),
    Malformed(usize),
}

const BATCH_HEAD: usize = 12; // base offset, batch length

/// Every record of the batches of a record set in `buf[start..stop]`, each one given to `decode` with its key
/// and value bounds, in order; control batches skipped; a partial batch at the end ends the set. The records
/// before a batch that stops the reading are kept, with the failure.
pub fn read_record_set<B: Bytes + ?Sized, T>(
    buf: &B, start: usize, stop: usize,
    decode: impl Fn(&B, Option<(usize, usize)>, Option<(usize, usize)>) -> T,
) -> (Vec<(i64, T)>, Option<SetFailure>) {
    let mut out = Vec::new();
    let Some(mut c) = Cursor::new(buf, start, stop) else { return (out, Some(SetFailure::Malformed(start))) };
    while c.left() >= BATCH_HEAD {
        let pos = c.pos;
        let mut head = match c.within(stop) { Some(h) => h, None => break };
        let (Some(_), Some(length)) = (head.i64(), head.i32()) else { break };
        let Ok(length) = usize::try_from(length) else { break };
        let Some(end) = (pos + BATCH_HEAD).checked_add(length) else { break };
        if length == 0 || end > stop {
            break; // a partial batch at the end: Fetch cut there
        }
        if end - pos < HEADER {
            return (out, Some(SetFailure::Malformed(pos)));
        }
        // Within the header (its HEADER bytes are there): the magic, past the CRC the attributes.
        let magic = head.skip(MAGIC - BATCH_HEAD).and_then(|()| head.u8());
        let attributes = head.skip(ATTRIBUTES - MAGIC - 1).and_then(|()| head.i16());
        let (Some(magic), Some(attributes)) = (magic, attributes) else {
            return (out, Some(SetFailure::Malformed(pos)));
        };
        if magic != 2 || attributes & COMPRESSION != 0 {
            return (out, Some(SetFailure::Unknown(pos)));
        }
        if attributes & CONTROL == 0 {
            let Some(records) = read_batch_records(buf, pos, end) else {
                return (out, Some(SetFailure::Malformed(pos)));
            };
            out.extend(records.into_iter().map(|(offset, key, value)| (offset, decode(buf, key, value))));
        }
        if c.skip(end - pos).is_none() {
            break;
        }
    }
    (out, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zigzag(n: i64) -> Vec<u8> {
        let mut raw = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (raw & 0x7F) as u8;
            raw >>= 7;
            if raw == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// A record's key and value, each null or bytes.
    type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

    fn batch(base: i64, records: &[KeyValue<'_>]) -> Vec<u8> {
        let mut body = Vec::new();
        for (i, (k, v)) in records.iter().enumerate() {
            let mut r = vec![0u8];
            r.extend(zigzag(0));
            r.extend(zigzag(i as i64));
            for field in [k, v] {
                match field {
                    None => r.extend(zigzag(-1)),
                    Some(x) => {
                        r.extend(zigzag(x.len() as i64));
                        r.extend(*x);
                    }
                }
            }
            r.extend(zigzag(0));
            body.extend(zigzag(r.len() as i64));
            body.extend(r);
        }
        let mut b = vec![0u8; HEADER];
        b[0..8].copy_from_slice(&base.to_be_bytes());
        b[8..12].copy_from_slice(&((HEADER - 12 + body.len()) as i32).to_be_bytes());
        b[16] = 2;
        b[57..61].copy_from_slice(&(records.len() as i32).to_be_bytes());
        b.extend(body);
        let crc = crc32c(b.as_slice(), ATTRIBUTES, b.len()).unwrap();
        b[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn the_crc_is_castagnolis() {
        // The check value of CRC-32C: "123456789" -> 0xE3069283.
        assert_eq!(crc32c(b"123456789".as_slice(), 0, 9), Some(0xE306_9283));
    }

    #[test]
    fn a_batch_whose_bytes_do_not_match_its_crc_is_declined() {
        let mut b = batch(0, &[(Some(b"key"), Some(b"value"))]);
        assert!(read_batch_records(b.as_slice(), 0, b.len()).is_some());
        let last = b.len() - 2;
        b[last] ^= 1;
        assert_eq!(read_batch_records(b.as_slice(), 0, b.len()), None);
    }

    #[test]
    fn records_are_read_with_their_offsets() {
        let b = batch(40, &[(Some(b"k1"), Some(b"v1")), (Some(b"k2"), None)]);
        let r = read_batch_records(b.as_slice(), 0, b.len()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, 40);
        assert_eq!(r[1].0, 41);
        let (ks, ke) = r[1].1.unwrap();
        assert_eq!(&b[ks..ke], b"k2");
        assert_eq!(r[1].2, None);
    }

    #[test]
    fn every_truncation_is_declined_never_a_panic() {
        let b = batch(0, &[(Some(b"key"), Some(b"value"))]);
        for stop in 0..b.len() {
            assert_eq!(read_batch_records(b.as_slice(), 0, stop), None);
        }
        let mut wrong_count = b.clone();
        wrong_count[60] = 2;
        assert_eq!(read_batch_records(wrong_count.as_slice(), 0, wrong_count.len()), None);
    }
}

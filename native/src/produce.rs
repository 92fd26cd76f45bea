//! A transactional Produce request read in place, for the relay's fast path.
//!
//! The answer is `Some` only for what the general path would pass without a second look: a non-null
//! transactional id, at least one partition, each with at least one record batch, every batch a v2
//! transactional batch of one producer id and epoch (the first batch's), no partition twice, no tagged fields,
//! nothing left over. Anything else (a size past the end, a broken batch, a name that is not UTF-8, more
//! partitions than the general path allows) is `None`: the general path reads the frame again and judges it.
//! The property tests hold this reader to kio's decoding of the same frames.

use crate::bytes::{Bytes, Cursor};

/// A record batch's fixed header (v2): base offset .. producer epoch, base sequence, record count.
pub const BATCH_HEADER_SIZE: usize = 61;
/// The general path's bound on the partitions of one request (`bounds.REQUEST_MAX_ELEMENTS`).
pub const REQUEST_MAX_ELEMENTS: usize = 100_000;
const TRANSACTIONAL: i16 = 0x10;
const NO_PRODUCER: i64 = -2; // not a producer id a batch can carry (the first batch sets it)

#[derive(Debug, PartialEq, Eq)]
pub struct TransactionalWrite {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partitions: Vec<(String, i32)>,
    pub acks: i16,
}

/// A length or count: a compact one (varint, value + 1) in flexible versions, else `i16`/`i32`. `None` when
/// unreadable; negative (null) lengths come back negative for the caller to judge.
fn length<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>, flexible: bool, wide: bool) -> Option<i64> {
    if flexible {
        Some(c.uvarint()? as i64 - 1)
    } else if wide {
        Some(i64::from(c.i32()?))
    } else {
        Some(i64::from(c.i16()?))
    }
}

/// No tagged fields here: one zero byte.
fn no_tags<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<()> {
    (c.u8()? == 0).then_some(())
}

/// The request from its transactional id (`start`) to the frame's end (`stop`) in `buf`.
pub fn scan_transactional<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, flexible: bool)
    -> Option<TransactionalWrite> {
    let mut c = Cursor::new(buf, start, stop)?;
    let n = length(&mut c, flexible, false)?;
    if n <= 0 || n as u64 > c.left() as u64 {
        return None;
    }
    let transactional_id = c.string(n as usize)?;
    let acks = c.i16()?;
    c.skip(4)?; // the timeout
    let topics = length(&mut c, flexible, true)?;
    if topics <= 0 || topics as u64 > c.left() as u64 {
        return None;
    }
    let mut partitions: Vec<(String, i32)> = Vec::new();
    let (mut producer_id, mut producer_epoch) = (NO_PRODUCER, NO_PRODUCER as i16);
    for _ in 0..topics {
        let n = length(&mut c, flexible, false)?;
        if n < 0 || n as u64 > c.left() as u64 {
            return None;
        }
        let topic = c.string(n as usize)?;
        let count = length(&mut c, flexible, true)?;
        if count <= 0 || count as u64 > c.left() as u64
            || partitions.len() as u64 + count as u64 > REQUEST_MAX_ELEMENTS as u64 {
            return None;
        }
        for _ in 0..count {
            let index = c.i32()?;
            let size = length(&mut c, flexible, true)?;
            if size < BATCH_HEADER_SIZE as i64 || size as u64 > c.left() as u64 {
                return None;
            }
            let records_end = c.pos + size as usize;
            while c.pos < records_end {
                // Every batch: v2, transactional, the request's producer.
                if records_end - c.pos < BATCH_HEADER_SIZE {
                    return None;
                }
                let at = c.pos;
                let mut h = Cursor::new(buf, at, records_end)?;
                h.skip(8)?; // base offset
                let batch_length = h.i32()?;
                h.skip(4)?; // partition leader epoch
                let magic = h.i8()?;
                h.skip(4)?; // crc
                let attributes = h.i16()?;
                h.skip(20)?; // last offset delta, base and max timestamps
                let pid = h.i64()?;
                let epoch = h.i16()?;
                let batch_size = 12 + i64::from(batch_length);
                if batch_size < BATCH_HEADER_SIZE as i64 || batch_size as u64 > (records_end - at) as u64
                    || magic != 2 || attributes & TRANSACTIONAL == 0 {
                    return None;
                }
                if pid != producer_id || epoch != producer_epoch {
                    if producer_id != NO_PRODUCER || pid < 0 {
                        return None;
                    }
                    (producer_id, producer_epoch) = (pid, epoch);
                }
                c.pos = at + batch_size as usize;
            }
            if flexible {
                no_tags(&mut c)?;
            }
            partitions.push((topic.clone(), index));
        }
        if flexible {
            no_tags(&mut c)?;
        }
    }
    if flexible {
        no_tags(&mut c)?;
    }
    if c.pos != c.end || has_duplicates(&partitions) {
        return None;
    }
    Some(TransactionalWrite { transactional_id, producer_id, producer_epoch, partitions, acks })
}

fn has_duplicates(partitions: &[(String, i32)]) -> bool {
    if partitions.len() < 2 {
        return false;
    }
    let mut seen = std::collections::HashSet::with_capacity(partitions.len());
    partitions.iter().any(|p| !seen.insert(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, transactional: bool) -> Vec<u8> {
        let mut b = vec![0u8; BATCH_HEADER_SIZE];
        b[8..12].copy_from_slice(&((BATCH_HEADER_SIZE - 12) as i32).to_be_bytes());
        b[16] = 2;
        b[21..23].copy_from_slice(&(if transactional { TRANSACTIONAL } else { 0 }).to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[51..53].copy_from_slice(&epoch.to_be_bytes());
        b
    }

    fn v8_body(txn: &str, topic: &str, records: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((txn.len() as i16).to_be_bytes());
        b.extend(txn.as_bytes());
        b.extend((-1i16).to_be_bytes());
        b.extend(30_000i32.to_be_bytes());
        b.extend(1i32.to_be_bytes());
        b.extend((topic.len() as i16).to_be_bytes());
        b.extend(topic.as_bytes());
        b.extend(1i32.to_be_bytes());
        b.extend(3i32.to_be_bytes());
        b.extend((records.len() as i32).to_be_bytes());
        b.extend(records);
        b
    }

    #[test]
    fn a_plain_write_is_read() {
        let body = v8_body("app", "orders", &batch(7, 1, true));
        let w = scan_transactional(body.as_slice(), 0, body.len(), false).unwrap();
        assert_eq!(w, TransactionalWrite { transactional_id: "app".into(), producer_id: 7, producer_epoch: 1,
                                           partitions: vec![("orders".into(), 3)], acks: -1 });
    }

    #[test]
    fn every_truncation_is_declined_never_a_panic() {
        let body = v8_body("app", "orders", &batch(7, 1, true));
        for stop in 0..body.len() {
            assert_eq!(scan_transactional(body.as_slice(), 0, stop, false), None);
        }
        assert_eq!(scan_transactional(body.as_slice(), 0, body.len() + 1, false), None);
        assert_eq!(scan_transactional(body.as_slice(), 5, 2, false), None);
    }

    #[test]
    fn a_non_transactional_batch_is_left_to_the_general_path() {
        let body = v8_body("app", "orders", &batch(7, 1, false));
        assert_eq!(scan_transactional(body.as_slice(), 0, body.len(), false), None);
    }
}

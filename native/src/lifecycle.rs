//! The transaction life cycle read in place: InitProducerId, AddPartitionsToTxn (v0-3), AddOffsetsToTxn and
//! EndTxn requests and their answers, and TxnOffsetCommit (v0-4), for what the registry learns from them.
//!
//! Each reader takes the few fields the rules use, every length checked against the bytes as it goes, and
//! answers `None` for whatever it cannot read plainly (a size past the end, any tagged field in the body, a
//! null where the rules need a value, an error code kio does not know, trailing bytes, a version not read
//! here): kio reads and judges those in the general path. The property tests hold these readers to kio.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::bytes::{Bytes, Cursor};
use crate::compact::Fields;

pub const INIT_PRODUCER_ID: i16 = 22;
pub const ADD_PARTITIONS: i16 = 24;
pub const ADD_OFFSETS: i16 = 25;
pub const END_TXN: i16 = 26;
pub const TXN_OFFSET_COMMIT: i16 = 28;
pub const CONCURRENT_TRANSACTIONS: i16 = 51;
const REQUEST_MAX_ELEMENTS: u64 = 100_000;
const MAX_TAGGED_FIELDS: u64 = 256;

// The error codes kio knows (a contiguous range: -1 to its newest), set once by the Python side at import
// (codecs/native.py) so that both agree; an answer with any other code is kio's to refuse.
static KNOWN_ERRORS_LOW: AtomicI32 = AtomicI32::new(-1);
static KNOWN_ERRORS_HIGH: AtomicI32 = AtomicI32::new(-1);

pub fn set_known_errors(low: i16, high: i16) {
    KNOWN_ERRORS_LOW.store(i32::from(low), Ordering::Relaxed);
    KNOWN_ERRORS_HIGH.store(i32::from(high), Ordering::Relaxed);
}

fn known(code: i16) -> bool {
    let c = i32::from(code);
    KNOWN_ERRORS_LOW.load(Ordering::Relaxed) <= c && c <= KNOWN_ERRORS_HIGH.load(Ordering::Relaxed)
}

/// The first flexible version (compact strings and arrays, tagged fields) and the last one read here.
fn versions(key: i16) -> Option<(i16, i16)> {
    match key {
        INIT_PRODUCER_ID => Some((2, 5)),
        ADD_PARTITIONS => Some((3, 3)),
        ADD_OFFSETS => Some((3, 4)),
        END_TXN => Some((3, 4)),
        TXN_OFFSET_COMMIT => Some((3, 4)),
        _ => None,
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum TxnRequest {
    InitProducerId { transactional_id: Option<String>, producer_id: i64, producer_epoch: i16, timeout_ms: i32 },
    AddPartitions { transactional_id: String, producer_id: i64, producer_epoch: i16, partitions: Vec<(String, i32)> },
    AddOffsets { transactional_id: String, producer_id: i64, producer_epoch: i16, group_id: String },
    EndTxn { transactional_id: String, producer_id: i64, producer_epoch: i16, committed: bool },
}

#[derive(Debug, PartialEq, Eq)]
pub struct TxnResponse {
    pub error_code: i16,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub accepted: Vec<(String, i32)>,
    pub all_concurrent: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct TxnOffsetCommit {
    pub transactional_id: String,
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// What the life-cycle readers add to the shared field reader (compact.rs's `Fields`).
impl<B: Bytes + ?Sized> Fields<'_, B> {
    fn count(&mut self, smallest: u64) -> Option<u64> {
        let n = self.length(true)?;
        if n < 0 || n as u64 > REQUEST_MAX_ELEMENTS || (n as u64) * smallest > self.c.left() as u64 {
            return None; // null arrays and impossible counts: kio's business
        }
        Some(n as u64)
    }

    fn error_code(&mut self) -> Option<i16> {
        let code = self.c.i16()?;
        known(code).then_some(code)
    }

    fn boolean(&mut self) -> Option<bool> {
        match self.c.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None, // kio says what a bad boolean is
        }
    }

    /// No tagged field at all (kio knows which it may skip).
    fn tags(&mut self) -> Option<()> {
        if self.flexible && self.c.uvarint()? != 0 {
            return None;
        }
        Some(())
    }

    fn done(&mut self) -> Option<()> {
        self.tags()?;
        (self.c.pos == self.c.end).then_some(())
    }
}

/// Where a request's body starts in `buf[start..stop]` (the frame without its length prefix), as the general
/// path's `request_body_offset` finds it (header v1, or v2 when flexible: its tagged fields skipped), with the
/// client id checked to be UTF-8 as kio reads it.
fn body_start<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, flexible: bool) -> Option<usize> {
    let mut c = Cursor::new(buf, start, stop)?;
    c.skip(8)?; // key, version, correlation id
    let n = c.i16()?;
    if n > 0 {
        c.string(n as usize)?;
    }
    if flexible {
        let count = c.uvarint()?;
        if count > MAX_TAGGED_FIELDS {
            return None;
        }
        for _ in 0..count {
            c.uvarint()?;
            let size = c.uvarint()?;
            c.skip(usize::try_from(size).ok()?)?;
        }
    }
    Some(c.pos)
}

fn fields<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, flexible: bool) -> Option<Fields<'_, B>> {
    Some(Fields { c: Cursor::new(buf, start, stop)?, flexible })
}

/// A life-cycle request of API `key` and `version` in `buf[start..stop]` (the frame without its length prefix).
pub fn read_txn_request<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, key: i16, version: i16)
    -> Option<TxnRequest> {
    let (first_flexible, last) = versions(key)?;
    if key == TXN_OFFSET_COMMIT || !(0..=last).contains(&version) {
        return None;
    }
    let flexible = version >= first_flexible;
    let mut r = fields(buf, body_start(buf, start, stop, flexible)?, stop, flexible)?;
    if key == INIT_PRODUCER_ID {
        let transactional_id = r.string_or_null(true)?;
        let timeout_ms = r.c.i32()?;
        let (producer_id, producer_epoch) = if version >= 3 { (r.c.i64()?, r.c.i16()?) } else { (-1, -1) };
        r.done()?;
        return Some(TxnRequest::InitProducerId { transactional_id, producer_id, producer_epoch, timeout_ms });
    }
    let transactional_id = r.string()?;
    let (producer_id, producer_epoch) = (r.c.i64()?, r.c.i16()?);
    match key {
        END_TXN => {
            let committed = r.boolean()?;
            r.done()?;
            Some(TxnRequest::EndTxn { transactional_id, producer_id, producer_epoch, committed })
        }
        ADD_OFFSETS => {
            let group_id = r.string()?;
            r.done()?;
            Some(TxnRequest::AddOffsets { transactional_id, producer_id, producer_epoch, group_id })
        }
        _ => {
            let mut partitions = Vec::new();
            for _ in 0..r.count(if flexible { 2 } else { 6 })? {
                let topic = r.string()?;
                for _ in 0..r.count(4)? {
                    partitions.push((topic.clone(), r.c.i32()?));
                }
                r.tags()?;
            }
            r.done()?;
            Some(TxnRequest::AddPartitions { transactional_id, producer_id, producer_epoch, partitions })
        }
    }
}

/// A life-cycle answer in `buf[start..stop]`: the response from its correlation id.
pub fn read_txn_response<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, key: i16, version: i16)
    -> Option<TxnResponse> {
    let (first_flexible, last) = versions(key)?;
    if key == TXN_OFFSET_COMMIT || !(0..=last).contains(&version) {
        return None;
    }
    let flexible = version >= first_flexible;
    let mut r = fields(buf, start, stop, flexible)?;
    r.c.skip(4)?; // the correlation id
    r.tags()?; // the flexible response header's
    r.c.i32()?; // throttle time
    if key != ADD_PARTITIONS {
        let error_code = r.error_code()?;
        let (producer_id, producer_epoch) =
            if key == INIT_PRODUCER_ID { (r.c.i64()?, r.c.i16()?) } else { (-1, -1) };
        r.done()?;
        let all_concurrent = error_code == CONCURRENT_TRANSACTIONS;
        return Some(TxnResponse { error_code, producer_id, producer_epoch, accepted: Vec::new(), all_concurrent });
    }
    let mut accepted = Vec::new();
    let (mut seen, mut every_concurrent) = (false, true);
    for _ in 0..r.count(if flexible { 2 } else { 6 })? {
        let topic = r.string()?;
        for _ in 0..r.count(if flexible { 7 } else { 6 })? {
            let index = r.c.i32()?;
            let code = r.error_code()?;
            r.tags()?;
            seen = true;
            if code == 0 {
                accepted.push((topic.clone(), index));
            }
            if code != CONCURRENT_TRANSACTIONS {
                every_concurrent = false;
            }
        }
        r.tags()?;
    }
    r.done()?;
    Some(TxnResponse { error_code: 0, producer_id: -1, producer_epoch: -1, accepted,
                       all_concurrent: seen && every_concurrent })
}

/// A TxnOffsetCommit (v0-4) in `buf[start..stop]` (the frame without its length prefix), read whole.
pub fn read_txn_offset_commit<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, version: i16)
    -> Option<TxnOffsetCommit> {
    let (first_flexible, last) = versions(TXN_OFFSET_COMMIT)?;
    if !(0..=last).contains(&version) {
        return None;
    }
    let flexible = version >= first_flexible;
    let mut r = fields(buf, body_start(buf, start, stop, flexible)?, stop, flexible)?;
    let transactional_id = r.string()?;
    let group_id = r.string()?;
    let (producer_id, producer_epoch) = (r.c.i64()?, r.c.i16()?);
    if version >= 3 {
        r.c.i32()?; // generation id
        r.string()?; // member id
        r.string_or_null(true)?; // group instance id
    }
    // A partition: index, offset, (v2+) leader epoch, then a null metadata and no tags: 2 bytes either way.
    let smallest = 4 + 8 + if version >= 2 { 4 } else { 0 } + 2;
    for _ in 0..r.count(if flexible { 2 } else { 6 })? {
        r.string()?; // topic
        for _ in 0..r.count(smallest)? {
            r.c.i32()?; // partition
            r.c.i64()?; // offset
            if version >= 2 {
                r.c.i32()?; // leader epoch
            }
            r.string_or_null(true)?; // metadata
            r.tags()?;
        }
        r.tags()?;
    }
    r.done()?;
    Some(TxnOffsetCommit { transactional_id, group_id, producer_id, producer_epoch })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_txn_v0(txn: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(END_TXN.to_be_bytes());
        b.extend(0i16.to_be_bytes());
        b.extend(9i32.to_be_bytes());
        b.extend(1i16.to_be_bytes());
        b.push(b'c');
        b.extend((txn.len() as i16).to_be_bytes());
        b.extend(txn.as_bytes());
        b.extend(7i64.to_be_bytes());
        b.extend(2i16.to_be_bytes());
        b.push(1);
        b
    }

    #[test]
    fn an_end_txn_is_read_and_every_truncation_declined() {
        let body = end_txn_v0("app");
        assert_eq!(read_txn_request(body.as_slice(), 0, body.len(), END_TXN, 0),
                   Some(TxnRequest::EndTxn { transactional_id: "app".into(), producer_id: 7, producer_epoch: 2,
                                             committed: true }));
        for stop in 0..body.len() {
            assert_eq!(read_txn_request(body.as_slice(), 0, stop, END_TXN, 0), None);
        }
    }

    #[test]
    fn an_unknown_error_code_is_kios_to_refuse() {
        set_known_errors(-1, 133);
        let mut answer = Vec::new();
        answer.extend(5i32.to_be_bytes());
        answer.extend(0i32.to_be_bytes());
        answer.extend(51i16.to_be_bytes());
        let read = read_txn_response(answer.as_slice(), 0, answer.len(), END_TXN, 0).unwrap();
        assert!(read.all_concurrent && read.error_code == 51);
        answer[8..10].copy_from_slice(&999i16.to_be_bytes());
        assert_eq!(read_txn_response(answer.as_slice(), 0, answer.len(), END_TXN, 0), None);
    }
}

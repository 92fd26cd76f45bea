//! A Fetch answer (v12) read in place: what the transaction log follower needs of each partition, and where
//! its records lie in the buffer (nothing copied).
//!
//! The follower long-polls `__transaction_state` for every partition a broker leads: every answer lists each
//! of them, most with no records, and kio's decoding of that answer (built objects per partition, tags, the
//! records' bytes copied) cost more CPU than the whole client path of the transaction it reported. This walks
//! it with bounds and builds one small tuple per partition. `None` for anything not read whole (a length past
//! the end, a count that cannot fit, bytes left over): kio then decodes the answer and judges it.

use crate::bytes::{Bytes, Cursor};
use crate::compact::{count, skip_tags, skip_tags_known};
use crate::endpoints::FETCH_PARTITION_TAGS;

/// The only version read here: the one the follower asks (every broker from 2.8 to 4.4 answers it).
pub const VERSION: i16 = 12;
// Index, error code, high watermark, last stable offset, log start offset.
const PARTITION_FIXED: u64 = 4 + 2 + 8 + 8 + 8;

#[derive(Debug, PartialEq, Eq)]
pub struct FetchedPartition {
    pub partition: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// The records' bounds in the buffer; `None` for null records.
    pub records: Option<(usize, usize)>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct FetchAnswer {
    pub error_code: i16,
    /// The incremental fetch session (KIP-227) the broker keeps for the follower; 0: none.
    pub session_id: i32,
    pub topics: Vec<(String, Vec<FetchedPartition>)>,
}

fn partition<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<FetchedPartition> {
    let partition = c.i32()?;
    let error_code = c.i16()?;
    let high_watermark = c.i64()?;
    c.skip(8)?; // the last stable offset
    let log_start_offset = c.i64()?;
    for _ in 0..count(c, 17, true)? {
        c.skip(16)?; // aborted transactions: producer id, first offset
        skip_tags(c)?;
    }
    c.skip(4)?; // the preferred read replica
    let n = c.uvarint()?;
    let records = if n == 0 {
        None
    } else {
        let size = usize::try_from(n - 1).ok()?;
        let start = c.pos;
        c.skip(size)?;
        Some((start, start + size))
    };
    skip_tags_known(c, FETCH_PARTITION_TAGS)?; // diverging epoch, current leader, snapshot id
    Some(FetchedPartition { partition, error_code, high_watermark, log_start_offset, records })
}

fn answer<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<FetchAnswer> {
    c.skip(4)?; // the correlation id
    skip_tags(c)?; // the response header's
    c.skip(4)?; // the throttle time
    let error_code = c.i16()?;
    let session_id = c.i32()?;
    let mut topics = Vec::new();
    for _ in 0..count(c, 2, false)? {
        let n = c.uvarint()?;
        if n == 0 {
            return None; // a null topic name: kio judges it
        }
        let name = c.string(usize::try_from(n - 1).ok()?)?;
        let k = count(c, PARTITION_FIXED + 7, false)?;
        let mut partitions = Vec::with_capacity(usize::try_from(k).ok()?);
        for _ in 0..k {
            partitions.push(partition(c)?);
        }
        skip_tags(c)?;
        topics.push((name, partitions));
    }
    skip_tags(c)?;
    (c.left() == 0).then_some(FetchAnswer { error_code, session_id, topics })
}

/// `buf[start..stop]`: a Fetch v12 answer from its correlation id on (the frame without its length prefix).
pub fn read_fetch_answer<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize) -> Option<FetchAnswer> {
    let mut c = Cursor::new(buf, start, stop)?;
    answer(&mut c)
}

/// One partition of a Fetch request: (partition, current leader epoch, fetch offset, partition max bytes).
pub type Wanted = (i32, i32, i64, i32);

/// The session (KIP-227) a request runs in: (session id, session epoch); (0, -1) is sessionless.
pub type Session = (i32, i32);

fn uvarint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let b = (n & 0x7F) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A whole Fetch v12 request frame (length prefix included) of `partitions` of one topic, read uncommitted, as a
/// consumer (codecs/log_fetch.py's `fetch_request` packs the same bytes in Python; its tests hold both to kio's).
#[allow(clippy::too_many_arguments)]
pub fn fetch_request(correlation_id: i32, client_id: &str, topic: &str, partitions: &[Wanted], max_wait_ms: i32,
                     min_bytes: i32, max_bytes: i32, session: Session) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + client_id.len() + topic.len() + partitions.len() * 33);
    b.extend(0i32.to_be_bytes()); // the length, set below
    b.extend(1i16.to_be_bytes()); // Fetch
    b.extend(VERSION.to_be_bytes());
    b.extend(correlation_id.to_be_bytes());
    b.extend((client_id.len() as i16).to_be_bytes());
    b.extend(client_id.as_bytes());
    b.push(0); // the request header's tags
    b.extend((-1i32).to_be_bytes()); // replica id: a consumer
    b.extend(max_wait_ms.to_be_bytes());
    b.extend(min_bytes.to_be_bytes());
    b.extend(max_bytes.to_be_bytes());
    b.push(0); // read uncommitted: the log has no transactions of its own
    b.extend(session.0.to_be_bytes());
    b.extend(session.1.to_be_bytes());
    b.push(2); // one topic
    uvarint(&mut b, topic.len() as u64 + 1);
    b.extend(topic.as_bytes());
    uvarint(&mut b, partitions.len() as u64 + 1);
    for &(partition, leader_epoch, fetch_offset, partition_max_bytes) in partitions {
        b.extend(partition.to_be_bytes());
        b.extend(leader_epoch.to_be_bytes());
        b.extend(fetch_offset.to_be_bytes());
        b.extend((-1i32).to_be_bytes()); // last fetched epoch: unknown
        b.extend((-1i64).to_be_bytes()); // log start offset: a consumer's
        b.extend(partition_max_bytes.to_be_bytes());
        b.push(0); // tags
    }
    b.extend([0, 1, 1, 0]); // topic tags, no forgotten topics, an empty rack id, the body's tags
    let size = (b.len() - 4) as i32;
    b[..4].copy_from_slice(&size.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_bytes(records: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(7i32.to_be_bytes()); // correlation id
        b.push(0); // header tags
        b.extend(0i32.to_be_bytes());
        b.extend(0i16.to_be_bytes());
        b.extend(9i32.to_be_bytes()); // session id
        b.push(2); // one topic
        b.push(20); // "__transaction_state": 19 bytes
        b.extend(b"__transaction_state");
        b.push(3); // two partitions
        for (p, recs) in [(0i32, None), (3i32, Some(records))] {
            b.extend(p.to_be_bytes());
            b.extend(0i16.to_be_bytes());
            b.extend(101i64.to_be_bytes());
            b.extend(101i64.to_be_bytes());
            b.extend(5i64.to_be_bytes());
            b.push(0); // null aborted transactions
            b.extend((-1i32).to_be_bytes());
            match recs {
                None => b.push(0),
                Some(r) => {
                    b.push(r.len() as u8 + 1);
                    b.extend(r);
                }
            }
            b.push(0);
        }
        b.push(0); // topic tags
        b.push(0); // top-level tags
        b
    }

    #[test]
    fn an_answer_is_read_with_its_records_bounds() {
        let b = answer_bytes(b"abc");
        let a = read_fetch_answer(b.as_slice(), 0, b.len()).unwrap();
        assert_eq!((a.error_code, a.session_id), (0, 9));
        assert_eq!(a.topics.len(), 1);
        let (name, parts) = &a.topics[0];
        assert_eq!(name, "__transaction_state");
        assert_eq!(parts[0].records, None);
        let (s, e) = parts[1].records.unwrap();
        assert_eq!(&b[s..e], b"abc");
        assert_eq!((parts[1].partition, parts[1].high_watermark, parts[1].log_start_offset), (3, 101, 5));
    }

    #[test]
    fn every_truncation_and_any_excess_is_declined() {
        let b = answer_bytes(b"abc");
        for stop in 0..b.len() {
            assert_eq!(read_fetch_answer(b.as_slice(), 0, stop), None);
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(read_fetch_answer(longer.as_slice(), 0, longer.len()), None);
        assert_eq!(read_fetch_answer(b.as_slice(), 0, b.len() + 1), None);
    }
}

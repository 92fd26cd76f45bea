//! A `__transaction_state` record's key and value, decoded in place: what the follower's view applies.
//!
//! The same rules as the Python reader it stands beside (codecs/transaction_log.py: `transactional_id`,
//! `transaction`), which stays the fallback without this module and the oracle of the property tests
//! (tests/property/test_transaction_log_native.py): key version 0 (an int16-length id); value version 0
//! (fixed-width) or 1 (flexible: compact arrays and strings, tagged fields skipped); a status outside
//! 0-7 or another version is Unknown, never guessed at; anything that does not decode is Malformed.
//! Trailing bytes after the last field are ignored, as the Python reader ignores them.

use crate::bytes::{Bytes, Cursor};
use crate::compact::Fields;

/// What one record does to the view (verification/transaction_log_view.py's `Applied`, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    State = 0,
    Tombstone = 1,
    Unknown = 2,
    Malformed = 3,
}

/// The value's fields: producer id, epoch, timeout, status (0-7), partitions, last update, start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnValue {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub status: u8,
    pub partitions: Vec<(String, i32)>,
    pub last_update_ms: i64,
    pub start_ms: i64,
}

/// A record as the view applies it: the id (None when the key does not decode) and the value when a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub applied: Applied,
    pub transactional_id: Option<String>,
    pub value: Option<TxnValue>,
}

enum Failed {
    Unknown,
    Malformed,
}

/// The transactional id of the key in `buf[start..stop]`.
fn transactional_id<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize) -> Result<String, Failed> {
    let mut c = Cursor::new(buf, start, stop).ok_or(Failed::Malformed)?;
    if c.left() < 4 {
        return Err(Failed::Malformed);
    }
    let version = c.i16().ok_or(Failed::Malformed)?;
    if version != 0 {
        return Err(Failed::Unknown);
    }
    let n = usize::try_from(c.i16().ok_or(Failed::Malformed)?).map_err(|_| Failed::Malformed)?;
    c.string(n).ok_or(Failed::Malformed)
}

/// The value in `buf[start..stop]` (not a tombstone).
fn transaction<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize) -> Result<TxnValue, Failed> {
    let mut c = Cursor::new(buf, start, stop).ok_or(Failed::Malformed)?;
    let version = c.i16().ok_or(Failed::Malformed)?;
    if version != 0 && version != 1 {
        return Err(Failed::Unknown);
    }
    let producer_id = c.i64().ok_or(Failed::Malformed)?;
    let producer_epoch = c.i16().ok_or(Failed::Malformed)?;
    let timeout_ms = c.i32().ok_or(Failed::Malformed)?;
    // A missing status is an unknown one, as the Python reader reads it (-1, not a state).
    let status = c.u8().ok_or(Failed::Unknown)?;
    if status > 7 {
        return Err(Failed::Unknown);
    }
    let mut v = Fields { c, flexible: version >= 1 };
    let rest = (|| {
        let mut partitions = Vec::new();
        for _ in 0..v.length(true)?.max(0) {
            let topic = v.string()?;
            for _ in 0..v.length(true)?.max(0) {
                partitions.push((topic.clone(), v.c.i32()?));
            }
            v.skip_tags()?;
        }
        let last_update_ms = v.c.i64()?;
        let start_ms = v.c.i64()?;
        v.skip_tags()?;
        Some((partitions, last_update_ms, start_ms))
    })();
    let (partitions, last_update_ms, start_ms) = rest.ok_or(Failed::Malformed)?;
    Ok(TxnValue { producer_id, producer_epoch, timeout_ms, status, partitions, last_update_ms, start_ms })
}

/// One record's key and value bounds (None: null) as the view applies it.
pub fn decode<B: Bytes + ?Sized>(buf: &B, key: Option<(usize, usize)>, value: Option<(usize, usize)>) -> Decoded {
    let failed = |applied, transactional_id| Decoded { applied, transactional_id, value: None };
    let Some((ks, ke)) = key else { return failed(Applied::Malformed, None) };
    let id = match transactional_id(buf, ks, ke) {
        Ok(id) => id,
        Err(Failed::Unknown) => return failed(Applied::Unknown, None),
        Err(Failed::Malformed) => return failed(Applied::Malformed, None),
    };
    let Some((vs, ve)) = value else { return failed(Applied::Tombstone, Some(id)) };
    match transaction(buf, vs, ve) {
        Ok(v) => Decoded { applied: Applied::State, transactional_id: Some(id), value: Some(v) },
        Err(Failed::Unknown) => failed(Applied::Unknown, Some(id)),
        Err(Failed::Malformed) => failed(Applied::Malformed, Some(id)),
    }
}

/// Statuses after which the coordinator accepts the id's next transaction: Empty, CompleteCommit, CompleteAbort,
/// Dead (proxy/log_follower.py's ENDED; a tombstone ends it too).
const ENDED: [u8; 4] = [0, 4, 5, 6];

/// One partition's records of a read as the view applies them (codecs/transaction_log.py's `latest`, its oracle).
#[derive(Debug, Default)]
pub struct Latest {
    /// Each id's last record, and every record that could not be read (each is warned of), in offset order.
    pub kept: Vec<(i64, Decoded)>,
    /// How many records of each kind were read (by `Applied`).
    pub counts: [u32; 4],
    /// The offset after the last record read; None when nothing at or after `from` was read.
    pub next_offset: Option<i64>,
    /// The ids whose transaction one of the records ended, each once, in order of that record.
    pub ended: Vec<String>,
}

/// The records at or after offset `from` (those before it were read already) reduced to what the view keeps: an
/// id's earlier states are superseded by its last within the same read, so they are counted and not kept. An
/// idle follower's read carries every change of a busy cluster (three or more records per transaction, most of
/// them of the same ids): the view then applies one record per id, not one per change.
pub fn latest(records: Vec<(i64, Decoded)>, from: i64) -> Latest {
    let records: Vec<(i64, Decoded)> = records.into_iter().filter(|(offset, _)| *offset >= from).collect();
    let mut out = Latest { next_offset: records.last().map(|(offset, _)| offset + 1), ..Latest::default() };
    let keep: Vec<bool> = {
        let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut said: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (i, (_, d)) in records.iter().enumerate() {
            out.counts[d.applied as usize] += 1;
            let Some(id) = d.transactional_id.as_deref() else { continue };
            last.insert(id, i);
            let ends = match d.applied {
                Applied::Tombstone => true,
                Applied::State => d.value.as_ref().is_some_and(|v| ENDED.contains(&v.status)),
                Applied::Unknown | Applied::Malformed => false,
            };
            if ends && said.insert(id) {
                out.ended.push(id.to_owned());
            }
        }
        records.iter().enumerate().map(|(i, (_, d))| match d.applied {
            Applied::Unknown | Applied::Malformed => true,
            Applied::State | Applied::Tombstone => {
                d.transactional_id.as_deref().is_some_and(|id| last.get(id) == Some(&i))
            }
        }).collect()
    };
    out.kept = records.into_iter().zip(keep).filter_map(|(record, kept)| kept.then_some(record)).collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Vec<u8> {
        let mut k = vec![0, 0];
        k.extend((id.len() as i16).to_be_bytes());
        k.extend(id.as_bytes());
        k
    }

    fn value_v0(status: u8, partitions: &[(&str, &[i32])]) -> Vec<u8> {
        let mut v = vec![0, 0];
        v.extend(7i64.to_be_bytes());
        v.extend(1i16.to_be_bytes());
        v.extend(60_000i32.to_be_bytes());
        v.push(status);
        v.extend((partitions.len() as i32).to_be_bytes());
        for (topic, parts) in partitions {
            v.extend((topic.len() as i16).to_be_bytes());
            v.extend(topic.as_bytes());
            v.extend((parts.len() as i32).to_be_bytes());
            for p in *parts {
                v.extend(p.to_be_bytes());
            }
        }
        v.extend(5i64.to_be_bytes());
        v.extend(4i64.to_be_bytes());
        v
    }

    fn decoded(k: &[u8], v: Option<&[u8]>) -> Decoded {
        let mut buf = k.to_vec();
        let value = v.map(|v| {
            buf.extend(v);
            (k.len(), k.len() + v.len())
        });
        decode(buf.as_slice(), Some((0, k.len())), value)
    }

    #[test]
    fn a_state_is_read_whole() {
        let d = decoded(&key("app"), Some(&value_v0(1, &[("orders", &[1, 2])])));
        assert_eq!(d.applied, Applied::State);
        assert_eq!(d.transactional_id.as_deref(), Some("app"));
        let v = d.value.unwrap();
        assert_eq!((v.producer_id, v.producer_epoch, v.timeout_ms, v.status), (7, 1, 60_000, 1));
        assert_eq!(v.partitions, vec![("orders".to_string(), 1), ("orders".to_string(), 2)]);
        assert_eq!((v.last_update_ms, v.start_ms), (5, 4));
    }

    #[test]
    fn a_null_value_is_a_tombstone_and_an_unknown_status_is_never_guessed() {
        assert_eq!(decoded(&key("app"), None).applied, Applied::Tombstone);
        assert_eq!(decoded(&key("app"), Some(&value_v0(9, &[]))).applied, Applied::Unknown);
        let mut v2 = value_v0(1, &[]);
        v2[1] = 2;
        assert_eq!(decoded(&key("app"), Some(&v2)).applied, Applied::Unknown);
        let mut k1 = key("app");
        k1[1] = 1;
        let d = decoded(&k1, Some(&value_v0(1, &[])));
        assert_eq!((d.applied, d.transactional_id), (Applied::Unknown, None));
    }

    #[test]
    fn every_truncation_is_malformed_or_unknown_never_a_panic() {
        let v = value_v0(2, &[("orders", &[1]), ("payments", &[3, 4])]);
        for stop in 0..v.len() {
            let d = decoded(&key("app"), Some(&v[..stop]));
            assert!(matches!(d.applied, Applied::Malformed | Applied::Unknown), "{stop}: {d:?}");
            assert_eq!(d.transactional_id.as_deref(), Some("app"));
        }
        let k = key("app");
        for stop in 0..k.len() {
            assert_eq!(decoded(&k[..stop], None).applied, Applied::Malformed);
        }
    }

    fn state(id: &str, status: u8) -> Decoded {
        Decoded { applied: Applied::State, transactional_id: Some(id.into()),
                  value: Some(TxnValue { producer_id: 7, producer_epoch: 0, timeout_ms: 60_000, status,
                                         partitions: vec![], last_update_ms: 1, start_ms: 1 }) }
    }

    fn other(applied: Applied, id: Option<&str>) -> Decoded {
        Decoded { applied, transactional_id: id.map(Into::into), value: None }
    }

    #[test]
    fn a_read_keeps_each_ids_last_record_and_every_unreadable_one() {
        let records = vec![
            (10, state("a", 1)), (11, state("b", 1)), (12, state("a", 2)), (13, other(Applied::Malformed, None)),
            (14, state("a", 4)), (15, other(Applied::Unknown, Some("b"))), (16, state("b", 1)),
            (17, other(Applied::Tombstone, Some("c"))), (18, state("a", 1)),
        ];
        let read = latest(records, 11);
        let kept: Vec<i64> = read.kept.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(kept, vec![13, 15, 16, 17, 18]);
        assert_eq!(read.counts, [5, 1, 1, 1]);
        assert_eq!(read.next_offset, Some(19));
        assert_eq!(read.ended, vec!["a".to_string(), "c".to_string()]);
    }

    #[test]
    fn a_read_of_records_read_already_changes_nothing() {
        let read = latest(vec![(3, state("a", 1)), (4, state("a", 4))], 5);
        assert!(read.kept.is_empty() && read.ended.is_empty());
        assert_eq!((read.counts, read.next_offset), ([0; 4], None));
    }
}

//! txnguard's native data path (`txnguard._native`): the readers of the relay's fast path.
//!
//! Everything here reads bytes a client or a broker sent, which may be hostile: every read is bounds-checked
//! (`bytes.rs`), nothing here uses `unsafe`, and a panic (a bug, never an input's fault) reaches Python as
//! `PanicException`, which the connection core catches to close only that connection.
//!
//! Every reader takes the buffer the frame lies in and the frame's bounds in it (`start`, `stop`): the socket's
//! read is read where it is, never copied or sliced. Each answers None for what the general path must read.

#![forbid(unsafe_code)]

pub mod book;
pub mod bytes;
pub mod compact;
pub mod endpoints;
pub mod fetch;
pub mod in_doubt;
pub mod lifecycle;
pub mod log_records;
pub mod produce;
pub mod py_in_doubt;
pub mod py_observe;
pub mod py_registry;
pub mod registry;
pub mod traffic;
pub mod transaction_log;

use pyo3::buffer::PyBuffer;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyList, PyString, PyTuple};

use lifecycle::TxnRequest;

/// Run `$read` with `$b` bound to the bytes of `$data`: a `bytes` object as a plain slice (the socket's reads),
/// any other contiguous buffer as its cells (a non-contiguous one: None, the general path reads it).
macro_rules! in_place {
    ($data:expr, |$b:ident| $read:expr) => {{
        let data: &Bound<'_, PyAny> = $data;
        if let Ok(bytes) = data.cast::<PyBytes>() {
            let $b = bytes.as_bytes();
            $read
        } else {
            let buffer = PyBuffer::<u8>::get(data)?;
            match buffer.as_slice(data.py()) {
                Some(cells) => {
                    let $b = cells;
                    $read
                }
                None => None,
            }
        }
    }};
}

/// (transactional id, producer id, producer epoch, [(topic, partition)], acks)
type Write<'py> = (String, i64, i16, Bound<'py, PyList>, i16);

/// `scan_transactional(data, start, stop, flexible)`: the transactional Produce whose body runs from its
/// transactional id at `start` to the frame's end at `stop` in `data`, or None when the fast path must leave
/// it to the general path (produce.rs). A topic's partitions share one string object (the registry looks a
/// topic up once for them: py_registry.rs).
#[pyfunction]
fn scan_transactional<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, start: usize, stop: usize, flexible: bool)
    -> PyResult<Option<Write<'py>>> {
    let found = in_place!(data, |b| produce::scan_transactional(b, start, stop, flexible));
    let Some(w) = found else { return Ok(None) };
    let mut current: Option<(String, Bound<'py, PyString>)> = None;
    let mut items = Vec::with_capacity(w.partitions.len());
    for (topic, partition) in w.partitions {
        let name = match &current {
            Some((text, name)) if *text == topic => name.clone(),
            _ => {
                let name = PyString::new(py, &topic);
                current = Some((topic, name.clone()));
                name
            }
        };
        items.push((name, partition).into_pyobject(py)?);
    }
    Ok(Some((w.transactional_id, w.producer_id, w.producer_epoch, PyList::new(py, items)?, w.acks)))
}

/// `read_txn_request(data, start, stop, key, version)`: a life-cycle request (the frame without its length
/// prefix in `data[start:stop]`) as a 4-tuple: (transactional id, producer id, epoch, X) with X the timeout
/// (InitProducerId; its id may be None), the partitions (AddPartitionsToTxn), the group (AddOffsetsToTxn) or
/// committed (EndTxn); None for kio to read (lifecycle.rs).
#[pyfunction]
fn read_txn_request(py: Python<'_>, data: &Bound<'_, PyAny>, start: usize, stop: usize, key: i16, version: i16)
    -> PyResult<Option<Py<PyAny>>> {
    let found = in_place!(data, |b| lifecycle::read_txn_request(b, start, stop, key, version));
    let Some(request) = found else { return Ok(None) };
    let object = match request {
        TxnRequest::InitProducerId { transactional_id, producer_id, producer_epoch, timeout_ms } =>
            (transactional_id, producer_id, producer_epoch, timeout_ms).into_pyobject(py)?,
        TxnRequest::AddPartitions { transactional_id, producer_id, producer_epoch, partitions } =>
            (transactional_id, producer_id, producer_epoch, partitions).into_pyobject(py)?,
        TxnRequest::AddOffsets { transactional_id, producer_id, producer_epoch, group_id } =>
            (transactional_id, producer_id, producer_epoch, group_id).into_pyobject(py)?,
        TxnRequest::EndTxn { transactional_id, producer_id, producer_epoch, committed } =>
            (transactional_id, producer_id, producer_epoch, committed).into_pyobject(py)?,
    };
    Ok(Some(object.into_any().unbind()))
}

/// `observe_request(data, start, stop, key, version, now_ms, connection_id, registry, ledger, hold, absorb)`: a
/// life-cycle request read in place and observed by the native registry and ledger in the same call
/// (py_observe.rs: verification/decisions.py's `observe_request_in_place` from its read on); None for the general
/// path (not readable in place, or held by the EndTxn defence).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn observe_request(py: Python<'_>, data: &Bound<'_, PyAny>, start: usize, stop: usize, key: i16, version: i16,
                   now_ms: i64, connection_id: i64, registry: &Bound<'_, py_registry::RegistryCore>,
                   ledger: Option<&Bound<'_, py_in_doubt::EndTxnLedgerCore>>, hold: bool, absorb: bool)
    -> PyResult<py_observe::Observed> {
    let found = in_place!(data, |b| lifecycle::read_txn_request(b, start, stop, key, version));
    let Some(request) = found else { return Ok(None) };
    py_observe::observe_request(py, request, now_ms, connection_id, registry, ledger, hold, absorb)
}

/// `observe_response(data, start, stop, key, version, request, now_ms, absorbable, registry, ledger)`: a life-cycle
/// answer (from its correlation id in `data[start:stop]`) to `request` (what `observe_request` saw it as) learned
/// from by the native registry and ledger in the same call; False for the general path (py_observe.rs: decisions.py's
/// `observe_response_in_place`). An EndTxn's answer is not read: any answer ends its doubt.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn observe_response(py: Python<'_>, data: &Bound<'_, PyAny>, start: usize, stop: usize, key: i16, version: i16,
                    request: &Bound<'_, PyAny>, now_ms: i64, absorbable: bool,
                    registry: &Bound<'_, py_registry::RegistryCore>,
                    ledger: Option<&Bound<'_, py_in_doubt::EndTxnLedgerCore>>) -> PyResult<bool> {
    let found = in_place!(data, |b| Some(py_observe::observe_response_in(py, b, start, stop, key, version, request,
                                                                       now_ms, absorbable, registry, ledger)));
    found.unwrap_or(Ok(false))
}

/// (error code, producer id, producer epoch, accepted [(topic, partition)], all concurrent)
type Answer = (i16, i64, i16, Vec<(String, i32)>, bool);

/// `read_txn_response(data, start, stop, key, version)`: a life-cycle answer (from its correlation id in
/// `data[start:stop]`), or None for kio to read (lifecycle.rs).
#[pyfunction]
fn read_txn_response(data: &Bound<'_, PyAny>, start: usize, stop: usize, key: i16, version: i16)
    -> PyResult<Option<Answer>> {
    let found = in_place!(data, |b| lifecycle::read_txn_response(b, start, stop, key, version));
    Ok(found.map(|r| (r.error_code, r.producer_id, r.producer_epoch, r.accepted, r.all_concurrent)))
}

/// `read_txn_offset_commit(data, start, stop, version)`: (transactional id, group id, producer id, epoch) of a
/// TxnOffsetCommit v0-4 (the frame without its length prefix in `data[start:stop]`), or None for kio.
#[pyfunction]
fn read_txn_offset_commit(data: &Bound<'_, PyAny>, start: usize, stop: usize, version: i16)
    -> PyResult<Option<(String, String, i64, i16)>> {
    let found = in_place!(data, |b| lifecycle::read_txn_offset_commit(b, start, stop, version));
    Ok(found.map(|c| (c.transactional_id, c.group_id, c.producer_id, c.producer_epoch)))
}

/// `endpoints_absent(data, start, stop, key, version)`: True when a Produce v10-12 / Fetch v16-18 answer (from its
/// correlation id in `data[start:stop]`) was read whole and names no broker (endpoints.rs); False: kio reads it.
#[pyfunction]
fn endpoints_absent(data: &Bound<'_, PyAny>, start: usize, stop: usize, key: i16, version: i16) -> PyResult<bool> {
    let found = in_place!(data, |b| Some(endpoints::endpoints_absent(b, start, stop, key, version)));
    Ok(found.unwrap_or(false))
}

/// (offset, key, value): key and value copied out, None when null.
type Copied = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// `read_batch_records(data, start, stop)`: the records of the one uncompressed, non-control v2 batch in
/// `data[start:stop]` as [(offset, key, value)] (bytes or None), or None when it is not read whole (log_records.rs).
#[pyfunction]
fn read_batch_records<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, start: usize, stop: usize)
    -> PyResult<Option<Bound<'py, PyList>>> {
    let found: Option<Vec<Copied>> = in_place!(data, |b| {
        log_records::read_batch_records(b, start, stop).and_then(|records| {
            records.into_iter().map(|(offset, key, value)| {
                Some((offset, log_records::copied(b, key)?, log_records::copied(b, value)?))
            }).collect::<Option<Vec<Copied>>>()
        })
    });
    let Some(records) = found else { return Ok(None) };
    let items = records.into_iter().map(|(offset, key, value)| {
        (offset, key.map(|k| PyBytes::new(py, &k)), value.map(|v| PyBytes::new(py, &v)))
    });
    Ok(Some(PyList::new(py, items)?))
}

/// TransactionState's names in Apache Kafka, by the status byte the log stores (codecs/transaction_log.py's STATES).
const STATES: [&str; 8] = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
                           "Dead", "PrepareEpochFence"];

/// One decoded record as Python gets it: (offset, applied, transactional id or None, value fields or None).
fn decoded_item<'py>(py: Python<'py>, offset: i64, d: transaction_log::Decoded) -> PyResult<Bound<'py, PyTuple>> {
    let value = match d.value {
        None => py.None(),
        Some(v) => {
            let parts = PyFrozenSet::new(py, v.partitions.iter())?;
            let state = PyString::intern(py, STATES[usize::from(v.status)]);
            (v.producer_id, v.producer_epoch, v.timeout_ms, state, parts, v.last_update_ms, v.start_ms)
                .into_pyobject(py)?.into_any().unbind()
        }
    };
    PyTuple::new(py, [
        offset.into_pyobject(py)?.into_any().unbind(),
        (d.applied as u8).into_pyobject(py)?.into_any().unbind(),
        d.transactional_id.into_pyobject(py)?.into_any().unbind(),
        value,
    ])
}

/// A decoded record set as Python gets it: its records, and what stopped the reading.
type DecodedSet<'py> = (Bound<'py, PyList>, Option<(bool, usize)>);

/// A record set of `__transaction_state` in `b[start..stop]` decoded as the follower's view applies it: the records
/// as Python gets them, and what stopped the reading (None, or (unknown, where) relative to `start`).
fn decoded_set<'py, B: bytes::Bytes + ?Sized>(py: Python<'py>, b: &B, start: usize, stop: usize)
    -> PyResult<DecodedSet<'py>> {
    let (records, failure) = log_records::read_record_set(b, start, stop, transaction_log::decode);
    let items = records.into_iter().map(|(offset, d)| decoded_item(py, offset, d)).collect::<PyResult<Vec<_>>>()?;
    Ok((PyList::new(py, items)?, set_failure(failure, start)))
}

/// What stopped a record set's reading as Python gets it: (unknown, where relative to the set's `start`).
fn set_failure(failure: Option<log_records::SetFailure>, start: usize) -> Option<(bool, usize)> {
    failure.map(|f| match f {
        log_records::SetFailure::Unknown(at) => (true, at - start),
        log_records::SetFailure::Malformed(at) => (false, at - start),
    })
}

/// `read_log_records(data, start, stop)`: a Fetch answer's record set of `__transaction_state` in
/// `data[start:stop]`, every record of its batches decoded as the follower's view applies it, in one call:
/// ([(offset, applied, transactional id or None, (producer id, epoch, timeout, state, frozenset of (topic,
/// partition), last update, start) or None)], failure). `applied` is the index of `Applied` (state, tombstone,
/// unknown, malformed). `failure` is None, or (unknown, where) when a batch stopped the reading: a batch this
/// reader does not know (magic, compression: `unknown` true) or one that does not read whole (false), the
/// records before it kept. A partial batch at the end (Fetch cuts at its byte limit) ends the set
/// (log_records.rs, transaction_log.rs; codecs/transaction_log.py's `read_decoded` says the same in Python).
#[pyfunction]
fn read_log_records<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, start: usize, stop: usize)
    -> PyResult<DecodedSet<'py>> {
    let found = in_place!(data, |b| Some(decoded_set(py, b, start, stop)));
    match found {
        Some(set) => set,
        None => Ok((PyList::empty(py), Some((false, 0)))),
    }
}

/// One partition's read as Python gets it: (each id's last record and every unreadable one, as `read_log_records`
/// gives records; how many of each kind were read; the offset after the last, or None; the ids whose transaction
/// a record ended).
type LogRead<'py> = (Bound<'py, PyList>, (u32, u32, u32, u32), Option<i64>, Vec<String>);

/// One partition of a follower's answer as Python gets it: (partition, error code, high watermark, log start
/// offset, its read or None for null records, failure).
type LogPartition<'py> = (i32, i16, i64, i64, Option<LogRead<'py>>, Option<(bool, usize)>);

/// `read_log_answer(data, start, stop, positions)`: the follower's round in one call: a Fetch v12 answer (from its
/// correlation id in `data[start:stop]`, fetch.rs) with each partition's record set decoded as `read_log_records`
/// does, then reduced to what the view applies from the partition's next offset in `positions` on (0 when not
/// there; transaction_log.rs's `latest`), as (error code, session id, [LogPartition]) over every topic; None for
/// kio to decode (codecs/log_fetch.py's `read_log_answer` says the same in Python).
#[pyfunction]
fn read_log_answer<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, start: usize, stop: usize,
                        positions: &Bound<'py, PyDict>) -> PyResult<Option<(i16, i32, Vec<LogPartition<'py>>)>> {
    let found = in_place!(data, |b| {
        fetch::read_fetch_answer(b, start, stop).map(|a| -> PyResult<_> {
            let mut parts = Vec::new();
            for (_, topic_parts) in a.topics {
                for p in topic_parts {
                    let (read, failure) = match p.records {
                        None => (None, None),
                        Some((s, e)) => {
                            let from = match positions.get_item(p.partition)? {
                                Some(offset) => offset.extract::<i64>()?,
                                None => 0,
                            };
                            let (records, failure) = log_records::read_record_set(b, s, e, transaction_log::decode);
                            let read = transaction_log::latest(records, from);
                            let kept = read.kept.into_iter().map(|(offset, d)| decoded_item(py, offset, d))
                                .collect::<PyResult<Vec<_>>>()?;
                            let [state, tombstone, unknown, malformed] = read.counts;
                            (Some((PyList::new(py, kept)?, (state, tombstone, unknown, malformed), read.next_offset,
                                   read.ended)), set_failure(failure, s))
                        }
                    };
                    parts.push((p.partition, p.error_code, p.high_watermark, p.log_start_offset, read, failure));
                }
            }
            Ok((a.error_code, a.session_id, parts))
        })
    });
    found.transpose()
}

/// `fetch_request(correlation_id, client_id, topic, partitions, max_wait_ms, min_bytes, max_bytes, session_id,
/// session_epoch)`: the follower's Fetch v12 frame, length prefix included (fetch.rs); `partitions` as
/// [(partition, leader epoch, fetch offset, max bytes)].
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn fetch_request<'py>(py: Python<'py>, correlation_id: i32, client_id: &str, topic: &str, partitions: Vec<fetch::Wanted>,
                      max_wait_ms: i32, min_bytes: i32, max_bytes: i32, session_id: i32, session_epoch: i32)
    -> Bound<'py, PyBytes> {
    let frame = fetch::fetch_request(correlation_id, client_id, topic, &partitions, max_wait_ms, min_bytes, max_bytes,
                                     (session_id, session_epoch));
    PyBytes::new(py, &frame)
}

/// `set_known_errors(low, high)`: the error codes kio knows (once, at import: codecs/native.py).
#[pyfunction]
fn set_known_errors(low: i16, high: i16) {
    lifecycle::set_known_errors(low, high);
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan_transactional, m)?)?;
    m.add_function(wrap_pyfunction!(read_txn_request, m)?)?;
    m.add_function(wrap_pyfunction!(read_txn_response, m)?)?;
    m.add_function(wrap_pyfunction!(read_txn_offset_commit, m)?)?;
    m.add_function(wrap_pyfunction!(endpoints_absent, m)?)?;
    m.add_function(wrap_pyfunction!(read_batch_records, m)?)?;
    m.add_function(wrap_pyfunction!(read_log_records, m)?)?;
    m.add_function(wrap_pyfunction!(read_log_answer, m)?)?;
    m.add_function(wrap_pyfunction!(fetch_request, m)?)?;
    m.add_function(wrap_pyfunction!(set_known_errors, m)?)?;
    m.add_function(wrap_pyfunction!(observe_request, m)?)?;
    m.add_function(wrap_pyfunction!(observe_response, m)?)?;
    m.add_function(wrap_pyfunction!(py_observe::observe_setup, m)?)?;
    m.add_class::<py_registry::RegistryCore>()?;
    m.add_class::<traffic::Traffic>()?;
    m.add_class::<book::Book>()?;
    m.add_class::<py_in_doubt::EndTxnLedgerCore>()?;
    m.add_class::<py_in_doubt::SentEndTxn>()?;
    m.add("PanicException", m.py().get_type::<PanicException>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

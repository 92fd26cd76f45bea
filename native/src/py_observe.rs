//! The rules of a life-cycle frame on the relay's fast path, in one native call each: the request or answer read
//! in place (lifecycle.rs), then what verification/decisions.py's `observe_request_in_place` and
//! `observe_response_in_place` do with it, asked of the native registry and EndTxn ledger directly, with no Python
//! call in between. Live, each Python step of those rules cost several microseconds on a cold cache
//! (bench/cpu_split.py); the registry and the ledger were already native, so only the steps between them move here.
//!
//! The rules stay those of decisions.py, step for step (the Python methods are the fallback where the registry or
//! the ledger is the Python one, and the oracle of tests/unit/test_connection_relay.py's equivalence tests, which
//! hold the fast path to the general path over whole conversations): what a request is seen as (the NamedTuples of
//! codecs/lifecycle_scan.py, or the EndTxn's token in the ledger), the EndTxn defence's hold, what the registry
//! learns from each answer, and which answers the general path takes instead.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyTuple};

use crate::bytes::Bytes;
use crate::lifecycle::{self, TxnRequest, TxnResponse};
use crate::py_in_doubt::{EndTxnLedgerCore, SentEndTxn};
use crate::py_registry::RegistryCore;

const INIT_PRODUCER_ID: i16 = 22;
const ADD_PARTITIONS: i16 = 24;
const ADD_OFFSETS: i16 = 25;

/// codecs/lifecycle_scan.py's NamedTuples, and `tuple.__new__` to build one from its fields without its generated
/// `__new__`, as that module does (`observe_setup`, once at its import).
struct Seen {
    init_producer_id: Py<PyAny>,
    add_partitions: Py<PyAny>,
    add_offsets: Py<PyAny>,
    tuple_new: Py<PyAny>,
}

static SEEN: PyOnceLock<Seen> = PyOnceLock::new();

/// `observe_setup(InitProducerIdSeen, AddPartitionsSeen, AddOffsetsSeen, tuple.__new__)`: once; a second call
/// keeps the first.
#[pyfunction]
pub fn observe_setup(py: Python<'_>, init_producer_id: Py<PyAny>, add_partitions: Py<PyAny>, add_offsets: Py<PyAny>,
                     tuple_new: Py<PyAny>) {
    let _ = SEEN.set(py, Seen { init_producer_id, add_partitions, add_offsets, tuple_new });
}

fn seen<'py>(py: Python<'py>, class: impl Fn(&Seen) -> &Py<PyAny>, fields: Bound<'py, PyTuple>)
    -> PyResult<Py<PyAny>> {
    let types = SEEN.get(py).ok_or_else(|| PyRuntimeError::new_err("observe_setup was not called"))?;
    types.tuple_new.call1(py, (class(types).clone_ref(py), fields))
}

/// (what the request is seen as: its NamedTuple, the EndTxn's token, or None; whether the core keeps its bytes to
/// ask again), as `observe_request_in_place` answers; None: the general path (the EndTxn defence holds it).
pub type Observed = Option<(Option<Py<PyAny>>, bool)>;

/// `observe_request_in_place` from the read on: `hold` is whether the EndTxn defence is on (a ledger, enabled),
/// `absorb` whether CONCURRENT_TRANSACTIONS is asked again (verification/concurrent.py).
#[allow(clippy::too_many_arguments)]
pub fn observe_request(py: Python<'_>, request: TxnRequest, now_ms: i64, connection_id: i64,
                       registry: &Bound<'_, RegistryCore>, ledger: Option<&Bound<'_, EndTxnLedgerCore>>, hold: bool,
                       absorb: bool) -> PyResult<Observed> {
    // An EndTxn in doubt could land in the transaction an AddPartitionsToTxn / AddOffsetsToTxn opens: it waits.
    let held = |txn_id: &str, producer_id: i64, epoch: i16| match ledger {
        Some(l) if hold => l.borrow().blocking(py, txn_id, producer_id, epoch, connection_id, now_ms).is_some(),
        _ => false,
    };
    Ok(match request {
        TxnRequest::EndTxn { transactional_id, producer_id, producer_epoch, committed } => {
            registry.borrow_mut().end_txn(py, &transactional_id, producer_id, i64::from(producer_epoch), now_ms)?;
            let token = match ledger {
                // EndTxn takes effect when sent; its answer only ends its doubt.
                Some(l) => Some(l.borrow_mut().sent(py, PyString::new(py, &transactional_id), producer_id,
                                                    producer_epoch, committed, connection_id, now_ms)?.into_any()),
                None => None,
            };
            Some((token, false))
        }
        TxnRequest::AddPartitions { transactional_id, producer_id, producer_epoch, partitions } => {
            if held(&transactional_id, producer_id, producer_epoch) {
                return Ok(None);
            }
            let items = partitions.into_iter().map(|(topic, partition)| (topic, partition).into_pyobject(py))
                .collect::<PyResult<Vec<_>>>()?;
            let fields = (transactional_id, producer_id, producer_epoch, PyTuple::new(py, items)?).into_pyobject(py)?;
            Some((Some(seen(py, |s| &s.add_partitions, fields)?), absorb))
        }
        TxnRequest::AddOffsets { transactional_id, producer_id, producer_epoch, group_id } => {
            if held(&transactional_id, producer_id, producer_epoch) {
                return Ok(None);
            }
            let fields = (transactional_id, producer_id, producer_epoch, group_id).into_pyobject(py)?;
            Some((Some(seen(py, |s| &s.add_offsets, fields)?), absorb))
        }
        TxnRequest::InitProducerId { transactional_id, producer_id, producer_epoch, timeout_ms } => {
            let fields = (transactional_id, producer_id, producer_epoch, timeout_ms).into_pyobject(py)?;
            Some((Some(seen(py, |s| &s.init_producer_id, fields)?), false))
        }
    })
}

/// `observe_response_in_place` for a request seen as one of the NamedTuples (`request`, of the api `key`), once its
/// answer is read (`answer`; None: not readable in place): whether it passes as it is, learned from. False leaves
/// it to the general path: not readable, or refused whole with CONCURRENT_TRANSACTIONS where the core may ask again
/// (`absorbable`).
#[allow(clippy::too_many_arguments)]
pub fn observe_answer(py: Python<'_>, key: i16, request: &Bound<'_, PyAny>, answer: Option<TxnResponse>, now_ms: i64,
                      absorbable: bool, registry: &Bound<'_, RegistryCore>,
                      ledger: Option<&Bound<'_, EndTxnLedgerCore>>) -> PyResult<bool> {
    let Some(answer) = answer else { return Ok(false) };
    if answer.all_concurrent && absorbable {
        return Ok(false);
    }
    let fields = request.cast::<PyTuple>()?;
    let txn_id = fields.get_borrowed_item(0)?;
    // The request's producer, for what AddPartitionsToTxn / AddOffsetsToTxn add (an InitProducerId's comes in its
    // answer).
    let producer = || -> PyResult<(i64, i64)> {
        Ok((fields.get_borrowed_item(1)?.extract()?, fields.get_borrowed_item(2)?.extract()?))
    };
    match key {
        INIT_PRODUCER_ID => {
            // Only a transactional producer's (an id, not empty) answer without error names its producer.
            let txn_id: Option<String> = txn_id.extract()?;
            if let Some(txn_id) = txn_id.filter(|t| answer.error_code == 0 && !t.is_empty()) {
                let timeout_ms: i64 = fields.get_borrowed_item(3)?.extract()?;
                registry.borrow_mut().init_producer_id(py, &txn_id, answer.producer_id,
                                                       i64::from(answer.producer_epoch), timeout_ms, now_ms)?;
                if let Some(l) = ledger {
                    // A new epoch fences every EndTxn of the old one: none of them can land any more.
                    l.borrow_mut().fenced(py, &txn_id, answer.producer_id, answer.producer_epoch)?;
                }
            }
        }
        ADD_PARTITIONS => {
            // What counts as added: the partitions the answer accepted.
            if !answer.accepted.is_empty() {
                let txn_id = txn_id.cast::<PyString>()?;
                let (producer_id, epoch) = producer()?;
                let accepted = answer.accepted.iter().map(|(t, p)| (t.as_str(), *p));
                registry.borrow_mut().added_pairs(py, txn_id.to_str()?, producer_id, epoch, now_ms, accepted, None)?;
            }
        }
        ADD_OFFSETS => {
            if answer.error_code == 0 {
                let txn_id = txn_id.cast::<PyString>()?;
                let group = fields.get_borrowed_item(3)?;
                let group = group.cast::<PyString>()?;
                let (producer_id, epoch) = producer()?;
                registry.borrow_mut().added_pairs(py, txn_id.to_str()?, producer_id, epoch, now_ms, std::iter::empty(),
                                                  Some(group.to_str()?))?;
            }
        }
        _ => return Ok(false), // not a life-cycle request this reads: the general path
    }
    Ok(true)
}

/// An EndTxn's answer, any: the coordinator has processed it, so it can no longer land later (`token`: its entry
/// in the ledger).
pub fn end_txn_answered(py: Python<'_>, token: &Bound<'_, SentEndTxn>, ledger: Option<&Bound<'_, EndTxnLedgerCore>>)
    -> PyResult<()> {
    if let Some(l) = ledger {
        l.borrow_mut().answered(py, token.borrow())?;
    }
    Ok(())
}

/// `observe_response_in_place` of a life-cycle answer in `b[start..stop]` (from its correlation id) to `request`
/// (what `observe_request` saw it as): False for the general path. An EndTxn's answer is not read: any answer ends
/// its doubt. The relay's book (book.rs) and `observe_response` (lib.rs) both answer through this.
#[allow(clippy::too_many_arguments)]
pub fn observe_response_in<B: Bytes + ?Sized>(py: Python<'_>, b: &B, start: usize, stop: usize, key: i16, version: i16,
                                              request: &Bound<'_, PyAny>, now_ms: i64, absorbable: bool,
                                              registry: &Bound<'_, RegistryCore>,
                                              ledger: Option<&Bound<'_, EndTxnLedgerCore>>) -> PyResult<bool> {
    if request.is_none() {
        return Ok(true);
    }
    if let Ok(token) = request.cast::<SentEndTxn>() {
        end_txn_answered(py, token, ledger)?;
        return Ok(true);
    }
    let found = lifecycle::read_txn_response(b, start, stop, key, version);
    observe_answer(py, key, request, found, now_ms, absorbable, registry, ledger)
}

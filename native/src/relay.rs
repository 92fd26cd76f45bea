//! The relay's fast paths (`relay_requests`, `relay_responses`): one call per socket read, one turn of a loop
//! per frame, booked here as the general path (connection/requests.py, responses.py) would book it.
//!
//! A frame that needs no reading is counted and queued here: its in-flight entry (`InFlight`, this module's
//! class, the one the general path uses too), the traffic counters, the queue. Three kinds are read in place
//! by Python helpers that ask the rules (connection/relay.py: a transactional Produce with local evidence, a
//! TxnOffsetCommit with local evidence, the life-cycle requests the registry learns from), and their answers by
//! `rules.observe_response_in_place`. The first frame that does not qualify ends the loop: the general path
//! takes it and the rest of the read. Which frames qualify: connection/relay.py's docstring, the one account
//! of the rules; the equivalence tests hold both paths to the same book-keeping (tests/unit/test_connection_relay.py,
//! test_fast_path_recording.py).
//!
//! A panic here (a bug, never an input's fault: every read is bounds-checked) is caught: the frames booked
//! before it stand, the connection's `_panicked` says why, and the core closes that connection.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use pyo3::sync::PyOnceLock;
use pyo3::panic::PanicException;
use pyo3::types::{PyBytes, PyFloat, PyList, PySet, PyTuple};

use crate::bytes::Bytes;
use crate::endpoints;

/// One request the connection has forwarded and not yet answered, and what it needs to answer it
/// (connection/in_flight.py documents each field; without this module the Python class of the same shape).
#[pyclass(module = "txnguard._native", get_all, set_all)]
pub struct InFlight {
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    action: Py<PyAny>,
    sent_at: f64,
    response: Option<Py<PyAny>>,
    observed: Option<Py<PyAny>>,
    merge: Option<Py<PyAny>>,
    evidence: Option<Py<PyAny>>,
    evidence_at: f64,
    request: Option<Py<PyAny>>,
    retries: i32,
    refused_at: Option<f64>,
}

impl InFlight {
    fn fresh(correlation_id: i32, api_key: i16, api_version: i16, action: Py<PyAny>, sent_at: f64) -> Self {
        InFlight {
            correlation_id, api_key, api_version, action, sent_at, response: None, observed: None, merge: None,
            evidence: None, evidence_at: 0.0, request: None, retries: 0, refused_at: None,
        }
    }
}

#[pymethods]
impl InFlight {
    #[new]
    fn new(correlation_id: i32, api_key: i16, api_version: i16, action: Py<PyAny>, sent_at: f64) -> Self {
        InFlight::fresh(correlation_id, api_key, api_version, action, sent_at)
    }

    /// The objects it holds, for Python's cycle collector: an entry may end up in a cycle through what it
    /// keeps (a decision, the EndTxn in doubt), and a class without this is never collected in one.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.action)?;
        for held in [&self.response, &self.observed, &self.merge, &self.evidence, &self.request] {
            visit.call(held)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        (self.response, self.observed, self.merge, self.evidence, self.request) = (None, None, None, None, None);
    }
}

/// How the request loop treats a key (below `KEYS`; any other key is plain and passes as it is).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    General,      // a rule reads its body or answer: the general path
    OffsetCommit, // TxnOffsetCommit: the Python helper, on local evidence
    LifeCycle,    // InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: the Python helper
}

const KEYS: usize = 128; // counted per key below this (connection/traffic.py's KEYS); the rest in the last slot
const PRODUCE: i16 = 0;
const NO_ADDRESSES: i16 = i16::MAX;

/// What the loops compare with and call, given once by connection/relay.py at import (`relay_setup`).
struct Setup {
    relay: Py<PyAny>,         // Mode.RELAY
    holding: Py<PyAny>,       // Mode.HOLDING
    pass: Py<PyAny>,          // ResponseAction.PASS
    observe: Py<PyAny>,       // ResponseAction.OBSERVE
    rewrite: Py<PyAny>,       // ResponseAction.REWRITE_ADDRESSES
    max_in_flight: Py<PyAny>, // Pause.MAX_IN_FLIGHT
    rtt_buckets: Vec<f64>,
    produce_versions: (i16, i16), // the Produce versions read in place, inclusive
    kinds: [Kind; KEYS],
    addresses_from: [i16; KEYS], // the first version whose answer names brokers
    request_head: Py<PyAny>, // codecs/header.py's RequestHead (a NamedTuple)
    tuple_new: Py<PyAny>,    // tuple.__new__: a NamedTuple from its fields without its generated __new__
    unchecked: Py<PyAny>,    // verification/passed.py's UNCHECKED: a TxnOffsetCommit the policy leaves unchecked
}

static SETUP: PyOnceLock<Setup> = PyOnceLock::new();

fn setup(py: Python<'_>) -> PyResult<&'static Setup> {
    SETUP.get(py).ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("relay_setup was not called"))
}

/// `relay_setup(...)`: what the loops need from Python, once (connection/relay.py at import; a second call
/// keeps the first).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn relay_setup(
    py: Python<'_>, relay: Py<PyAny>, holding: Py<PyAny>, pass: Py<PyAny>, observe: Py<PyAny>, rewrite: Py<PyAny>,
    max_in_flight: Py<PyAny>, rtt_buckets: Vec<f64>, produce_versions: (i16, i16), general: Vec<i16>,
    offset_commit_key: i16, life_cycle_keys: Vec<i16>, addresses_from: Vec<(i16, i16)>, request_head: Py<PyAny>,
    tuple_new: Py<PyAny>, unchecked: Py<PyAny>,
) -> PyResult<()> {
    let mut kinds = [Kind::Plain; KEYS];
    let slot = |key: i16| usize::try_from(key).ok().filter(|&k| k < KEYS);
    for (keys, kind) in [(&general, Kind::General), (&life_cycle_keys, Kind::LifeCycle),
                         (&vec![offset_commit_key], Kind::OffsetCommit)] {
        for &key in keys {
            let k = slot(key).ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("key {key}")))?;
            kinds[k] = kind;
        }
    }
    let mut first = [NO_ADDRESSES; KEYS];
    for (key, version) in addresses_from {
        if let Some(k) = slot(key) {
            first[k] = version;
        }
    }
    let _ = SETUP.set(py, Setup {
        relay, holding, pass, observe, rewrite, max_in_flight, rtt_buckets, produce_versions, kinds,
        addresses_from: first, request_head, tuple_new, unchecked,
    });
    Ok(())
}

fn be_i16<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<i16> {
    Some(i16::from_be_bytes([b.byte(at)?, b.byte(at + 1)?]))
}

fn be_i32<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<i32> {
    Some(i32::from_be_bytes([b.byte(at)?, b.byte(at + 1)?, b.byte(at + 2)?, b.byte(at + 3)?]))
}

/// A Produce (v3+) request's header, read in place from `start` (after the length prefix) to the frame's end at
/// `stop`: (where the transactional id starts, None) for a transactional write, (that place, acks) for any
/// other; None when the general path must read it (a header with tagged fields, a frame too short for its
/// header, transactional id and acks). The v1/v2 request header: api key, version, correlation id, the client
/// id (int16 length, in flexible headers too), then (v2, Produce v9+) tagged fields.
pub fn produce_head<B: Bytes + ?Sized>(b: &B, start: usize, stop: usize, version: i16)
    -> Option<(usize, Option<i16>)> {
    let n = be_i16(b, start + 8)?;
    let mut at = start + 10 + usize::try_from(n).unwrap_or(0);
    if at + 4 > stop {
        return None;
    }
    if version >= 9 {
        if b.byte(at)? != 0 {
            return None; // header tags
        }
        at += 1;
        if b.byte(at)? != 0 {
            return Some((at, None)); // a compact string's length + 1: 0 is null
        }
        return Some((at, Some(be_i16(b, at + 1)?)));
    }
    if be_i16(b, at)? != -1 {
        return Some((at, None));
    }
    Some((at, Some(be_i16(b, at + 2)?)))
}

fn slot_of(key: i16) -> usize {
    usize::try_from(key).ok().filter(|&k| k < KEYS - 1).unwrap_or(KEYS - 1)
}

/// `counts[slot] += by` on a Python list of ints.
fn add(counts: &Bound<'_, PyList>, slot: usize, by: u64) -> PyResult<()> {
    let was: u64 = counts.get_item(slot)?.extract()?;
    counts.set_item(slot, was + by)
}

/// Run `read` over the bytes of `data` (a `bytes` object as a plain slice, any other contiguous buffer as its
/// cells; a non-contiguous one reads as empty: nothing is taken, the general path reads it).
fn with_bytes<R>(data: &Bound<'_, PyAny>, empty: R,
                 read: &mut dyn FnMut(&dyn ReadAny) -> PyResult<R>) -> PyResult<R> {
    if let Ok(bytes) = data.cast::<pyo3::types::PyBytes>() {
        return read(&Slice(bytes.as_bytes()));
    }
    let buffer = pyo3::buffer::PyBuffer::<u8>::get(data)?;
    match buffer.as_slice(data.py()) {
        Some(cells) => read(&Cells(cells)),
        None => Ok(empty),
    }
}

/// The two kinds of bytes behind one object-safe face, so each loop is compiled once.
trait ReadAny {
    fn byte(&self, i: usize) -> Option<u8>;
    fn size(&self) -> usize;
    fn endpoints_absent(&self, start: usize, stop: usize, key: i16, version: i16) -> bool;
    fn copy(&self, start: usize, stop: usize) -> Vec<u8>;
}

struct Slice<'a>(&'a [u8]);
struct Cells<'a>(&'a [pyo3::buffer::ReadOnlyCell<u8>]);

impl ReadAny for Slice<'_> {
    fn byte(&self, i: usize) -> Option<u8> {
        self.0.byte(i)
    }
    fn size(&self) -> usize {
        self.0.len()
    }
    fn endpoints_absent(&self, start: usize, stop: usize, key: i16, version: i16) -> bool {
        endpoints::endpoints_absent(self.0, start, stop, key, version)
    }
    fn copy(&self, start: usize, stop: usize) -> Vec<u8> {
        self.0.get(start..stop).map(<[u8]>::to_vec).unwrap_or_default()
    }
}

impl ReadAny for Cells<'_> {
    fn byte(&self, i: usize) -> Option<u8> {
        self.0.byte(i)
    }
    fn size(&self) -> usize {
        self.0.len()
    }
    fn endpoints_absent(&self, start: usize, stop: usize, key: i16, version: i16) -> bool {
        endpoints::endpoints_absent(self.0, start, stop, key, version)
    }
    fn copy(&self, start: usize, stop: usize) -> Vec<u8> {
        self.0.get(start..stop).map(|cells| cells.iter().map(pyo3::buffer::ReadOnlyCell::get).collect())
            .unwrap_or_default()
    }
}

impl Bytes for dyn ReadAny + '_ {
    fn byte(&self, i: usize) -> Option<u8> {
        ReadAny::byte(self, i)
    }
    fn size(&self) -> usize {
        ReadAny::size(self)
    }
}

/// Run a loop, catching a panic: the frames booked before it stand (`*pos`), and `conn._panicked` says why.
fn guarded(conn: &Bound<'_, PyAny>, what: &str, pos: &mut usize,
           body: impl FnOnce(&mut usize) -> PyResult<()>) -> PyResult<usize> {
    let mut at = *pos;
    let result = catch_unwind(AssertUnwindSafe(|| body(&mut at)));
    match result {
        Ok(done) => {
            done?;
            Ok(at)
        }
        Err(panic) => {
            let said = panic.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            conn.setattr(intern!(conn.py(), "_panicked"), format!("the native {what} panicked: {said}"))?;
            Ok(at)
        }
    }
}

/// `relay_requests(conn, data)`: the fast path for requests: book the whole frames at the start of `data` that
/// need no reading; how many bytes (connection/relay.py's `relay_requests` docstring).
#[pyfunction]
pub fn relay_requests(py: Python<'_>, conn: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
    let s = setup(py)?;
    if !conn.getattr(intern!(py, "mode"))?.is(s.relay.bind(py)) || !conn.getattr(intern!(py, "_fast"))?.is_truthy()?
        || conn.getattr(intern!(py, "client_id"))?.is_none() {
        return Ok(0);
    }
    let requests = conn.getattr(intern!(py, "requests"))?;
    if requests.getattr(intern!(py, "through"))?.is_truthy()? || requests.getattr(intern!(py, "buffered"))?.is_truthy()? {
        return Ok(0);
    }
    let now: f64 = conn.getattr(intern!(py, "clock"))?.call_method0(intern!(py, "perf"))?.extract()?;
    let now_obj = PyFloat::new(py, now);
    conn.setattr(intern!(py, "_now"), &now_obj)?;
    conn.setattr(intern!(py, "last_activity"), &now_obj)?;
    let mut pos = 0usize;
    let done = guarded(conn, "request relay", &mut pos, |pos| {
        with_bytes(data, (), &mut |b| request_loop(py, s, conn, data, &requests, b, now, &mut *pos))
    })?;
    if done == data.len()? {
        conn.setattr(intern!(py, "partial_since"), py.None())?;
    }
    Ok(done)
}

#[allow(clippy::too_many_arguments)]
fn request_loop(py: Python<'_>, s: &Setup, conn: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>,
                requests: &Bound<'_, PyAny>, b: &dyn ReadAny, now: f64, pos: &mut usize) -> PyResult<()> {
    let end = ReadAny::size(b);
    let limit: usize = requests.getattr(intern!(py, "max_frame"))?.extract()?;
    let inventory = conn.getattr(intern!(py, "inventory"))?;
    let traffic = conn.getattr(intern!(py, "traffic"))?;
    let frames_in = traffic.getattr(intern!(py, "frames_in"))?.cast_into::<PyList>()?;
    let bytes_in = traffic.getattr(intern!(py, "bytes_in"))?.cast_into::<PyList>()?;
    let order = conn.getattr(intern!(py, "_order"))?;
    let forwarded = conn.getattr(intern!(py, "_forwarded"))?;
    let max_in_flight: i64 = conn.getattr(intern!(py, "settings"))?.getattr(intern!(py, "max_in_flight"))?.extract()?;
    let mut room = max_in_flight - 1 - i64::try_from(order.len()?).unwrap_or(i64::MAX);
    let (produce_low, produce_high) = s.produce_versions;
    while end - *pos >= 14 {
        let at = *pos;
        let (Some(size), Some(key), Some(version), Some(correlation_id)) =
            (be_i32(b, at), be_i16(b, at + 4), be_i16(b, at + 6), be_i32(b, at + 8)) else { break };
        let Ok(size) = usize::try_from(size) else { break };
        let stop = at + 4 + size;
        if size < 10 || size > limit || stop > end {
            break;
        }
        let entry: Bound<'_, PyAny> = if key == PRODUCE {
            if version < produce_low || version > produce_high {
                break;
            }
            let Some((txn_at, acks)) = produce_head(b, at + 4, stop, version) else { break };
            if acks == Some(0) {
                // acks=0: no response, never in the queue
                if !inventory.is_none() {
                    inventory.getattr(intern!(py, "produce_versions"))?.cast_into::<PySet>()?.add(version)?;
                }
                add(&frames_in, 0, 1)?;
                add(&bytes_in, 0, (4 + size) as u64)?;
                *pos = stop;
                continue;
            }
            if room <= 0 {
                break;
            }
            let action = if version >= s.addresses_from[0] { &s.rewrite } else { &s.pass };
            if acks.is_none() {
                // a transactional write: the rules pass it at once on local evidence, or not here
                let Some(entry) = transactional_produce(py, conn, data, txn_at, stop, version, correlation_id, now,
                                                        action)? else { break };
                entry
            } else {
                if !inventory.is_none() {
                    inventory.getattr(intern!(py, "produce_versions"))?.cast_into::<PySet>()?.add(version)?;
                }
                Py::new(py, InFlight::fresh(correlation_id, key, version, action.clone_ref(py), now))?.into_bound(py)
                    .into_any()
            }
        } else if room <= 0 {
            break;
        } else {
            let kind = usize::try_from(key).ok().filter(|&k| k < KEYS).map_or(Kind::Plain, |k| s.kinds[k]);
            match kind {
                Kind::Plain => {
                    let first = usize::try_from(key).ok().filter(|&k| k < KEYS).map_or(NO_ADDRESSES, |k| s.addresses_from[k]);
                    let action = if version >= first { &s.rewrite } else { &s.pass };
                    Py::new(py, InFlight::fresh(correlation_id, key, version, action.clone_ref(py), now))?
                        .into_bound(py).into_any()
                }
                Kind::General => break,
                Kind::OffsetCommit => {
                    let Some(entry) = offset_commit(py, s, conn, data, at, stop, key, version, correlation_id, now)?
                        else { break };
                    entry
                }
                Kind::LifeCycle => {
                    let Some(entry) = life_cycle(py, s, conn, data, b, at, stop, key, version, correlation_id, now)?
                        else { break };
                    entry
                }
            }
        };
        room -= 1;
        let slot = slot_of(key);
        add(&frames_in, slot, 1)?;
        add(&bytes_in, slot, (4 + size) as u64)?;
        order.call_method1(intern!(py, "append"), (&entry,))?;
        forwarded.call_method1(intern!(py, "append"), (&entry,))?;
        *pos = stop;
    }
    Ok(())
}

/// A transactional Produce (its transactional id at `txn_at`) the rules pass at once on local evidence
/// (`pass_produce_locally`: what its `Decided` would have recorded goes to the ledger); its in-flight entry.
/// None: the general path (no local evidence for every partition, a shape the in-place reader does not read,
/// or the reader panicked: `_panicked` says so and the core closes the connection).
#[allow(clippy::too_many_arguments)]
fn transactional_produce<'py>(py: Python<'py>, conn: &Bound<'py, PyAny>, data: &Bound<'py, PyAny>, txn_at: usize,
                              stop: usize, version: i16, correlation_id: i32, now: f64, action: &Py<PyAny>)
    -> PyResult<Option<Bound<'py, PyAny>>> {
    let asked = conn.getattr(intern!(py, "rules"))?.call_method1(intern!(py, "pass_produce_locally"), (
        data, txn_at, stop, version, conn.call_method0(intern!(py, "client_info"))?, conn.getattr(intern!(py, "clock"))?))
    ;
    let passed = match asked {
        Ok(passed) => passed,
        Err(e) if e.is_instance_of::<PanicException>(py) => {
            // a bug in the native reader, never the input's fault
            conn.setattr(intern!(py, "_panicked"), format!("the native Produce reader panicked: {}", e.value(py)))?;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if passed.is_none() {
        return Ok(None);
    }
    conn.getattr(intern!(py, "ledger"))?.getattr(intern!(py, "passed"))?.call_method1(intern!(py, "append"), (&passed,))?;
    let inventory = conn.getattr(intern!(py, "inventory"))?;
    if !inventory.is_none() {
        inventory.call_method1(intern!(py, "transactional_write"),
                               (version, passed.getattr(intern!(py, "transactional_id"))?))?;
    }
    let mut entry = InFlight::fresh(correlation_id, PRODUCE, version, action.clone_ref(py), now);
    checked(py, &mut entry, &passed)?;
    Ok(Some(Py::new(py, entry)?.into_bound(py).into_any()))
}

/// A checked write's entry closes its check-to-append window when answered: the evidence it passed on (the
/// member's own `_value_`: `.value` is a Python call) and when it was decided.
fn checked(py: Python<'_>, entry: &mut InFlight, passed: &Bound<'_, PyAny>) -> PyResult<()> {
    let evidence = passed.getattr(intern!(py, "verdict"))?.getattr(intern!(py, "evidence"))?.getattr(intern!(py, "_value_"))?;
    entry.evidence = Some(evidence.unbind());
    entry.evidence_at = passed.getattr(intern!(py, "decided_at"))?.extract()?;
    Ok(())
}

/// A TxnOffsetCommit (the frame at `at..stop`, length prefix included) the rules pass at once on local evidence
/// (`pass_offset_commit_locally`: what its `Decided` would have recorded goes to the ledger, in its place among
/// the writes), or that the policy leaves unchecked (forwarded as it is, as the general path does); its in-flight
/// entry. None: the general path (no evidence, a verdict that fails, the offsets partition count not known yet,
/// a shape the in-place reader does not read).
#[allow(clippy::too_many_arguments)]
fn offset_commit<'py>(py: Python<'py>, s: &Setup, conn: &Bound<'py, PyAny>, data: &Bound<'py, PyAny>, at: usize,
                      stop: usize, key: i16, version: i16, correlation_id: i32, now: f64)
    -> PyResult<Option<Bound<'py, PyAny>>> {
    let head = s.tuple_new.bind(py).call1((s.request_head.bind(py), (key, version, correlation_id)))?;
    let ledger = conn.getattr(intern!(py, "ledger"))?;
    let before = ledger.getattr(intern!(py, "passed"))?.len()?;
    let passed = conn.getattr(intern!(py, "rules"))?.call_method1(intern!(py, "pass_offset_commit_locally"), (
        data, &head, at + 4, stop, conn.call_method0(intern!(py, "client_info"))?, conn.getattr(intern!(py, "clock"))?,
        before))?;
    if passed.is_none() {
        return Ok(None);
    }
    let mut entry = InFlight::fresh(correlation_id, key, version, s.pass.clone_ref(py), now);
    if !passed.is(s.unchecked.bind(py)) {
        ledger.getattr(intern!(py, "offsets"))?.call_method1(intern!(py, "append"), (&passed,))?;
        checked(py, &mut entry, &passed)?;
    }
    let inventory = conn.getattr(intern!(py, "inventory"))?;
    if !inventory.is_none() {
        inventory.call_method1(intern!(py, "request"), (&head, data, at + 4, stop))?;
    }
    Ok(Some(Py::new(py, entry)?.into_bound(py).into_any()))
}

/// A life-cycle request (the frame at `at..stop`) read in place and observed as the general path would (what its
/// answer teaches the registry, the EndTxn in doubt); its in-flight entry. None: what the rules leave to the
/// general path (`observe_request_in_place`: the coordinator-timeout check, the EndTxn defence's hold, a shape
/// the in-place reader does not read).
#[allow(clippy::too_many_arguments)]
fn life_cycle<'py>(py: Python<'py>, s: &Setup, conn: &Bound<'py, PyAny>, data: &Bound<'py, PyAny>, b: &dyn ReadAny,
                   at: usize, stop: usize, key: i16, version: i16, correlation_id: i32, now: f64)
    -> PyResult<Option<Bound<'py, PyAny>>> {
    let head = s.tuple_new.bind(py).call1((s.request_head.bind(py), (key, version, correlation_id)))?;
    let connection_id = conn.getattr(intern!(py, "settings"))?.getattr(intern!(py, "connection_id"))?;
    let seen = conn.getattr(intern!(py, "rules"))?.call_method1(intern!(py, "observe_request_in_place"), (
        &head, data, at + 4, stop, conn.getattr(intern!(py, "clock"))?, connection_id))?;
    if seen.is_none() {
        return Ok(None);
    }
    let inventory = conn.getattr(intern!(py, "inventory"))?;
    if !inventory.is_none() {
        inventory.call_method1(intern!(py, "request"), (&head, data, at + 4, stop))?;
    }
    let (observed, keep): (Py<PyAny>, bool) = seen.extract()?;
    let mut entry = InFlight::fresh(correlation_id, key, version, s.observe.clone_ref(py), now);
    entry.observed = Some(observed);
    if keep {
        // a few hundred bytes, kept to ask again after CONCURRENT_TRANSACTIONS
        entry.request = Some(PyBytes::new(py, &b.copy(at, stop)).into_any().unbind());
    }
    Ok(Some(Py::new(py, entry)?.into_bound(py).into_any()))
}

/// `relay_responses(conn, data)`: the fast path for responses: the whole frames at the start of `data` that
/// pass untouched; how many bytes (connection/relay.py's `relay_responses` docstring).
#[pyfunction]
pub fn relay_responses(py: Python<'_>, conn: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
    let s = setup(py)?;
    let mode = conn.getattr(intern!(py, "mode"))?;
    if !(mode.is(s.relay.bind(py)) || mode.is(s.holding.bind(py))) || !conn.getattr(intern!(py, "_fast"))?.is_truthy()?
        || !conn.getattr(intern!(py, "responses"))?.getattr(intern!(py, "idle"))?.is_truthy()? {
        return Ok(0);
    }
    let paused = conn.getattr(intern!(py, "_paused"))?;
    if paused.len()? > 0 && paused.contains(s.max_in_flight.bind(py))? {
        return Ok(0);
    }
    let now: f64 = conn.getattr(intern!(py, "clock"))?.call_method0(intern!(py, "perf"))?.extract()?;
    let now_obj = PyFloat::new(py, now);
    conn.setattr(intern!(py, "_now"), &now_obj)?;
    conn.setattr(intern!(py, "last_activity"), &now_obj)?;
    let mut pos = 0usize;
    guarded(conn, "response relay", &mut pos, |pos| {
        with_bytes(data, (), &mut |b| response_loop(py, s, conn, data, b, now, &mut *pos))
    })
}

/// What the response loop reads of an entry, copied out so that no borrow is held across a call into Python.
struct Answering {
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    action: Py<PyAny>,
    sent_at: f64,
    observed: Option<Py<PyAny>>,
    evidence: Option<Py<PyAny>>,
    evidence_at: f64,
    kept: bool, // the request is kept to ask again after CONCURRENT_TRANSACTIONS
    retries: i32,
}

fn response_loop(py: Python<'_>, s: &Setup, conn: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>, b: &dyn ReadAny,
                 now: f64, pos: &mut usize) -> PyResult<()> {
    let end = ReadAny::size(b);
    let order = conn.getattr(intern!(py, "_order"))?;
    let forwarded = conn.getattr(intern!(py, "_forwarded"))?;
    let traffic = conn.getattr(intern!(py, "traffic"))?;
    let frames_out = traffic.getattr(intern!(py, "frames_out"))?.cast_into::<PyList>()?;
    let bytes_out = traffic.getattr(intern!(py, "bytes_out"))?.cast_into::<PyList>()?;
    let rtt_buckets = traffic.getattr(intern!(py, "rtt_buckets"))?.cast_into::<PyList>()?;
    let rtt_sum = traffic.getattr(intern!(py, "rtt_sum"))?.cast_into::<PyList>()?;
    while end - *pos >= 8 && forwarded.len()? > 0 {
        let at = *pos;
        let (Some(size), Some(correlation_id)) = (be_i32(b, at), be_i32(b, at + 4)) else { break };
        let Ok(size) = usize::try_from(size) else { break };
        let stop = at + 4 + size;
        let head = forwarded.get_item(0)?;
        let Ok(entry) = head.cast::<InFlight>() else { break };
        let e = {
            let e = entry.borrow();
            Answering {
                correlation_id: e.correlation_id, api_key: e.api_key, api_version: e.api_version,
                action: e.action.clone_ref(py), sent_at: e.sent_at, observed: e.observed.as_ref().map(|o| o.clone_ref(py)),
                evidence: e.evidence.as_ref().map(|v| v.clone_ref(py)), evidence_at: e.evidence_at,
                kept: e.request.is_some(), retries: e.retries,
            }
        };
        if size < 4 || stop > end || e.correlation_id != correlation_id || !order.get_item(0)?.is(&head) {
            break;
        }
        if order.len()? > 1 {
            // a local answer ready behind it goes with the general path
            let next = order.get_item(1)?;
            let ready = match next.cast::<InFlight>() {
                Ok(n) => n.borrow().response.is_some(),
                Err(_) => true,
            };
            if ready {
                break;
            }
        }
        let action = e.action.bind(py);
        if !action.is(s.pass.bind(py)) {
            if action.is(s.rewrite.bind(py)) {
                // A Produce or Fetch answer that names no broker has nothing to rewrite: it passes as it is.
                if !b.endpoints_absent(at + 4, stop, e.api_key, e.api_version) {
                    break;
                }
            } else if !action.is(s.observe.bind(py)) || e.retries != 0 {
                break;
            } else {
                // A life-cycle answer the registry learns from, read in place, passes as it is; one being asked
                // again (CONCURRENT_TRANSACTIONS absorbed) or not readable in place: the general path.
                let wall_ms = conn.getattr(intern!(py, "clock"))?.call_method0(intern!(py, "wall_ms"))?;
                let observed = e.observed.as_ref().map_or_else(|| py.None(), |o| o.clone_ref(py));
                let learned = conn.getattr(intern!(py, "rules"))?.call_method1(
                    intern!(py, "observe_response_in_place"),
                    (e.api_key, e.api_version, observed, data, at + 4, stop, wall_ms, e.kept))?;
                if !learned.is_truthy()? {
                    break;
                }
            }
        }
        forwarded.call_method0(intern!(py, "popleft"))?;
        order.call_method0(intern!(py, "popleft"))?;
        if let Some(evidence) = e.evidence {
            let window = PyTuple::new(py, [evidence.into_bound(py),
                                           PyFloat::new(py, (now - e.evidence_at) * 1000.0).into_any()])?;
            conn.getattr(intern!(py, "ledger"))?.getattr(intern!(py, "windows"))?
                .call_method1(intern!(py, "append"), (window,))?;
        }
        let slot = slot_of(e.api_key);
        add(&frames_out, slot, 1)?;
        add(&bytes_out, slot, (4 + size) as u64)?;
        let seconds = now - e.sent_at;
        let mut buckets = rtt_buckets.get_item(slot)?;
        if buckets.is_none() {
            buckets = PyList::new(py, vec![0u64; s.rtt_buckets.len() + 1])?.into_any();
            rtt_buckets.set_item(slot, &buckets)?;
        }
        // bisect_left: the first bound not below the value
        let bucket = s.rtt_buckets.partition_point(|&bound| bound < seconds);
        add(buckets.cast::<PyList>()?, bucket, 1)?;
        let sum: f64 = rtt_sum.get_item(slot)?.extract()?;
        rtt_sum.set_item(slot, sum + seconds)?;
        *pos = stop;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request header v1 (`flexible`: v2, with an empty tag section) of client id "c", then `body`.
    fn frame(version: i16, flexible: bool, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 0, 0, 0]; // the length prefix (unread here)
        f.extend_from_slice(&PRODUCE.to_be_bytes());
        f.extend_from_slice(&version.to_be_bytes());
        f.extend_from_slice(&7i32.to_be_bytes());
        f.extend_from_slice(&1i16.to_be_bytes());
        f.push(b'c');
        if flexible {
            f.push(0);
        }
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn a_v9_transactional_write_is_told_by_its_non_null_compact_id() {
        let f = frame(9, true, &[2, b't', 0xff, 0xff, 0, 0, 0x75, 0x30]);
        assert_eq!(produce_head(&f[..], 4, f.len(), 9), Some((16, None))); // after the header's tag byte
    }

    #[test]
    fn a_v9_write_without_a_transactional_id_gives_its_acks() {
        let f = frame(9, true, &[0, 0, 1, 0, 0, 0x75, 0x30]);
        assert_eq!(produce_head(&f[..], 4, f.len(), 9), Some((16, Some(1))));
    }

    #[test]
    fn a_v3_write_with_a_null_id_gives_its_acks_and_a_named_one_is_transactional() {
        let plain = frame(3, false, &[0xff, 0xff, 0, 0, 0, 0, 0x75, 0x30]);
        assert_eq!(produce_head(&plain[..], 4, plain.len(), 3), Some((15, Some(0))));
        let named = frame(3, false, &[0, 1, b't', 0xff, 0xff, 0, 0, 0x75, 0x30]);
        assert_eq!(produce_head(&named[..], 4, named.len(), 3), Some((15, None)));
    }

    #[test]
    fn header_tags_and_short_frames_go_to_the_general_path() {
        let tagged = frame(9, false, &[1, 0, 0, 0, 0xff, 0xff, 0, 0]);
        assert_eq!(produce_head(&tagged[..], 4, tagged.len(), 9), None);
        let short = frame(3, false, &[0xff, 0xff]);
        assert_eq!(produce_head(&short[..], 4, short.len(), 3), None);
        for cut in 0..short.len() {
            assert_eq!(produce_head(&short[..cut], 4, cut, 3), None); // never a read past the end
        }
    }
}

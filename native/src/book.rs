//! The relay's book: the requests the fast path forwarded and not yet answered, held in native memory, and the
//! response fast path over them in one native call per socket read.
//!
//! Live, a Python loop per read cost what it touched: the connection, its queues, each in-flight entry, the
//! counters' lists, each a cache miss on a core the JVMs share (bench/cold_cache.py, bench/cpu_split.py). Here
//! the loop touches the read's bytes, the book and the traffic arrays (traffic.rs); a life-cycle answer is learned
//! from by the native registry and EndTxn ledger with no Python step in between (py_observe.rs).
//!
//! One queue, two homes. The connection's Python queues (`_order`, `_forwarded`, connection/base.py) hold what
//! the general path booked; the book holds what the fast path booked after them, every entry of it forwarded to
//! the broker. So the order of the whole queue is the Python queue, then the book. Before the general path reads
//! or adds to its queue, the connection moves the book's entries onto it (`spill`, as `InFlight` objects): the
//! response fast path runs only while the Python queue is empty, so the head of the book is the head of the
//! whole queue. Which responses qualify: connection/relay.py's `relay_responses`, the one account of the rules.
//!
//! A panic here (a bug, never an input's fault: every read is bounds-checked) is caught: the responses booked
//! before it stand, the connection's `_panicked` says why, and the core closes that connection.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::buffer::PyBuffer;
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::bytes::Bytes;
use crate::endpoints;
use crate::py_in_doubt::EndTxnLedgerCore;
use crate::py_observe;
use crate::py_registry::RegistryCore;
use crate::traffic::{slot_of, Traffic};

/// What happens to an entry's response (connection/apis.py's ResponseAction, the three the fast path books).
pub const PASS: u8 = 0;
pub const OBSERVE: u8 = 1;
pub const REWRITE_ADDRESSES: u8 = 2;

/// One request forwarded by the fast path (connection/in_flight.py's `InFlight` documents each field; the rest of
/// its fields are the general path's and start empty there).
struct Entry {
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    action: u8,
    sent_at: f64,
    evidence: Option<Py<PyAny>>, // a verified write's evidence (a str), its window opened at evidence_at
    evidence_at: f64,
    observed: Option<Py<PyAny>>, // a life-cycle request as read, or its EndTxn's token
    request: Option<Py<PyAny>>,  // its bytes, kept to ask again after CONCURRENT_TRANSACTIONS
}

/// An entry as `spill` gives it to Python: (correlation id, api key, version, action, sent at, evidence, evidence
/// at, observed, request).
type Spilled = (i32, i16, i16, u8, f64, Option<Py<PyAny>>, f64, Option<Py<PyAny>>, Option<Py<PyAny>>);

#[pyclass(module = "txnguard._native")]
pub struct Book {
    entries: VecDeque<Entry>,
    traffic: Py<Traffic>,
}

#[pymethods]
impl Book {
    #[new]
    fn new(traffic: Py<Traffic>) -> Self {
        Book { entries: VecDeque::new(), traffic }
    }

    /// Book a request the fast path forwarded, after every entry booked before it.
    #[pyo3(signature = (correlation_id, api_key, api_version, action, sent_at, evidence=None, evidence_at=0.0,
                        observed=None, request=None))]
    #[allow(clippy::too_many_arguments)]
    fn push(&mut self, correlation_id: i32, api_key: i16, api_version: i16, action: u8, sent_at: f64,
            evidence: Option<Py<PyAny>>, evidence_at: f64, observed: Option<Py<PyAny>>, request: Option<Py<PyAny>>) {
        self.entries.push_back(Entry {
            correlation_id, api_key, api_version, action, sent_at, evidence, evidence_at, observed, request,
        });
    }

    fn __len__(&self) -> usize {
        self.entries.len()
    }

    /// Every entry, oldest first, taken out of the book (the general path queues them as `InFlight` objects).
    fn spill(&mut self) -> Vec<Spilled> {
        self.entries.drain(..).map(|e| (e.correlation_id, e.api_key, e.api_version, e.action, e.sent_at, e.evidence,
                                        e.evidence_at, e.observed, e.request)).collect()
    }

    /// The response fast path over a read of the broker (`data`, at `now` on the clock's perf time) for the
    /// connection `conn`: the whole responses at its start that answer the book's entries and pass as they are;
    /// how many bytes. Counted, their windows closed in `conn.ledger`, their entries gone; a life-cycle answer is
    /// learned from as `conn.rules` says, at `conn.clock`'s wall time (each read from `conn` when needed: the
    /// shell gives a connection its ledger after making it, tests their clock). A panic sets `conn._panicked`
    /// (the connection closes) and answers what was booked before it; so does a PanicException raised through
    /// Python.
    fn responses(&mut self, py: Python<'_>, conn: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>, now: f64)
        -> PyResult<usize> {
        let mut pos = 0;
        let result = catch_unwind(AssertUnwindSafe(|| -> PyResult<()> {
            if let Ok(bytes) = data.cast::<PyBytes>() {
                return self.pass(py, conn, bytes.as_bytes(), data, now, &mut pos);
            }
            let buffer = PyBuffer::<u8>::get(data)?;
            match buffer.as_slice(py) {
                Some(cells) => self.pass(py, conn, cells, data, now, &mut pos),
                None => Ok(()), // not contiguous: the general path reads it
            }
        }));
        let what = match result {
            Ok(Ok(())) => return Ok(pos),
            // A panic of native code called through Python (the rules' fallback), raised as PanicException.
            Ok(Err(e)) if e.is_instance_of::<PanicException>(py) => e.value(py).to_string(),
            Ok(Err(e)) => return Err(e),
            Err(panic) => panic.downcast_ref::<&str>().map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default(),
        };
        conn.setattr(intern!(py, "_panicked"), format!("native code panicked on a response: {what}"))?;
        Ok(pos)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.traffic)?;
        for e in &self.entries {
            for held in [&e.evidence, &e.observed, &e.request].into_iter().flatten() {
                visit.call(held)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.entries.clear();
    }
}

fn be_i32<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<i32> {
    Some(i32::from_be_bytes([b.byte(at)?, b.byte(at + 1)?, b.byte(at + 2)?, b.byte(at + 3)?]))
}

impl Book {
    /// The loop of `responses`: one response per turn; `pos` is where the booked ones end.
    fn pass<B: Bytes + ?Sized>(&mut self, py: Python<'_>, conn: &Bound<'_, PyAny>, b: &B, data: &Bound<'_, PyAny>,
                               now: f64, pos: &mut usize) -> PyResult<()> {
        let end = b.size();
        let traffic = self.traffic.bind(py).clone();
        let mut windows: Option<Bound<'_, PyList>> = None;
        while end - *pos >= 8 {
            let Some(entry) = self.entries.front() else { break };
            let (Some(size), Some(correlation_id)) = (be_i32(b, *pos), be_i32(b, *pos + 4)) else { break };
            let Ok(size) = usize::try_from(size) else { break };
            let stop = *pos + 4 + size;
            if size < 4 || stop > end || correlation_id != entry.correlation_id {
                break;
            }
            let passes = match entry.action {
                PASS => true,
                // A Produce or Fetch answer that names no broker has nothing to rewrite: it passes as it is.
                REWRITE_ADDRESSES => endpoints::endpoints_absent(b, *pos + 4, stop, entry.api_key, entry.api_version),
                // A life-cycle answer the registry learns from, read in place, passes as it is.
                _ => learned(py, conn, b, data, *pos + 4, stop, entry)?,
            };
            if !passes {
                break;
            }
            let Some(entry) = self.entries.pop_front() else { break };
            if let Some(evidence) = entry.evidence {
                if windows.is_none() {
                    let ledger = conn.getattr(intern!(py, "ledger"))?;
                    windows = Some(ledger.getattr(intern!(py, "windows"))?.cast_into::<PyList>()?);
                }
                if let Some(w) = &windows {
                    w.append(PyTuple::new(py, [evidence.into_any(),
                                               ((now - entry.evidence_at) * 1000.0).into_pyobject(py)?.into_any()
                                                   .unbind()])?)?;
                }
            }
            traffic.borrow_mut().count_out_slot(slot_of(i64::from(entry.api_key)), (4 + size) as u64,
                                                now - entry.sent_at);
            *pos = stop;
        }
        Ok(())
    }
}

/// Whether a life-cycle answer in `b[start..stop]` was learned from in place (connection/rules.py's
/// `observe_response_in_place`). Where the rules' registry and EndTxn ledger are the native ones (as
/// verification/decisions.py's `_native_state` asks), in one native call with them; otherwise through the rules.
fn learned<B: Bytes + ?Sized>(py: Python<'_>, conn: &Bound<'_, PyAny>, b: &B, data: &Bound<'_, PyAny>, start: usize,
                              stop: usize, entry: &Entry) -> PyResult<bool> {
    let now_ms: i64 = conn.getattr(intern!(py, "clock"))?.call_method0(intern!(py, "wall_ms"))?.extract()?;
    let absorbable = entry.request.is_some();
    let none = py.None();
    let request = entry.observed.as_ref().unwrap_or(&none).bind(py);
    let rules = conn.getattr(intern!(py, "rules"))?;
    if let (Ok(registry), Ok(in_doubt)) = (rules.getattr(intern!(py, "registry")),
                                           rules.getattr(intern!(py, "in_doubt"))) {
        if let Ok(registry) = registry.cast::<RegistryCore>() {
            let ledger = if in_doubt.is_none() { Some(None) } else {
                in_doubt.cast::<EndTxnLedgerCore>().ok().map(Some)
            };
            if let Some(ledger) = ledger {
                return py_observe::observe_response_in(py, b, start, stop, entry.api_key, entry.api_version,
                                                       request, now_ms, absorbable, registry, ledger);
            }
        }
    }
    rules.call_method1(intern!(py, "observe_response_in_place"),
                       (entry.api_key, entry.api_version, request, data, start, stop, now_ms, absorbable))?
        .extract()
}

//! `EndTxnLedgerCore` and `SentEndTxn`: the native EndTxn ledger (in_doubt.rs) as Python sees it, with
//! verification/in_doubt.py's `PythonEndTxnLedger` methods and arguments. verification/in_doubt.py's
//! `NativeEndTxnLedger` subclasses it (its limits, the endings by `Ending`). Each forwarded EndTxn is one
//! `SentEndTxn` object, the token its connection keeps until the answer: the ledger hands back the same object
//! from `blocking`, `in_doubt` and `expire`.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::in_doubt::{Ended, Ledger};

/// One forwarded EndTxn (verification/in_doubt.py's `PythonSentEndTxn`, field for field).
#[pyclass(module = "txnguard._native")]
pub struct SentEndTxn {
    #[pyo3(get)]
    transactional_id: Py<PyString>,
    #[pyo3(get)]
    producer_id: i64,
    #[pyo3(get)]
    producer_epoch: i16,
    #[pyo3(get)]
    committed: bool,
    #[pyo3(get)]
    connection_id: i64,
    #[pyo3(get)]
    sent_ms: i64,
    #[pyo3(get)]
    orphaned_ms: Option<i64>,
    #[pyo3(get)]
    sent_mark: u64,
    #[pyo3(get)]
    orphaned_mark: Option<u64>,
    token: u64,
}

#[pymethods]
impl SentEndTxn {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!("SentEndTxn({:?}, {}, {}, committed={}, connection_id={}, sent_ms={}, orphaned_ms={:?})",
                self.transactional_id.bind(py).to_string(), self.producer_id, self.producer_epoch, self.committed,
                self.connection_id, self.sent_ms, self.orphaned_ms)
    }
}

#[pyclass(subclass, module = "txnguard._native")]
pub struct EndTxnLedgerCore {
    inner: Ledger,
    /// The open EndTxns' objects by token.
    tokens: HashMap<u64, Py<SentEndTxn>>,
    /// Told (transactional id, how) each time an EndTxn is no longer in doubt (the shell wakes its holds). Called
    /// while the ledger is busy: it must not call the ledger back (PyO3 would refuse it: "already borrowed").
    #[pyo3(get, set)]
    on_change: Option<Py<PyAny>>,
    /// verification/in_doubt.py's `Ending` members, by in_doubt.rs's `Ending`.
    endings: [Py<PyAny>; 4],
}

impl EndTxnLedgerCore {
    /// Forget what ended and tell `on_change`, in order (each EndTxn's own id object: no string built per call).
    fn tell(&mut self, py: Python<'_>, ended: Ended) -> PyResult<usize> {
        let n = ended.len();
        for (_, token, how) in ended {
            let Some(s) = self.tokens.remove(&token) else { continue };
            if let Some(on_change) = &self.on_change {
                let txn_id = s.borrow(py).transactional_id.clone_ref(py);
                on_change.call1(py, (txn_id, self.endings[how as usize].clone_ref(py)))?;
            }
        }
        Ok(n)
    }

    fn objects(&self, py: Python<'_>, tokens: Vec<u64>) -> Vec<Py<SentEndTxn>> {
        tokens.into_iter().filter_map(|t| self.tokens.get(&t).map(|s| s.clone_ref(py))).collect()
    }
}

#[pymethods]
impl EndTxnLedgerCore {
    #[new]
    fn new(max_ms: i64, on_change: Option<Py<PyAny>>, endings: [Py<PyAny>; 4]) -> Self {
        EndTxnLedgerCore { inner: Ledger::new(max_ms), tokens: HashMap::new(), on_change, endings }
    }

    fn mark(&mut self) -> u64 {
        self.inner.mark()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn ending_counts(&self) -> [u64; 4] {
        self.inner.endings
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sent(&mut self, py: Python<'_>, txn_id: Bound<'_, PyString>, producer_id: i64, epoch: i16,
                       committed: bool, connection_id: i64, now_ms: i64) -> PyResult<Py<SentEndTxn>> {
        let (token, sent_mark) = self.inner.sent(txn_id.to_str()?, producer_id, epoch, connection_id, now_ms);
        let s = Py::new(py, SentEndTxn { transactional_id: txn_id.unbind(), producer_id, producer_epoch: epoch,
                                         committed, connection_id, sent_ms: now_ms, orphaned_ms: None, sent_mark,
                                         orphaned_mark: None, token })?;
        self.tokens.insert(token, s.clone_ref(py));
        Ok(s)
    }

    pub(crate) fn answered(&mut self, py: Python<'_>, s: PyRef<'_, SentEndTxn>) -> PyResult<()> {
        let name = s.transactional_id.bind(py);
        let ended = self.inner.answered(name.to_str()?, s.token, s.producer_id, s.producer_epoch, s.sent_mark);
        self.tell(py, ended).map(|_| ())
    }

    fn orphaned(&mut self, py: Python<'_>, mut s: PyRefMut<'_, SentEndTxn>, now_ms: i64) -> PyResult<()> {
        if s.orphaned_ms.is_none() {
            let mark = self.inner.mark();
            s.orphaned_ms = Some(now_ms);
            s.orphaned_mark = Some(mark);
            let name = s.transactional_id.clone_ref(py);
            self.inner.orphaned(name.bind(py).to_str()?, s.token, now_ms, mark);
        }
        Ok(())
    }

    fn answered_after(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i16, mark: u64)
        -> PyResult<usize> {
        let ended = self.inner.answered_after(txn_id, producer_id, epoch, mark);
        self.tell(py, ended)
    }

    pub(crate) fn fenced(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i16) -> PyResult<usize> {
        let ended = self.inner.fenced(txn_id, producer_id, epoch);
        self.tell(py, ended)
    }

    pub(crate) fn blocking(&self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i16, connection_id: i64,
                           now_ms: i64)
        -> Option<Py<SentEndTxn>> {
        let token = self.inner.blocking(txn_id, producer_id, epoch, connection_id, now_ms)?;
        self.tokens.get(&token).map(|s| s.clone_ref(py))
    }

    fn in_doubt(&self, py: Python<'_>, txn_id: &str) -> Vec<Py<SentEndTxn>> {
        self.objects(py, self.inner.in_doubt(txn_id))
    }

    fn expire(&mut self, py: Python<'_>, now_ms: i64) -> PyResult<Vec<Py<SentEndTxn>>> {
        let ended = self.inner.expire(now_ms);
        let gone = ended.iter().filter_map(|(_, t, _)| self.tokens.get(t).map(|s| s.clone_ref(py))).collect();
        self.tell(py, ended)?;
        Ok(gone)
    }
}

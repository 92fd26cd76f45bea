//! `RegistryCore`: the native registry (registry.rs) as Python sees it, with verification/registry.py's
//! `Registry` methods and arguments. verification/registry.py's `NativeRegistry` subclasses it (its limits, the
//! record snapshot); the verdicts and candidates it answers are the Python objects that module hands in.

use std::collections::HashSet;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PySet, PyString, PyTuple};

use crate::registry::{Limits, Local, Partitions, Registry};

#[pyclass(subclass, module = "txnguard._native")]
pub struct RegistryCore {
    inner: Registry,
    /// verification/bypass.py's `SeenIds` (its `see` told each id created, evicted or expired), or None.
    #[pyo3(get, set)]
    seen: Option<Py<PyAny>>,
    passed_locally: Py<PyAny>,
    passed_from_cache: Py<PyAny>,
    late_write: Py<PyAny>,
    fenced: Py<PyAny>,    // fenced(epoch, known epoch) -> Verdict
    candidate: Py<PyAny>, // candidate(producer id, epoch, started) -> Candidate
}

/// A (topic, partition) tuple's fields, the topic's text not copied.
fn topic_partition(item: &Bound<'_, PyAny>) -> PyResult<(PyBackedStr, i32)> {
    let tuple = item.cast::<PyTuple>()?;
    Ok((tuple.get_borrowed_item(0)?.extract::<PyBackedStr>()?, tuple.get_borrowed_item(1)?.extract::<i32>()?))
}

/// The topic last looked up in a write's partitions: its object, its text, and its partitions in the record.
type TopicLooked<'py, 'r> = (Bound<'py, PyAny>, PyBackedStr, Option<&'r HashSet<i32>>);

fn partitions_of(items: Option<&Bound<'_, PyAny>>, into: &mut Partitions) -> PyResult<()> {
    if let Some(items) = items {
        for item in items.try_iter()? {
            let (topic, partition) = topic_partition(&item?)?;
            into.insert(&topic, partition);
        }
    }
    Ok(())
}

impl RegistryCore {
    /// `added` with the partitions as (topic, partition) pairs of text: the Python method's once converted, or an
    /// answer read natively (py_observe.rs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn added_pairs<'a>(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64,
                                  now_ms: i64, pairs: impl Iterator<Item = (&'a str, i32)>, group: Option<&str>)
        -> PyResult<()> {
        let mut seen = Vec::new();
        self.inner.added(txn_id, producer_id, epoch, now_ms, pairs, group, &mut seen);
        self.tell(py, seen)
    }

    /// Tell `seen` the ids the last call created, evicted or expired, in order.
    fn tell(&self, py: Python<'_>, ids: Vec<String>) -> PyResult<()> {
        if let Some(seen) = &self.seen {
            for id in ids {
                seen.call_method1(py, "see", (id,))?;
            }
        }
        Ok(())
    }

    fn verdict(&self, py: Python<'_>, local: Local) -> PyResult<Py<PyAny>> {
        Ok(match local {
            Local::PassedLocally => self.passed_locally.clone_ref(py),
            Local::PassedFromCache => self.passed_from_cache.clone_ref(py),
            Local::LateWrite => self.late_write.clone_ref(py),
            Local::Fenced { epoch, known } => self.fenced.call1(py, (epoch, known))?,
        })
    }
}

fn set_of<'py>(py: Python<'py>, p: &Partitions) -> PyResult<Bound<'py, PySet>> {
    PySet::new(py, p.iter())
}

#[pymethods]
impl RegistryCore {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(max_entries: usize, idle_expiry_ms: i64, evidence_ttl_ms: Option<i64>, overdue_slack_ms: i64,
           passed_locally: Py<PyAny>, passed_from_cache: Py<PyAny>, late_write: Py<PyAny>, fenced: Py<PyAny>,
           candidate: Py<PyAny>) -> Self {
        let limits = Limits { max_entries, idle_expiry_ms, evidence_ttl_ms, overdue_slack_ms };
        RegistryCore { inner: Registry::new(limits), seen: None, passed_locally, passed_from_cache, late_write,
                       fenced, candidate }
    }

    /// New limits (verification/registry.py's `RegistryLimits`), from the next call on.
    fn set_limits(&mut self, max_entries: usize, idle_expiry_ms: i64, evidence_ttl_ms: Option<i64>,
                  overdue_slack_ms: i64) {
        self.inner.limits = Limits { max_entries, idle_expiry_ms, evidence_ttl_ms, overdue_slack_ms };
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// The id's record as a tuple in `TxnRecord`'s field order after its id (the phase by its value, the partitions
    /// as sets of (topic, partition), `timed_out` as (producer id, epoch, started)), or None.
    fn record<'py>(&self, py: Python<'py>, txn_id: &str) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(r) = self.inner.get(txn_id) else { return Ok(None) };
        let fields: Vec<Bound<'py, PyAny>> = vec![
            r.producer_id.into_pyobject(py)?.into_any(),
            r.producer_epoch.into_pyobject(py)?.into_any(),
            r.timeout_ms.into_pyobject(py)?.into_any(),
            PyString::new(py, r.phase.name()).into_any(),
            r.generation.into_pyobject(py)?.into_any(),
            set_of(py, &r.partitions)?.into_any(),
            PySet::new(py, r.groups.iter())?.into_any(),
            r.started_ms.into_pyobject(py)?.into_any(),
            r.last_seen_ms.into_pyobject(py)?.into_any(),
            r.observed_ms.into_pyobject(py)?.into_any(),
            set_of(py, &r.described)?.into_any(),
            r.coordinator_start_ms.into_pyobject(py)?.into_any(),
            r.coordinator_seen_ms.into_pyobject(py)?.into_any(),
            r.request_timeout_ms.into_pyobject(py)?.into_any(),
            r.timed_out.into_pyobject(py)?.into_any(),
            r.ended_ms.into_pyobject(py)?.into_any(),
        ];
        Ok(Some(PyTuple::new(py, fields)?))
    }

    /// The ids from least to most recently seen (the order eviction and expiry follow).
    fn ids(&self) -> Vec<String> {
        self.inner.ids().map(str::to_owned).collect()
    }

    pub(crate) fn init_producer_id(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64,
                                   timeout_ms: i64, now_ms: i64) -> PyResult<()> {
        let mut seen = Vec::new();
        self.inner.init_producer_id(txn_id, producer_id, epoch, timeout_ms, now_ms, &mut seen);
        self.tell(py, seen)
    }

    #[pyo3(signature = (txn_id, producer_id, epoch, now_ms, *, partitions=None, group=None))]
    #[allow(clippy::too_many_arguments)]
    fn added(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64,
             partitions: Option<&Bound<'_, PyAny>>, group: Option<&str>) -> PyResult<()> {
        let mut pairs = Vec::new();
        if let Some(partitions) = partitions {
            for item in partitions.try_iter()? {
                pairs.push(topic_partition(&item?)?);
            }
        }
        self.added_pairs(py, txn_id, producer_id, epoch, now_ms, pairs.iter().map(|(t, p)| (&**t, *p)), group)
    }

    fn request_timeout(&mut self, txn_id: &str, timeout_ms: i64) {
        self.inner.request_timeout(txn_id, timeout_ms);
    }

    pub(crate) fn end_txn(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64)
        -> PyResult<()> {
        let mut seen = Vec::new();
        self.inner.end_txn(txn_id, producer_id, epoch, now_ms, &mut seen);
        self.tell(py, seen)
    }

    #[pyo3(signature = (txn_id, producer_id, epoch, start_ms, partitions, groups_partitions, now_ms, timeout_ms=None))]
    #[allow(clippy::too_many_arguments)]
    fn coordinator_says_ongoing(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, start_ms: i64,
                                partitions: &Bound<'_, PyAny>, groups_partitions: &Bound<'_, PyAny>, now_ms: i64,
                                timeout_ms: Option<i64>) -> PyResult<()> {
        let mut described = Partitions::default();
        partitions_of(Some(partitions), &mut described)?;
        partitions_of(Some(groups_partitions), &mut described)?;
        let mut seen = Vec::new();
        self.inner.coordinator_says_ongoing(txn_id, producer_id, epoch, start_ms, described, now_ms, timeout_ms,
                                            &mut seen);
        self.tell(py, seen)
    }

    fn expire(&mut self, py: Python<'_>, now_ms: i64) -> PyResult<usize> {
        let mut seen = Vec::new();
        let dropped = self.inner.expire(now_ms, &mut seen);
        self.tell(py, seen)?;
        Ok(dropped)
    }

    fn timeout_candidate(&self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64)
        -> PyResult<Option<Py<PyAny>>> {
        self.inner.timeout_candidate(txn_id, producer_id, epoch, now_ms)
            .map(|(p, e, started)| self.candidate.call1(py, (p, e, started)))
            .transpose()
    }

    #[pyo3(signature = (txn_id, producer_id, epoch, tp, now_ms, group=None))]
    #[allow(clippy::too_many_arguments)]
    fn local_verdict(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, tp: &Bound<'_, PyAny>,
                     now_ms: i64, group: Option<&str>) -> PyResult<Option<Py<PyAny>>> {
        let (topic, partition) = topic_partition(tp)?;
        self.inner.local_verdict(txn_id, producer_id, epoch, &topic, partition, now_ms, group)
            .map(|v| self.verdict(py, v))
            .transpose()
    }

    /// `local_verdict`'s pass on observed evidence when every partition of `tps` has it, else None.
    fn passes_locally(&mut self, py: Python<'_>, txn_id: &str, producer_id: i64, epoch: i64, tps: &Bound<'_, PyAny>,
                      now_ms: i64) -> PyResult<Option<Py<PyAny>>> {
        let Some(rec) = self.inner.passing(txn_id, producer_id, epoch, now_ms) else { return Ok(None) };
        // A write's partitions come topic by topic: a topic is looked up once for its partitions (the same object,
        // as the Produce reader gives it, or the same text), not hashed per partition.
        let mut current: Option<TopicLooked<'_, '_>> = None;
        for item in tps.try_iter()? {
            let item = item?;
            let tuple = item.cast::<PyTuple>()?;
            let topic = tuple.get_item(0)?;
            let partition = tuple.get_borrowed_item(1)?.extract::<i32>()?;
            let set = match &current {
                Some((seen, _, set)) if seen.is(&topic) => *set,
                _ => {
                    let text = topic.extract::<PyBackedStr>()?;
                    let set = match &current {
                        Some((_, seen, set)) if *seen == text => *set,
                        _ => rec.partitions.of_topic(&text),
                    };
                    current = Some((topic, text, set));
                    set
                }
            };
            if !set.is_some_and(|s| s.contains(&partition)) {
                return Ok(None); // not observed here (maybe given by the coordinator): local_verdict decides
            }
        }
        self.inner.seen_now(txn_id, now_ms);
        Ok(Some(self.passed_locally.clone_ref(py)))
    }
}

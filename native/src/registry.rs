//! The transaction registry's state, natively: what this proxy has seen of each transactional id.
//!
//! The same registry as verification/registry.py (its docstring says what the evidence is and how it ages); that
//! module's `PythonRegistry` is the fallback without this module and the oracle of the property test that runs both
//! over generated histories (tests/property/test_native_registry.py). Pure: time arrives as `now_ms` in every call,
//! and what Python must be told (an id seen, a verdict to build) is returned, never called from here.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    Empty,    // InitProducerId answered; no partition added yet
    Ongoing,  // at least one AddPartitionsToTxn/AddOffsetsToTxn succeeded
    Ended,    // EndTxn forwarded by this process: a write with no add since is late
    TimedOut, // past the timeout it observed: evidence gone, the coordinator decides
}

impl Phase {
    /// verification/registry.py's `Phase` values.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Empty => "empty",
            Phase::Ongoing => "ongoing",
            Phase::Ended => "ended",
            Phase::TimedOut => "timed_out",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    Init,
    Add,
    End,
    Timeout,
}

/// (phase, event) -> (next phase, new generation: forget partitions and groups). Anything missing keeps the phase.
/// verification/registry.py's TRANSITIONS, row for row.
const TRANSITIONS: [(Phase, Event, Phase, bool); 13] = [
    (Phase::Empty, Event::Init, Phase::Empty, true),
    (Phase::Empty, Event::Add, Phase::Ongoing, false),
    (Phase::Empty, Event::End, Phase::Ended, true),
    (Phase::Ongoing, Event::Init, Phase::Empty, true),
    (Phase::Ongoing, Event::Add, Phase::Ongoing, false),
    (Phase::Ongoing, Event::End, Phase::Ended, true),
    (Phase::Ongoing, Event::Timeout, Phase::TimedOut, true),
    (Phase::Ended, Event::Init, Phase::Empty, true),
    (Phase::Ended, Event::Add, Phase::Ongoing, false), // END already cleared the old generation
    (Phase::Ended, Event::End, Phase::Ended, false),
    (Phase::TimedOut, Event::Init, Phase::Empty, true),
    (Phase::TimedOut, Event::Add, Phase::Ongoing, false), // TIMEOUT already cleared the old generation
    (Phase::TimedOut, Event::End, Phase::Ended, false),
];

fn step(phase: Phase, event: Event) -> (Phase, bool) {
    TRANSITIONS.iter().find(|t| t.0 == phase && t.1 == event).map_or((phase, false), |t| (t.2, t.3))
}

/// Partitions by topic: a partition is looked up by the topic's `&str`, without building a key (a set per topic: a
/// transaction may hold hundreds of one topic's partitions).
#[derive(Default, Clone, Debug)]
pub struct Partitions(HashMap<String, HashSet<i32>>);

impl Partitions {
    pub fn contains(&self, topic: &str, partition: i32) -> bool {
        self.0.get(topic).is_some_and(|p| p.contains(&partition))
    }

    /// One topic's partitions (to look several of them up with one hash of its name).
    pub fn of_topic(&self, topic: &str) -> Option<&HashSet<i32>> {
        self.0.get(topic)
    }

    pub fn insert(&mut self, topic: &str, partition: i32) {
        match self.0.get_mut(topic) {
            Some(p) => {
                p.insert(partition);
            }
            None => {
                self.0.insert(topic.to_owned(), HashSet::from([partition]));
            }
        }
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, i32)> {
        self.0.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.as_str(), *p)))
    }
}

/// The transaction the registry ended because it outlived its timeout: (producer id, epoch, started).
pub type Candidate = (i64, i64, i64);

#[derive(Clone, Debug)]
pub struct Record {
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub timeout_ms: Option<i64>, // as an InitProducerId or a coordinator's answer said; None: never observed
    pub phase: Phase,
    pub generation: i64,
    pub partitions: Partitions, // observed: adds this process forwarded
    pub groups: HashSet<String>,
    pub started_ms: Option<i64>,
    pub last_seen_ms: i64,
    pub observed_ms: i64,
    pub described: Partitions, // given: the coordinator's answer
    pub coordinator_start_ms: Option<i64>,
    pub coordinator_seen_ms: Option<i64>,
    pub request_timeout_ms: Option<i64>,
    pub timed_out: Option<Candidate>,
    pub ended_ms: Option<i64>,
    order: u64, // its place in the recency order
}

impl Record {
    fn new(now_ms: i64, order: u64) -> Self {
        Record {
            producer_id: -1,
            producer_epoch: -1,
            timeout_ms: None,
            phase: Phase::Empty,
            generation: 0,
            partitions: Partitions::default(),
            groups: HashSet::new(),
            started_ms: None,
            last_seen_ms: now_ms,
            observed_ms: now_ms,
            described: Partitions::default(),
            coordinator_start_ms: None,
            coordinator_seen_ms: None,
            request_timeout_ms: None,
            timed_out: None,
            ended_ms: None,
            order,
        }
    }

    fn apply(&mut self, event: Event, now_ms: i64) {
        let (phase, new_generation) = step(self.phase, event);
        self.timed_out = None;
        if phase == Phase::Ended && self.phase != Phase::Ended {
            self.ended_ms = Some(now_ms);
        }
        if event == Event::Timeout && self.phase == Phase::Ongoing {
            if let Some(started) = self.started_ms {
                self.timed_out = Some((self.producer_id, self.producer_epoch, started));
            }
        }
        if new_generation {
            self.generation += 1;
            self.partitions.clear();
            self.groups.clear();
            self.described.clear();
            self.started_ms = None;
            self.coordinator_start_ms = None;
            self.coordinator_seen_ms = None;
        }
        if phase == Phase::Ongoing && self.started_ms.is_none() {
            self.started_ms = Some(now_ms);
        }
        self.phase = phase;
        self.last_seen_ms = now_ms;
        if event != Event::Timeout {
            self.observed_ms = now_ms;
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_entries: usize,
    pub idle_expiry_ms: i64,
    pub evidence_ttl_ms: Option<i64>, // None: observed evidence holds until EndTxn (a gateway)
    pub overdue_slack_ms: i64,        // verification/timeouts.py's OVERDUE_SLACK_MS
}

/// A verdict from observed traffic (verification/registry.py's `local_verdict`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Local {
    PassedLocally,
    PassedFromCache,
    LateWrite,
    Fenced { epoch: i64, known: i64 },
}

pub struct Registry {
    pub limits: Limits,
    records: HashMap<Arc<str>, Record>,
    by_recency: BTreeMap<u64, Arc<str>>, // least recently seen first
    next_order: u64,
}

impl Registry {
    pub fn new(limits: Limits) -> Self {
        Registry { limits, records: HashMap::new(), by_recency: BTreeMap::new(), next_order: 0 }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn get(&self, txn_id: &str) -> Option<&Record> {
        self.records.get(txn_id)
    }

    fn order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// Move an id to the most recently seen end.
    fn refresh(&mut self, txn_id: &str) {
        let order = self.order();
        if let Some((key, rec)) = self.records.get_key_value(txn_id) {
            let key = key.clone();
            let old = rec.order;
            self.by_recency.remove(&old);
            self.by_recency.insert(order, key);
        }
        if let Some(rec) = self.records.get_mut(txn_id) {
            rec.order = order;
        }
    }

    /// The id's record, created (and told to `seen`: the ids created and evicted, in order) when new; the least
    /// recently seen ids evicted beyond `max_entries`. None only when the id itself was evicted (max_entries 0).
    fn touch(&mut self, txn_id: &str, now_ms: i64, seen: &mut Vec<String>) -> Option<&mut Record> {
        if self.records.contains_key(txn_id) {
            self.refresh(txn_id);
        } else {
            let order = self.order();
            let key: Arc<str> = Arc::from(txn_id);
            self.records.insert(key.clone(), Record::new(now_ms, order));
            self.by_recency.insert(order, key);
            seen.push(txn_id.to_owned());
            while self.records.len() > self.limits.max_entries {
                let Some((_, evicted)) = self.by_recency.pop_first() else { break };
                self.records.remove(&evicted);
                seen.push(evicted.to_string());
            }
        }
        let rec = self.records.get_mut(txn_id)?;
        rec.last_seen_ms = now_ms;
        Some(rec)
    }

    // -- what the proxy observed

    pub fn init_producer_id(&mut self, txn_id: &str, producer_id: i64, epoch: i64, timeout_ms: i64, now_ms: i64,
                            seen: &mut Vec<String>) {
        if let Some(rec) = self.touch(txn_id, now_ms, seen) {
            rec.apply(Event::Init, now_ms);
            (rec.producer_id, rec.producer_epoch, rec.timeout_ms) = (producer_id, epoch, Some(timeout_ms));
        }
    }

    /// A successful AddPartitionsToTxn (the partitions that succeeded) or AddOffsetsToTxn (the group).
    #[allow(clippy::too_many_arguments)] // the Python registry's arguments, one for one
    pub fn added<'a>(&mut self, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64,
                     partitions: impl IntoIterator<Item = (&'a str, i32)>, group: Option<&str>,
                     seen: &mut Vec<String>) {
        let Some(rec) = self.touch(txn_id, now_ms, seen) else { return };
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) {
            // A producer not seen initialising (another proxy, a restart): the coordinator accepted the add, so
            // this is its current identity. Its timeout is not known.
            rec.apply(Event::Init, now_ms);
            (rec.producer_id, rec.producer_epoch, rec.timeout_ms) = (producer_id, epoch, None);
        }
        rec.apply(Event::Add, now_ms);
        for (topic, partition) in partitions {
            rec.partitions.insert(topic, partition);
        }
        if let Some(group) = group {
            rec.groups.insert(group.to_owned());
        }
    }

    /// The client's request timeout (a Produce's TimeoutMs), for an id already known only.
    pub fn request_timeout(&mut self, txn_id: &str, timeout_ms: i64) {
        if let Some(rec) = self.records.get_mut(txn_id) {
            rec.request_timeout_ms = Some(timeout_ms);
        }
    }

    pub fn end_txn(&mut self, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64, seen: &mut Vec<String>) {
        let Some(rec) = self.touch(txn_id, now_ms, seen) else { return };
        if (rec.producer_id, rec.producer_epoch) == (producer_id, epoch) || rec.producer_id < 0 {
            (rec.producer_id, rec.producer_epoch) = (producer_id, epoch);
            rec.apply(Event::End, now_ms);
        }
    }

    /// A coordinator's answer "Ongoing, these partitions": evidence of one generation, and its timeout.
    #[allow(clippy::too_many_arguments)] // the Python registry's arguments, one for one
    pub fn coordinator_says_ongoing(&mut self, txn_id: &str, producer_id: i64, epoch: i64, start_ms: i64,
                                    described: Partitions, now_ms: i64, timeout_ms: Option<i64>,
                                    seen: &mut Vec<String>) {
        let Some(rec) = self.touch(txn_id, now_ms, seen) else { return };
        let observed_ms = rec.observed_ms; // an answer given is not observed evidence: its age stays
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) {
            rec.apply(Event::Init, now_ms);
            (rec.producer_id, rec.producer_epoch, rec.timeout_ms) = (producer_id, epoch, None);
        } else if rec.coordinator_start_ms.is_some_and(|s| s != start_ms) {
            rec.apply(Event::Init, now_ms); // a different transaction than the one we knew
        }
        rec.apply(Event::Add, now_ms);
        rec.observed_ms = observed_ms;
        rec.described = described;
        rec.coordinator_start_ms = Some(start_ms);
        rec.coordinator_seen_ms = Some(now_ms);
        if let Some(t) = timeout_ms.filter(|t| *t > 0) {
            rec.timeout_ms = Some(t);
        }
    }

    /// Drop idle ids (told to `seen`) and the evidence of transactions past the timeout this proxy observed;
    /// how many ids were dropped.
    pub fn expire(&mut self, now_ms: i64, seen: &mut Vec<String>) -> usize {
        let mut dropped = 0;
        let ids: Vec<Arc<str>> = self.by_recency.values().cloned().collect();
        for id in ids {
            let Some(rec) = self.records.get_mut(&id) else { continue };
            if now_ms - rec.last_seen_ms > self.limits.idle_expiry_ms {
                let order = rec.order;
                self.records.remove(&id);
                self.by_recency.remove(&order);
                dropped += 1;
                seen.push(id.to_string());
            } else if rec.phase == Phase::Ongoing
                && matches!((rec.started_ms, rec.timeout_ms), (Some(s), Some(t)) if now_ms - s > t) {
                rec.apply(Event::Timeout, now_ms);
            }
        }
        dropped
    }

    /// The transaction of (producer_id, epoch) seen ongoing, with no EndTxn since, past (or about at) its timeout.
    pub fn timeout_candidate(&self, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64) -> Option<Candidate> {
        let rec = self.records.get(txn_id)?;
        if self.limits.evidence_ttl_ms.is_some() {
            return None;
        }
        if let Some(hit) = rec.timed_out {
            return ((hit.0, hit.1) == (producer_id, epoch)).then_some(hit);
        }
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) || rec.phase != Phase::Ongoing {
            return None;
        }
        let (started, timeout) = (rec.started_ms?, rec.timeout_ms?);
        if now_ms - started < timeout - self.limits.overdue_slack_ms {
            return None;
        }
        Some((producer_id, epoch, started))
    }

    // -- what the proxy can decide alone

    fn within_ttl(&self, seen_ms: Option<i64>, now_ms: i64) -> bool {
        match self.limits.evidence_ttl_ms {
            None => true,
            Some(ttl) => seen_ms.is_some_and(|s| now_ms - s < ttl),
        }
    }

    /// A passed write keeps its id alive: idle expiry and eviction count from the last write too.
    pub fn seen_now(&mut self, txn_id: &str, now_ms: i64) {
        self.refresh(txn_id);
        if let Some(rec) = self.records.get_mut(txn_id) {
            rec.last_seen_ms = now_ms;
        }
    }

    /// A verdict from observed traffic, or None when someone must be asked. `topic`/`partition` is the partition
    /// written to; for TxnOffsetCommit the group's __consumer_offsets partition and `group` the group id.
    #[allow(clippy::too_many_arguments)] // the Python registry's arguments, one for one
    pub fn local_verdict(&mut self, txn_id: &str, producer_id: i64, epoch: i64, topic: &str, partition: i32,
                         now_ms: i64, group: Option<&str>) -> Option<Local> {
        let rec = self.records.get(txn_id)?;
        if rec.producer_id != producer_id {
            return None;
        }
        if epoch < rec.producer_epoch {
            return Some(Local::Fenced { epoch, known: rec.producer_epoch });
        }
        if epoch != rec.producer_epoch {
            return None;
        }
        match rec.phase {
            // Past the bound, "ended" is as stale as "ongoing" (verification/registry.py says why).
            Phase::Ended => return self.within_ttl(rec.ended_ms, now_ms).then_some(Local::LateWrite),
            Phase::Ongoing => {}
            _ => return None,
        }
        let observed = rec.partitions.contains(topic, partition) || group.is_some_and(|g| rec.groups.contains(g));
        let verdict = if observed && self.within_ttl(Some(rec.observed_ms), now_ms) {
            Local::PassedLocally
        } else if rec.described.contains(topic, partition)
            && rec.coordinator_seen_ms.is_some_and(|s| now_ms - s < self.limits.evidence_ttl_ms.unwrap_or(0)) {
            Local::PassedFromCache
        } else {
            return None;
        };
        self.seen_now(txn_id, now_ms);
        Some(verdict)
    }

    /// The record of (producer_id, epoch) whose ongoing transaction has observed evidence within its bound: the
    /// first half of `passes_locally` (the caller looks its partitions up, then calls `seen_now`).
    pub fn passing(&self, txn_id: &str, producer_id: i64, epoch: i64, now_ms: i64) -> Option<&Record> {
        let rec = self.records.get(txn_id)?;
        (rec.producer_id == producer_id && rec.producer_epoch == epoch && rec.phase == Phase::Ongoing
            && self.within_ttl(Some(rec.observed_ms), now_ms)).then_some(rec)
    }

    /// True when `local_verdict` passes every partition of `partitions` on observed evidence (one record lookup,
    /// one set lookup per partition); false: the general path decides.
    pub fn passes_locally<'a>(&mut self, txn_id: &str, producer_id: i64, epoch: i64,
                              mut partitions: impl Iterator<Item = (&'a str, i32)>, now_ms: i64) -> bool {
        let Some(rec) = self.passing(txn_id, producer_id, epoch, now_ms) else { return false };
        if !partitions.all(|(t, p)| rec.partitions.contains(t, p)) {
            return false;
        }
        self.seen_now(txn_id, now_ms);
        true
    }

    /// The ids from least to most recently seen.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.by_recency.values().map(|k| &**k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY: Limits = Limits { max_entries: 3, idle_expiry_ms: 1000, evidence_ttl_ms: None, overdue_slack_ms: 10 };

    #[test]
    fn an_added_partition_passes_until_end_txn_then_the_write_is_late() {
        let mut r = Registry::new(GATEWAY);
        let mut seen = Vec::new();
        r.init_producer_id("app", 7, 0, 60_000, 1, &mut seen);
        r.added("app", 7, 0, 2, [("t", 0)], None, &mut seen);
        assert!(r.passes_locally("app", 7, 0, [("t", 0)].into_iter(), 3));
        assert!(!r.passes_locally("app", 7, 0, [("t", 0), ("t", 1)].into_iter(), 3));
        r.end_txn("app", 7, 0, 4, &mut seen);
        assert_eq!(r.local_verdict("app", 7, 0, "t", 0, 5, None), Some(Local::LateWrite));
        assert_eq!(r.local_verdict("app", 7, -1, "t", 0, 5, None), Some(Local::Fenced { epoch: -1, known: 0 }));
        assert_eq!(seen, vec!["app".to_owned()]);
        assert_eq!(r.get("app").map(|rec| rec.generation), Some(2));
    }

    #[test]
    fn the_least_recently_seen_id_is_evicted_and_a_passed_write_counts_as_seen() {
        let mut r = Registry::new(GATEWAY);
        let mut seen = Vec::new();
        for id in ["a", "b", "c"] {
            r.added(id, 1, 0, 1, [("t", 0)], None, &mut seen);
        }
        assert!(r.passes_locally("a", 1, 0, [("t", 0)].into_iter(), 2)); // "a" is now the most recent
        r.added("d", 1, 0, 3, [], Some("g"), &mut seen);
        assert_eq!(r.ids().collect::<Vec<_>>(), vec!["c", "a", "d"]);
        assert_eq!(seen, vec!["a", "b", "c", "d", "b"]);
    }

    #[test]
    fn expiry_drops_idle_ids_and_times_out_an_overdue_transaction() {
        let mut r = Registry::new(GATEWAY);
        let mut seen = Vec::new();
        r.init_producer_id("old", 1, 0, 100, 0, &mut seen);
        r.init_producer_id("slow", 2, 0, 100, 900, &mut seen);
        r.added("slow", 2, 0, 900, [("t", 0)], None, &mut seen);
        assert_eq!(r.timeout_candidate("slow", 2, 0, 985), None);
        assert_eq!(r.timeout_candidate("slow", 2, 0, 990), Some((2, 0, 900)));
        seen.clear();
        assert_eq!(r.expire(1_001, &mut seen), 1);
        assert_eq!(seen, vec!["old"]);
        assert_eq!(r.get("slow").map(|rec| rec.phase), Some(Phase::TimedOut));
        assert_eq!(r.timeout_candidate("slow", 2, 0, 1_001), Some((2, 0, 900)));
    }
}

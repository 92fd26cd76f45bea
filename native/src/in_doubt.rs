//! The EndTxn ledger: every forwarded EndTxn still unanswered, by transactional id (KAFKA-17754's defence).
//!
//! The same rules as verification/in_doubt.py's `PythonEndTxnLedger` (its docstring says why each holds), which
//! stays the fallback without this module and the oracle of tests/property/test_native_in_doubt.py. Pure: time
//! comes in as `now_ms`; what ended is returned (each EndTxn by its token, with how it ended), for the caller to
//! tell whoever waits. A transactional id's EndTxns keep the order they were sent in, and the ids the order their
//! first EndTxn in doubt was written down in (the Python ledger's dict order): `expire` ends them in that order.

use std::collections::HashMap;

/// How an EndTxn stopped being in doubt (verification/in_doubt.py's `Ending`, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Answered = 0,
    Fenced = 1,
    Closed = 2,
    Expired = 3,
}

/// One forwarded EndTxn, as the ledger keeps it (its token names it to the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub token: u64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub connection_id: i64,
    pub sent_ms: i64,
    pub sent_mark: u64,
    /// When its connection closed with it unanswered, and the ledger's mark then.
    pub orphaned: Option<(i64, u64)>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// How long an unanswered EndTxn holds its id's next transaction, at most.
    pub max_ms: i64,
    /// By transactional id: the order its first open EndTxn was written down in, and its open EndTxns.
    open: HashMap<String, (u64, Vec<Sent>)>,
    /// How many ended each way (by `Ending`).
    pub endings: [u64; 4],
    marks: u64,
    tokens: u64,
    /// The next id's place in the order of ids.
    places: u64,
}

/// The EndTxns that ended in one call: (transactional id, token, how), in the order they ended.
pub type Ended = Vec<(String, u64, Ending)>;

impl Ledger {
    pub fn new(max_ms: i64) -> Self {
        Ledger { max_ms, ..Ledger::default() }
    }

    /// A point in the ledger's order of events.
    pub fn mark(&mut self) -> u64 {
        self.marks += 1;
        self.marks
    }

    pub fn len(&self) -> usize {
        self.open.values().map(|(_, sent)| sent.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// An EndTxn forwarded: its token, and the ledger's mark when it was sent.
    pub fn sent(&mut self, txn_id: &str, producer_id: i64, producer_epoch: i16, connection_id: i64, now_ms: i64)
        -> (u64, u64) {
        let sent_mark = self.mark();
        self.tokens += 1;
        let token = self.tokens;
        let sent = Sent { token, producer_id, producer_epoch, connection_id, sent_ms: now_ms, sent_mark,
                          orphaned: None };
        match self.open.get_mut(txn_id) {
            Some((_, list)) => list.push(sent),
            None => {
                self.places += 1;
                self.open.insert(txn_id.to_owned(), (self.places, vec![sent]));
            }
        }
        (token, sent_mark)
    }

    /// Its answer came back; and any EndTxn of the same producer orphaned before it was sent can no longer land.
    pub fn answered(&mut self, txn_id: &str, token: u64, producer_id: i64, producer_epoch: i16, sent_mark: u64)
        -> Ended {
        let mut ended = Vec::new();
        self.end(txn_id, |s| s.token == token, Ending::Answered, &mut ended);
        self.end(txn_id, |s| closed_before(s, producer_id, producer_epoch, sent_mark), Ending::Closed, &mut ended);
        ended
    }

    /// Its connection closed unanswered (the caller marked when: `orphaned_ms`, `mark`); False when it is no longer
    /// in doubt.
    pub fn orphaned(&mut self, txn_id: &str, token: u64, orphaned_ms: i64, mark: u64) -> bool {
        let found = self.open.get_mut(txn_id).and_then(|(_, list)| list.iter_mut().find(|s| s.token == token));
        match found {
            Some(s) => {
                s.orphaned.get_or_insert((orphaned_ms, mark));
                true
            }
            None => false,
        }
    }

    /// The coordinator answered a request sent at `mark`: this producer's EndTxns orphaned before it are done.
    pub fn answered_after(&mut self, txn_id: &str, producer_id: i64, producer_epoch: i16, mark: u64) -> Ended {
        let mut ended = Vec::new();
        self.end(txn_id, |s| closed_before(s, producer_id, producer_epoch, mark), Ending::Closed, &mut ended);
        ended
    }

    /// The producer is now (producer_id, epoch): an EndTxn of another identity can only be refused.
    pub fn fenced(&mut self, txn_id: &str, producer_id: i64, producer_epoch: i16) -> Ended {
        let mut ended = Vec::new();
        self.end(txn_id, |s| (s.producer_id, s.producer_epoch) != (producer_id, producer_epoch), Ending::Fenced,
                 &mut ended);
        ended
    }

    /// The earliest EndTxn in doubt that could land in a transaction (producer_id, epoch) is about to open.
    pub fn blocking(&self, txn_id: &str, producer_id: i64, producer_epoch: i16, connection_id: i64, now_ms: i64)
        -> Option<u64> {
        let (_, list) = self.open.get(txn_id)?;
        list.iter().find(|s| {
            (s.producer_id, s.producer_epoch) == (producer_id, producer_epoch)
                && !(s.connection_id == connection_id && s.orphaned.is_none())
                && now_ms - s.sent_ms < self.max_ms
        }).map(|s| s.token)
    }

    /// The id's EndTxns in doubt, in the order they were sent.
    pub fn in_doubt(&self, txn_id: &str) -> Vec<u64> {
        self.open.get(txn_id).map(|(_, list)| list.iter().map(|s| s.token).collect()).unwrap_or_default()
    }

    /// Those unanswered for `max_ms`: no longer held for.
    pub fn expire(&mut self, now_ms: i64) -> Ended {
        let mut ids: Vec<(u64, String)> = self.open.iter()
            .filter(|(_, (_, list))| list.iter().any(|s| now_ms - s.sent_ms >= self.max_ms))
            .map(|(id, (place, _))| (*place, id.clone())).collect();
        ids.sort_unstable();
        let mut ended = Vec::new();
        let max_ms = self.max_ms;
        for (_, id) in ids {
            self.end(&id, |s| now_ms - s.sent_ms >= max_ms, Ending::Expired, &mut ended);
        }
        ended
    }

    /// End the id's EndTxns that `matches`, in order, each counted and added to `ended`.
    fn end(&mut self, txn_id: &str, matches: impl Fn(&Sent) -> bool, how: Ending, ended: &mut Ended) {
        let Some((_, list)) = self.open.get_mut(txn_id) else { return };
        let before = ended.len();
        list.retain(|s| {
            let end = matches(s);
            if end {
                ended.push((txn_id.to_owned(), s.token, how));
            }
            !end
        });
        self.endings[how as usize] += (ended.len() - before) as u64;
        if list.is_empty() {
            self.open.remove(txn_id);
        }
    }
}

fn closed_before(s: &Sent, producer_id: i64, producer_epoch: i16, mark: u64) -> bool {
    (s.producer_id, s.producer_epoch) == (producer_id, producer_epoch)
        && s.orphaned.is_some_and(|(_, orphaned_mark)| orphaned_mark < mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_ends_its_end_txn_and_those_of_its_producer_orphaned_before_it() {
        let mut l = Ledger::new(60_000);
        let (first, _) = l.sent("app", 7, 0, 1, 100);
        let mark = l.mark();
        assert!(l.orphaned("app", first, 150, mark));
        let (second, second_mark) = l.sent("app", 7, 0, 2, 200);
        let (other, _) = l.sent("app", 8, 0, 3, 200);
        assert_eq!(l.blocking("app", 7, 0, 2, 300), Some(first));
        let ended = l.answered("app", second, 7, 0, second_mark);
        assert_eq!(ended, vec![("app".into(), second, Ending::Answered), ("app".into(), first, Ending::Closed)]);
        assert_eq!((l.in_doubt("app"), l.endings), (vec![other], [1, 0, 1, 0]));
    }

    #[test]
    fn fencing_and_expiry_end_the_rest_and_the_ids_go_in_their_order() {
        let mut l = Ledger::new(1_000);
        let (b, _) = l.sent("b", 1, 0, 1, 0);
        let (a, _) = l.sent("a", 1, 0, 1, 10);
        let (a2, _) = l.sent("a", 1, 1, 1, 2_000);
        assert_eq!(l.fenced("a", 1, 1), vec![("a".into(), a, Ending::Fenced)]);
        assert_eq!(l.blocking("a", 1, 1, 1, 2_500), None); // its own open connection: answered first
        assert_eq!(l.blocking("a", 1, 1, 2, 2_500), Some(a2));
        assert_eq!(l.blocking("a", 1, 1, 2, 3_000), None); // past max_ms: given up
        assert_eq!(l.expire(3_000), vec![("b".into(), b, Ending::Expired), ("a".into(), a2, Ending::Expired)]);
        assert!(l.is_empty());
        assert_eq!(l.endings, [0, 1, 0, 2]);
    }
}

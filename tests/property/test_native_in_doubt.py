"""Hypothesis: the native EndTxn ledger answers as the Python one, over any history of EndTxns and their fates.

Both ledgers get the same calls, in the same order, at the same times: EndTxns sent on connections, answered,
orphaned by a closing connection, fenced by a new producer epoch, settled by a later answer of the coordinator
(`answered_after`), questioned by the requests that would open a transaction (`blocking`), and expired. After
every call: the same answer (an EndTxn is compared by the call that sent it), every EndTxn's fields, the ledger's
size, its endings, what it told `on_change` in what order, and which EndTxns each id still has in doubt. The Python
ledger is the oracle (and the fallback where the native module is missing).
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

# `make test` builds the native module; without it this import fails, and so does the run (not a skip).
from txnguard.verification.in_doubt import InDoubtLimits, NativeEndTxnLedger, PythonEndTxnLedger

IDS = ["a", "b"]
# (id, producer id, epoch): mostly one producer per id, so EndTxns block, answer and orphan each other.
producer = st.sampled_from([("a", 1, 0)] * 3 + [("b", 2, 0)] * 2 + [("a", 1, 1), ("a", 3, 0), ("b", 2, 1)])
later = st.sampled_from([0, 1, 10, 500, 1000])   # ms since the previous call: the bound's edge comes up often
which = st.integers(0, 30)                         # an EndTxn sent earlier, by its index (modulo those sent)
connection = st.integers(1, 3)

call = st.one_of(
    st.tuples(st.just("sent"), producer, st.booleans(), connection, later),
    st.tuples(st.just("sent"), producer, st.booleans(), connection, later),
    st.tuples(st.just("answered"), which, later),
    st.tuples(st.just("orphaned"), which, later),
    st.tuples(st.just("answered_after"), producer, st.integers(-2, 2), later),  # a mark around the latest
    st.tuples(st.just("fenced"), producer, later),
    st.tuples(st.just("blocking"), producer, connection, later),
    st.tuples(st.just("in_doubt"), st.sampled_from(IDS), later),
    st.tuples(st.just("expire"), later),
    st.tuples(st.just("mark"), later),
)


class Side:
    """One ledger, what it told `on_change`, and the EndTxns it handed out, in the order sent."""

    def __init__(self, ledger_type: Any, max_ms: int) -> None:
        self.told: list[tuple[str, Any]] = []
        self.ledger = ledger_type(InDoubtLimits(max_ms=max_ms), on_change=lambda t, e: self.told.append((t, e)))
        self.sent: list[Any] = []
        self.marks = 0

    def index(self, s: Any) -> int | None:
        """An EndTxn by the call that sent it (identity: the token its connection keeps)."""
        return None if s is None else next(i for i, x in enumerate(self.sent) if x is s)

    def apply(self, step: tuple[Any, ...], now: int) -> Any:
        ledger, kind = self.ledger, step[0]
        match kind:
            case "sent":
                (txn_id, pid, epoch), committed, conn = step[1], step[2], step[3]
                self.sent.append(ledger.sent(txn_id, pid, epoch, committed, conn, now))
                return len(self.sent) - 1
            case "answered":
                if self.sent:
                    ledger.answered(self.sent[step[1] % len(self.sent)])
                return None
            case "orphaned":
                if self.sent:
                    ledger.orphaned(self.sent[step[1] % len(self.sent)], now)
                return None
            case "answered_after":
                (txn_id, pid, epoch), offset = step[1], step[2]
                mark = ledger.mark()  # the ledger's latest point, then a little before or after it
                return mark, ledger.answered_after(txn_id, pid, epoch, max(0, mark + offset))
            case "fenced":
                txn_id, pid, epoch = step[1]
                return ledger.fenced(txn_id, pid, epoch)
            case "blocking":
                (txn_id, pid, epoch), conn = step[1], step[2]
                return self.index(ledger.blocking(txn_id, pid, epoch, conn, now))
            case "in_doubt":
                return [self.index(s) for s in ledger.in_doubt(step[1])]
            case "expire":
                return [self.index(s) for s in ledger.expire(now)]
            case "mark":
                return ledger.mark()
            case _:
                raise AssertionError(kind)

    def state(self) -> tuple[Any, ...]:
        fields = [(s.transactional_id, s.producer_id, s.producer_epoch, s.committed, s.connection_id, s.sent_ms,
                   s.orphaned_ms, s.sent_mark, s.orphaned_mark) for s in self.sent]
        open_ = {txn_id: [self.index(s) for s in self.ledger.in_doubt(txn_id)] for txn_id in IDS}
        return fields, open_, len(self.ledger), dict(self.ledger.endings), list(self.told)


@settings(max_examples=1500, deadline=None)
@given(history=st.lists(call, min_size=1, max_size=40), max_ms=st.sampled_from([1, 500, 1000, 60_000]))
@example(  # an EndTxn orphaned, then one of the same producer sent and answered: the orphan is settled (CLOSED)
    history=[("sent", ("a", 1, 0), True, 1, 0), ("orphaned", 0, 0), ("sent", ("a", 1, 0), True, 2, 0),
             ("blocking", ("a", 1, 0), 2, 0), ("answered", 1, 0)], max_ms=60_000)
@example(  # exactly at max_ms: no longer blocking, and expired
    history=[("sent", ("a", 1, 0), True, 1, 0), ("blocking", ("a", 1, 0), 2, 1000), ("expire", 0)], max_ms=1000)
@example(  # two ids expired in the order their first EndTxn in doubt was written down, after one left and came back
    history=[("sent", ("a", 1, 0), True, 1, 0), ("sent", ("b", 2, 0), True, 1, 0), ("answered", 0, 0),
             ("sent", ("a", 1, 0), False, 1, 0), ("expire", 1000)], max_ms=500)
def test_the_native_ledger_answers_as_the_python_one(history, max_ms):
    python, rust = Side(PythonEndTxnLedger, max_ms), Side(NativeEndTxnLedger, max_ms)
    now = 1_000_000
    for step in history:
        now += step[-1]
        assert rust.apply(step, now) == python.apply(step, now), step
        assert rust.state() == python.state(), step

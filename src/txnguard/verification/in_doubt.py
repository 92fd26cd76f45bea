"""EndTxn in doubt: the proxy's defence against KAFKA-17754, pure.

An old client (transaction version 1) keeps its producer id and epoch from one transaction to the
next, so an EndTxn that reaches the coordinator late lands in whichever transaction is open then:
a late COMMIT of T1 commits the first half of T2 (the client's later writes are lost or refused),
a late ABORT aborts it. The bytes are the same as a legitimate EndTxn of T2; nothing on the wire
tells them apart once they arrive. What the proxy can know is that an EndTxn it forwarded has not
been answered yet: until it is, it may still take effect.

So every EndTxn the proxy forwards is written down here (`sent`) until its answer comes back
(`answered`). While one is unanswered, the same transactional id's next AddPartitionsToTxn or
AddOffsetsToTxn of the same producer id and epoch from another connection, the request that would
open T2 at the coordinator, is held (`blocking`): T2 does not start until T1's late EndTxn has
either landed (in T1, where it is a retry of a finished commit or a refused abort) or can no longer
land. A request on the EndTxn's own connection is not held: the broker answers one connection's
requests in order, so the EndTxn is processed before it.

What proves an EndTxn can no longer land:

* its answer (any answer: the coordinator processed it);
* the producer moved on: an answered InitProducerId, or the coordinator reporting another producer
  id or epoch (a coordinator that aborts a timed-out transaction bumps the epoch), fences it.

A connection that closes with an EndTxn unanswered (the broker closed it or died, or the proxy gave up
waiting) leaves it `orphaned`: its answer will never be seen. A closed TCP connection carries nothing
more: the broker either had read the EndTxn, and handles it in its request queue's order, or never
will. So an orphan also ends when the coordinator answers a request it received after the close (a
later EndTxn of the same producer, or the proxy's own DescribeTransactions while it holds a request:
`answered_after`), as the broker serves its request queue first in, first out, and a coordinator that
moved answers the old one's late EndTxn NOT_COORDINATOR. (The fault relay of the tests keeps a held
EndTxn past the proxy's close, as a network cannot: there the proxy keeps the connection open instead,
which is what it does whenever the client leaves.) Otherwise the producer moving on, or the bound
`max_ms` from when it was sent, ends the doubt. Past that bound the proxy stops holding for it and says
so (`expire`): the defence is bounded, not absolute.

Pure: time arrives as `now_ms`; the shell (proxy/guard.py) waits and asks the coordinator.

Two implementations of one ledger: `NativeEndTxnLedger` (the state in Rust, native/src/in_doubt.rs) where the
native module is installed, and `PythonEndTxnLedger` beside it, the fallback without the module and the oracle it
is tested against over generated histories (tests/property/test_native_in_doubt.py). `EndTxnLedger` and
`SentEndTxn` name the ones this install runs.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txnguard.codecs import native


class Ending(enum.Enum):
    """How an EndTxn stopped being in doubt (a metric label)."""

    ANSWERED = "answered"      # its answer came back (to the client, or after the client left)
    FENCED = "fenced"          # the producer id or epoch moved on: it can only be refused now
    CLOSED = "closed"          # its connection closed, and the coordinator has answered a later request
    EXPIRED = "expired"        # unanswered past max_ms: no longer held for

    __hash__ = object.__hash__  # identity, as equality is: Enum's own is a Python call, and these key hot dicts


_ANSWERED = Ending.ANSWERED  # a module global: an Enum member read through its class is a descriptor call


@dataclass(frozen=True, slots=True)
class InDoubtLimits:
    enabled: bool = True
    # How long an unanswered EndTxn holds its transactional id's next transaction, at most. A broker
    # that has the request processes it within its own request handling (seconds); a paused broker
    # may take longer. Kafka's default transaction timeout (60 s) is the horizon old clients live with.
    max_ms: int = 60_000
    # How long one held request waits before it is answered CONCURRENT_TRANSACTIONS (and retried by the
    # client, then held again). Short: the client's own request timeout is rarely known here (a Produce
    # TimeoutMs is learned only when a write was asked about), and a client that times out a held request
    # closes its connection and sends it again elsewhere; a retriable answer every second keeps it calm.
    hold_ms: int = 1_000


@dataclass(eq=False, slots=True)
class PythonSentEndTxn:
    """One forwarded EndTxn (the token its connection keeps until the answer)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    connection_id: int
    sent_ms: int
    orphaned_ms: int | None = None   # its connection closed with it unanswered
    sent_mark: int = 0               # the ledger's sequence at send time
    orphaned_mark: int | None = None  # ... and when its connection closed


@dataclass
class PythonEndTxnLedger:
    """Every forwarded EndTxn still unanswered, by transactional id (bounded: answers and `max_ms`)."""

    limits: InDoubtLimits = field(default_factory=InDoubtLimits)
    # Told when a transactional id has one EndTxn fewer in doubt, and how (the shell wakes its holds).
    on_change: Callable[[str, Ending], None] | None = None
    _open: dict[str, list[PythonSentEndTxn]] = field(default_factory=dict)
    endings: dict[Ending, int] = field(default_factory=lambda: dict.fromkeys(Ending, 0))
    _marks: int = 0

    def mark(self) -> int:
        """A point in this ledger's order of events (before a question to the coordinator is sent)."""
        self._marks += 1
        return self._marks

    def __len__(self) -> int:
        return sum(len(v) for v in self._open.values())

    def sent(self, txn_id: str, producer_id: int, epoch: int, committed: bool, connection_id: int,
             now_ms: int) -> PythonSentEndTxn:
        s = PythonSentEndTxn(txn_id, producer_id, epoch, committed, connection_id, now_ms, sent_mark=self.mark())
        self._open.setdefault(txn_id, []).append(s)
        return s

    def answered(self, s: PythonSentEndTxn) -> None:
        self._end(s, _ANSWERED)
        self.answered_after(s.transactional_id, s.producer_id, s.producer_epoch, s.sent_mark)

    def orphaned(self, s: PythonSentEndTxn, now_ms: int) -> None:
        """Its connection closed unanswered: it stays in doubt (the broker may have read it)."""
        if s.orphaned_ms is None:
            s.orphaned_ms = now_ms
            s.orphaned_mark = self.mark()

    def answered_after(self, txn_id: str, producer_id: int, epoch: int, mark: int) -> int:
        """The coordinator answered a request sent at `mark`: EndTxns of this producer orphaned before
        that can no longer land (read before the close: handled first; never read: gone)."""
        done = [s for s in self._open.get(txn_id, ()) if s.orphaned_mark is not None and s.orphaned_mark < mark
                and (s.producer_id, s.producer_epoch) == (producer_id, epoch)]
        for s in done:
            self._end(s, Ending.CLOSED)
        return len(done)

    def fenced(self, txn_id: str, producer_id: int, epoch: int) -> int:
        """The producer is now (producer_id, epoch): an EndTxn of another identity can only be refused."""
        stale = [s for s in self._open.get(txn_id, ()) if (s.producer_id, s.producer_epoch) != (producer_id, epoch)]
        for s in stale:
            self._end(s, Ending.FENCED)
        return len(stale)

    def blocking(self, txn_id: str, producer_id: int, epoch: int, connection_id: int,
                 now_ms: int) -> PythonSentEndTxn | None:
        """The earliest EndTxn in doubt that could land in a transaction (producer_id, epoch) is about to open."""
        for s in self._open.get(txn_id, ()):
            if (s.producer_id, s.producer_epoch) != (producer_id, epoch):
                continue  # another producer identity: the coordinator refuses one of the two
            if s.connection_id == connection_id and s.orphaned_ms is None:
                continue  # same broker connection, still open: answered before the request behind it
            if now_ms - s.sent_ms >= self.limits.max_ms:
                continue  # given up (expire() ends it and says so)
            return s
        return None

    def in_doubt(self, txn_id: str) -> list[PythonSentEndTxn]:
        return list(self._open.get(txn_id, ()))

    def expire(self, now_ms: int) -> list[PythonSentEndTxn]:
        """EndTxns unanswered for max_ms: no longer held for; returned so the shell can say so."""
        gone = [s for ss in self._open.values() for s in ss if now_ms - s.sent_ms >= self.limits.max_ms]
        for s in gone:
            self._end(s, Ending.EXPIRED)
        return gone

    def _end(self, s: PythonSentEndTxn, ending: Ending) -> None:
        ss = self._open.get(s.transactional_id)
        if ss is None or s not in ss:
            return
        ss.remove(s)
        if not ss:
            del self._open[s.transactional_id]
        self.endings[ending] += 1
        if self.on_change is not None:
            self.on_change(s.transactional_id, ending)


if native.AVAILABLE:
    from txnguard._native import EndTxnLedgerCore
    from txnguard._native import SentEndTxn as NativeSentEndTxn

    _ENDINGS = (Ending.ANSWERED, Ending.FENCED, Ending.CLOSED, Ending.EXPIRED)  # by native/src/in_doubt.rs's order

    class NativeEndTxnLedger(EndTxnLedgerCore):
        """The ledger in Rust (native/src/in_doubt.rs), with `PythonEndTxnLedger`'s methods and answers: an
        EndTxn, its answer and a request's question of it are one call each. Its `SentEndTxn` objects are the
        native module's, with the same fields."""

        limits: InDoubtLimits

        def __new__(cls, limits: InDoubtLimits | None = None,
                    on_change: Callable[[str, Ending], None] | None = None) -> NativeEndTxnLedger:
            limits = limits or InDoubtLimits()
            self = super().__new__(cls, limits.max_ms, on_change, _ENDINGS)
            self.limits = limits
            return self

        @property
        def endings(self) -> dict[Ending, int]:
            """How many EndTxns stopped being in doubt, by how (read when /metrics is)."""
            return dict(zip(_ENDINGS, self.ending_counts(), strict=True))


# The ledger this install runs, and the token it hands out: the native ones where the module is there. mypy sees
# the Python ones' interfaces, which the native ones keep (tests/property/test_native_in_doubt.py).
if TYPE_CHECKING:
    EndTxnLedger = PythonEndTxnLedger
    SentEndTxn = PythonSentEndTxn
elif native.AVAILABLE:
    EndTxnLedger, SentEndTxn = NativeEndTxnLedger, NativeSentEndTxn
else:
    EndTxnLedger, SentEndTxn = PythonEndTxnLedger, PythonSentEndTxn

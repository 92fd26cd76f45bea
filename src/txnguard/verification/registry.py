"""The transaction registry: what this proxy has seen of each transactional id.

Pure: time arrives as `now_ms` in every call. Bounded: idle ids expire and the
least recently seen id is evicted beyond `max_entries`.

Each transactional id moves through a small state machine (the table below).
A *generation* counts transactions of one id: old clients keep their producer
epoch from one transaction to the next, so (producer id, epoch) alone cannot
tell an old transaction's evidence from the new one's. Evidence belongs to a
generation and ends with it.

Two kinds of evidence, kept apart because they age differently:
- *observed*: an AddPartitionsToTxn/AddOffsetsToTxn this process forwarded and saw
  accepted. It lasts until the EndTxn this process forwards (a gateway), or
  `evidence_ttl_ms` (a sidecar, which may not see the EndTxn).
- *given*: a coordinator's answer ("Ongoing, these partitions"). The transaction may
  end a moment later through another proxy, so it is bounded in every mode.

Nothing here decides on a value it never observed: a transaction's timeout is known
only from an InitProducerId or a coordinator's answer, and the end of a transaction
inferred from that timeout on this clock only drops evidence (the coordinator is asked
next); it never refuses a write. A refusal on local evidence alone (a late write)
needs an EndTxn this process forwarded.

Two implementations of one table: `NativeRegistry` (the state in Rust, native/src/registry.rs) where the native
module is built, `PythonRegistry` where it is not; the property test that runs both over generated histories
keeps them one (tests/property/test_native_registry.py). `Registry` is the one this install runs.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txnguard.codecs import native
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.verification.bypass import SeenIds
from txnguard.verification.timeouts import OVERDUE_SLACK_MS, Candidate
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed


class Phase(enum.Enum):
    EMPTY = "empty"        # InitProducerId answered; no partition added yet
    ONGOING = "ongoing"    # at least one AddPartitionsToTxn/AddOffsetsToTxn succeeded
    ENDED = "ended"        # EndTxn forwarded by this process: a write with no add since is late
    TIMED_OUT = "timed_out"  # past the timeout it observed: evidence gone, the coordinator decides

    __hash__ = object.__hash__  # identity, as equality is: Enum's own is a Python call, and these key hot dicts


class Event(enum.Enum):
    INIT = "init_producer_id"
    ADD = "added"
    END = "end_txn"
    TIMEOUT = "transaction_timeout"

    __hash__ = object.__hash__  # identity, as equality is: Enum's own is a Python call, and these key hot dicts


@dataclass(frozen=True)
class Step:
    phase: Phase
    new_generation: bool  # forget partitions and groups; the next transaction starts


# (phase, event) -> step. Anything missing keeps the phase.
TRANSITIONS: dict[tuple[Phase, Event], Step] = {
    (Phase.EMPTY, Event.INIT): Step(Phase.EMPTY, True),
    (Phase.EMPTY, Event.ADD): Step(Phase.ONGOING, False),
    (Phase.EMPTY, Event.END): Step(Phase.ENDED, True),
    (Phase.ONGOING, Event.INIT): Step(Phase.EMPTY, True),
    (Phase.ONGOING, Event.ADD): Step(Phase.ONGOING, False),
    (Phase.ONGOING, Event.END): Step(Phase.ENDED, True),
    (Phase.ONGOING, Event.TIMEOUT): Step(Phase.TIMED_OUT, True),
    (Phase.ENDED, Event.INIT): Step(Phase.EMPTY, True),
    (Phase.ENDED, Event.ADD): Step(Phase.ONGOING, False),  # END already cleared the old generation
    (Phase.ENDED, Event.END): Step(Phase.ENDED, False),
    (Phase.TIMED_OUT, Event.INIT): Step(Phase.EMPTY, True),
    (Phase.TIMED_OUT, Event.ADD): Step(Phase.ONGOING, False),  # TIMEOUT already cleared the old generation
    (Phase.TIMED_OUT, Event.END): Step(Phase.ENDED, False),
}


# Module globals for the hot paths: an Enum member read through its class is a descriptor call (160 ns on 3.11).
_ONGOING, _ENDED = Phase.ONGOING, Phase.ENDED
_INIT, _ADD, _END, _TIMEOUT = Event.INIT, Event.ADD, Event.END, Event.TIMEOUT


@dataclass
class TxnRecord:
    transactional_id: str
    producer_id: int = -1
    producer_epoch: int = -1
    # The transaction timeout, as an InitProducerId or a coordinator's answer said; None: never observed
    # (an id first seen in an AddPartitionsToTxn: a restart, another gateway). No default stands in for it.
    timeout_ms: int | None = None
    phase: Phase = Phase.EMPTY
    generation: int = 0
    partitions: set[TopicPartition] = field(default_factory=set)  # observed: adds this process forwarded
    groups: set[str] = field(default_factory=set)
    started_ms: int | None = None   # first add of the current generation
    last_seen_ms: int = 0           # anything about the id, passed writes included: idle expiry counts from here
    observed_ms: int = 0            # the last life-cycle request or answer this process saw: observed evidence's age
    # Given evidence: the coordinator's answer (start time it reported, its partitions, when we asked).
    described: set[TopicPartition] = field(default_factory=set)
    coordinator_start_ms: int | None = None
    coordinator_seen_ms: int | None = None
    request_timeout_ms: int | None = None  # the TimeoutMs of this id's last checked Produce
    # The transaction the registry ended because it outlived its timeout (Event.TIMEOUT), kept
    # until anything else happens to the id: the coordinator may have aborted it (timeouts.py).
    timed_out: Candidate | None = None
    ended_ms: int | None = None  # when the phase became ENDED (an EndTxn seen, or the timeout inferred)

    def apply(self, event: Event, now_ms: int) -> None:
        step = TRANSITIONS.get((self.phase, event))
        if step is None:  # not built beforehand: a found step is the common case
            step = Step(self.phase, False)
        self.timed_out = None
        if step.phase is _ENDED and self.phase is not _ENDED:
            self.ended_ms = now_ms
        if event is _TIMEOUT and self.phase is _ONGOING and self.started_ms is not None:
            self.timed_out = Candidate(self.producer_id, self.producer_epoch, self.started_ms)
        if step.new_generation:
            self.generation += 1
            self.partitions.clear()
            self.groups.clear()
            self.described.clear()
            self.started_ms = None
            self.coordinator_start_ms = None
            self.coordinator_seen_ms = None
        if step.phase is _ONGOING and self.started_ms is None:
            self.started_ms = now_ms
        self.phase = step.phase
        self.last_seen_ms = now_ms
        if event is not _TIMEOUT:
            self.observed_ms = now_ms


@dataclass(frozen=True)
class RegistryLimits:
    max_entries: int = 100_000
    idle_expiry_ms: int = 15 * 60 * 1000
    # How long observed evidence not backed by an observed EndTxn may be trusted. A gateway sees
    # a client's whole life cycle and trusts it until EndTxn (None). A sidecar does not
    # see EndTxn for partitions led elsewhere, so its evidence must expire quickly.
    # Given evidence (a coordinator's answer) is trusted for this long in every mode, 0 when None:
    # the transaction may have ended through another proxy since, and nothing here would know.
    evidence_ttl_ms: int | None = None

    @property
    def given_ttl_ms(self) -> int:
        return self.evidence_ttl_ms or 0


# Verdicts are immutable: the hot path hands out these two instead of building one per partition.
_PASSED_LOCALLY = passed(Evidence.LOCAL, "added to the ongoing transaction (observed)")
_PASSED_FROM_CACHE = passed(Evidence.CACHE, "in the ongoing transaction (the coordinator said so)")
_LATE_WRITE = Verdict(Outcome.LATE_WRITE, Evidence.LOCAL, "EndTxn was sent and no AddPartitionsToTxn followed")


def _fenced(epoch: int, known: int) -> Verdict:
    return Verdict(Outcome.FENCED, Evidence.LOCAL, f"epoch {epoch} is older than {known} from InitProducerId")


class PythonRegistry:
    """The registry in Python: where the native module is missing (`Registry` is then this class), and the oracle
    the native one (`NativeRegistry`) is tested against over generated histories."""

    def __init__(self, limits: RegistryLimits | None = None) -> None:
        self.limits = limits or RegistryLimits()
        self._records: OrderedDict[str, TxnRecord] = OrderedDict()
        # Every id this proxy saw, kept past idle expiry and eviction (verification/bypass.py): told when an entry is
        # created and when one goes, so its order follows the registry's (no work per request beyond those).
        self.seen: SeenIds | None = None

    def __len__(self) -> int:
        return len(self._records)

    def get(self, transactional_id: str) -> TxnRecord | None:
        return self._records.get(transactional_id)

    def _touch(self, transactional_id: str, now_ms: int) -> TxnRecord:
        rec = self._records.get(transactional_id)
        if rec is None:
            rec = TxnRecord(transactional_id, last_seen_ms=now_ms, observed_ms=now_ms)
            self._records[transactional_id] = rec
            if self.seen is not None:
                self.seen.see(transactional_id)
            while len(self._records) > self.limits.max_entries:
                evicted, _ = self._records.popitem(last=False)
                if self.seen is not None:
                    self.seen.see(evicted)  # seen until now: its place in the seen order moves up
        else:
            self._records.move_to_end(transactional_id)
        rec.last_seen_ms = now_ms
        return rec

    # -- what the proxy observed ---------------------------------------------------------------

    def init_producer_id(self, txn_id: str, producer_id: int, epoch: int, timeout_ms: int, now_ms: int) -> None:
        rec = self._touch(txn_id, now_ms)
        rec.apply(_INIT, now_ms)
        rec.producer_id, rec.producer_epoch, rec.timeout_ms = producer_id, epoch, timeout_ms

    def added(self, txn_id: str, producer_id: int, epoch: int, now_ms: int, *,
              partitions: Iterable[TopicPartition] = (), group: str | None = None) -> None:
        """A successful AddPartitionsToTxn (the partitions that succeeded) or AddOffsetsToTxn (the group)."""
        rec = self._touch(txn_id, now_ms)
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch):
            # A producer we did not see initialise (another proxy, or a proxy restart):
            # the coordinator accepted the add, so this is its current identity. Its timeout is not known.
            rec.apply(_INIT, now_ms)
            rec.producer_id, rec.producer_epoch, rec.timeout_ms = producer_id, epoch, None
        rec.apply(_ADD, now_ms)
        rec.partitions.update(partitions)
        if group is not None:
            rec.groups.add(group)

    def request_timeout(self, txn_id: str, timeout_ms: int) -> None:
        """Remember the client's request timeout (a Produce's TimeoutMs) for an id already known;
        an unknown id gets no entry for it (the registry holds transactions, not every client)."""
        rec = self._records.get(txn_id)
        if rec is not None:
            rec.request_timeout_ms = timeout_ms

    def end_txn(self, txn_id: str, producer_id: int, epoch: int, now_ms: int) -> None:
        rec = self._touch(txn_id, now_ms)
        if (rec.producer_id, rec.producer_epoch) == (producer_id, epoch) or rec.producer_id < 0:
            rec.producer_id, rec.producer_epoch = producer_id, epoch
            rec.apply(_END, now_ms)

    def coordinator_says_ongoing(self, txn_id: str, producer_id: int, epoch: int, start_ms: int,
                                 partitions: set[TopicPartition], groups_partitions: set[TopicPartition],
                                 now_ms: int, timeout_ms: int | None = None) -> None:
        """Remember a coordinator answer "Ongoing, these partitions" as evidence of one generation (and the
        transaction's timeout it reports: an id whose InitProducerId went elsewhere is not 60 s by default)."""
        rec = self._touch(txn_id, now_ms)
        observed_ms = rec.observed_ms  # an answer given is not observed evidence: its age stays
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch):
            rec.apply(_INIT, now_ms)  # a different producer than the one we knew
            rec.producer_id, rec.producer_epoch, rec.timeout_ms = producer_id, epoch, None
        elif rec.coordinator_start_ms is not None and rec.coordinator_start_ms != start_ms:
            rec.apply(_INIT, now_ms)  # a different transaction than the one we knew
        rec.apply(_ADD, now_ms)
        rec.observed_ms = observed_ms
        rec.described = partitions | groups_partitions
        rec.coordinator_start_ms = start_ms
        rec.coordinator_seen_ms = now_ms
        if timeout_ms is not None and timeout_ms > 0:
            rec.timeout_ms = timeout_ms

    def expire(self, now_ms: int) -> int:
        """Drop idle ids and drop the evidence of transactions past the timeout this proxy observed; returns
        how many ids were dropped. Neither refuses anything later: an id not known, or known timed out, is asked."""
        dropped = 0
        for txn_id in list(self._records):
            rec = self._records[txn_id]
            if now_ms - rec.last_seen_ms > self.limits.idle_expiry_ms:
                del self._records[txn_id]
                dropped += 1
                if self.seen is not None:
                    self.seen.see(txn_id)  # seen until it went idle: its place in the seen order moves up
            elif rec.phase is _ONGOING and rec.started_ms is not None and rec.timeout_ms is not None \
                    and now_ms - rec.started_ms > rec.timeout_ms:
                # The coordinator aborts it (or is about to): whatever we knew is no longer evidence. Our clock
                # and our start differ from the coordinator's, so this ends nothing: the coordinator is asked next.
                rec.apply(_TIMEOUT, now_ms)
        return dropped

    def timeout_candidate(self, txn_id: str, producer_id: int, epoch: int, now_ms: int) -> Candidate | None:
        """The transaction of (producer_id, epoch) this proxy saw ongoing, with no EndTxn since, that
        is past (or about at) its timeout: the coordinator may have aborted it (timeouts.py).
        Only a registry that keeps evidence until EndTxn (a gateway's) can say so."""
        rec = self._records.get(txn_id)
        if rec is None or self.limits.evidence_ttl_ms is not None:
            return None
        if rec.timed_out is not None:
            hit = rec.timed_out
            return hit if (hit.producer_id, hit.epoch) == (producer_id, epoch) else None
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) or rec.phase is not _ONGOING \
                or rec.started_ms is None or rec.timeout_ms is None:
            return None
        if now_ms - rec.started_ms < rec.timeout_ms - OVERDUE_SLACK_MS:
            return None
        return Candidate(producer_id, epoch, rec.started_ms)

    # -- what the proxy can decide alone ---------------------------------------------------------

    def local_verdict(self, txn_id: str, producer_id: int, epoch: int, tp: TopicPartition,
                      now_ms: int, group: str | None = None) -> Verdict | None:
        """A verdict from observed traffic, or None when someone must be asked.

        `tp` is the partition written to; for TxnOffsetCommit it is the group's
        __consumer_offsets partition and `group` the group id.
        """
        rec = self._records.get(txn_id)
        if rec is None or rec.producer_id != producer_id:
            return None
        if epoch < rec.producer_epoch:
            return _fenced(epoch, rec.producer_epoch)
        if epoch != rec.producer_epoch:
            return None
        if rec.phase is _ENDED:
            # A registry that sees only part of a client's traffic (a sidecar; evidence_ttl_ms set) may have
            # missed the next transaction's AddPartitionsToTxn (sent to a coordinator elsewhere, or after a
            # coordinator moved): "ended" is as stale there as "ongoing" is, and past the bound the coordinator
            # decides. A rejection on stale evidence would refuse a legitimate write (INVALID_TXN_STATE) to a
            # client that did nothing wrong.
            if not self._within_ttl(rec.ended_ms, now_ms):  # without a TTL (a gateway), ENDED holds until an add
                return None
            return _LATE_WRITE
        if rec.phase is not _ONGOING:
            return None
        if (tp in rec.partitions or (group is not None and group in rec.groups)) \
                and self._within_ttl(rec.observed_ms, now_ms):
            self._seen(rec, now_ms)
            return _PASSED_LOCALLY
        if tp in rec.described and rec.coordinator_seen_ms is not None \
                and now_ms - rec.coordinator_seen_ms < self.limits.given_ttl_ms:
            self._seen(rec, now_ms)
            return _PASSED_FROM_CACHE
        return None

    def passes_locally(self, txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition],
                       now_ms: int) -> Verdict | None:
        """The verdict `local_verdict` gives every partition of `tps` when each of them passes (one verdict
        for all: they share the transaction's record), else None (the general path decides).

        The relay's fast path asks this once per transactional Produce: one record lookup, then one set
        lookup per partition."""
        rec = self._records.get(txn_id)
        if rec is None or rec.producer_id != producer_id or rec.producer_epoch != epoch \
                or rec.phase is not _ONGOING or not self._within_ttl(rec.observed_ms, now_ms):
            return None
        partitions = rec.partitions
        for tp in tps:
            if tp not in partitions:
                return None  # not observed here (maybe given by the coordinator): local_verdict decides
        self._seen(rec, now_ms)
        return _PASSED_LOCALLY

    def _seen(self, rec: TxnRecord, now_ms: int) -> None:
        """A passed write keeps its id alive: idle expiry and eviction count from the last write too."""
        rec.last_seen_ms = now_ms
        self._records.move_to_end(rec.transactional_id)

    def _within_ttl(self, seen_ms: int | None, now_ms: int) -> bool:
        """Observed evidence from `seen_ms` still stands: always without a TTL, else strictly within it (0: never)."""
        ttl = self.limits.evidence_ttl_ms
        if ttl is None:
            return True
        return seen_ms is not None and now_ms - seen_ms < ttl


_PHASES = {phase.value: phase for phase in Phase}


def _snapshot(txn_id: str, fields: tuple[Any, ...]) -> TxnRecord:
    """A native record as a `TxnRecord` (a copy: changing it changes nothing in the registry)."""
    (pid, epoch, timeout_ms, phase, generation, partitions, groups, started_ms, last_seen_ms, observed_ms,
     described, coordinator_start_ms, coordinator_seen_ms, request_timeout_ms, timed_out, ended_ms) = fields
    return TxnRecord(txn_id, pid, epoch, timeout_ms, _PHASES[phase], generation, partitions, groups, started_ms,
                     last_seen_ms, observed_ms, described, coordinator_start_ms, coordinator_seen_ms,
                     request_timeout_ms, None if timed_out is None else Candidate(*timed_out), ended_ms)


if native.AVAILABLE:
    from txnguard._native import RegistryCore

    class NativeRegistry(RegistryCore):
        """The registry in Rust (native/src/registry.rs), with `PythonRegistry`'s methods and answers: a question
        per write is one call that reads its arguments where they lie and returns a shared verdict. `get` gives a
        copy of the record."""

        _limits: RegistryLimits

        def __new__(cls, limits: RegistryLimits | None = None) -> NativeRegistry:
            limits = limits or RegistryLimits()
            self = super().__new__(cls, limits.max_entries, limits.idle_expiry_ms, limits.evidence_ttl_ms,
                                   OVERDUE_SLACK_MS, _PASSED_LOCALLY, _PASSED_FROM_CACHE, _LATE_WRITE, _fenced,
                                   Candidate)
            self._limits = limits
            return self

        @property
        def limits(self) -> RegistryLimits:
            return self._limits

        @limits.setter
        def limits(self, limits: RegistryLimits) -> None:
            self._limits = limits
            self.set_limits(limits.max_entries, limits.idle_expiry_ms, limits.evidence_ttl_ms, OVERDUE_SLACK_MS)

        def get(self, transactional_id: str) -> TxnRecord | None:
            fields = self.record(transactional_id)
            return None if fields is None else _snapshot(transactional_id, fields)


# The registry this install runs: the native one where the module is there. mypy sees the Python one's interface,
# which the native one keeps (tests/property/test_native_registry.py runs both over the same histories).
if TYPE_CHECKING:
    Registry = PythonRegistry
else:
    Registry = NativeRegistry if native.AVAILABLE else PythonRegistry

"""The transaction registry: what this proxy has seen of each transactional id.

Pure: time arrives as `now_ms` in every call. Bounded: idle ids expire and the
least recently seen id is evicted beyond `max_entries`.

Each transactional id moves through a small state machine (the table below).
A *generation* counts transactions of one id: old clients keep their producer
epoch from one transaction to the next, so (producer id, epoch) alone cannot
tell an old transaction's evidence from the new one's. Evidence belongs to a
generation and ends with it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from txnguard.verification.outcomes import Evidence, Outcome, Verdict, passed
from txnguard.verification.timeouts import OVERDUE_SLACK_MS, Candidate

TopicPartition = tuple[str, int]


class Phase(enum.Enum):
    EMPTY = "empty"        # InitProducerId answered; no partition added yet
    ONGOING = "ongoing"    # at least one AddPartitionsToTxn/AddOffsetsToTxn succeeded
    ENDED = "ended"        # EndTxn sent: the transaction's evidence is over


class Event(enum.Enum):
    INIT = "init_producer_id"
    ADD = "added"
    END = "end_txn"
    TIMEOUT = "transaction_timeout"


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
    (Phase.ONGOING, Event.TIMEOUT): Step(Phase.ENDED, True),
    (Phase.ENDED, Event.INIT): Step(Phase.EMPTY, True),
    (Phase.ENDED, Event.ADD): Step(Phase.ONGOING, False),  # END already cleared the old generation
    (Phase.ENDED, Event.END): Step(Phase.ENDED, False),
}


@dataclass
class TxnRecord:
    transactional_id: str
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 60000
    phase: Phase = Phase.EMPTY
    generation: int = 0
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    started_ms: int | None = None   # first add of the current generation
    last_seen_ms: int = 0
    # Coordinator evidence: (start time the coordinator reported, partitions, when we asked).
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
        if step.phase is Phase.ENDED and self.phase is not Phase.ENDED:
            self.ended_ms = now_ms
        if event is Event.TIMEOUT and self.phase is Phase.ONGOING and self.started_ms is not None:
            self.timed_out = Candidate(self.producer_id, self.producer_epoch, self.started_ms)
        if step.new_generation:
            self.generation += 1
            self.partitions.clear()
            self.groups.clear()
            self.started_ms = None
            self.coordinator_start_ms = None
            self.coordinator_seen_ms = None
        if step.phase is Phase.ONGOING and self.started_ms is None:
            self.started_ms = now_ms
        self.phase = step.phase
        self.last_seen_ms = now_ms


@dataclass(frozen=True)
class RegistryLimits:
    max_entries: int = 100_000
    idle_expiry_ms: int = 15 * 60 * 1000
    # How long evidence not backed by an observed EndTxn may be trusted. A gateway sees
    # a client's whole life cycle and trusts it until EndTxn (None). A sidecar does not
    # see EndTxn for partitions led elsewhere, so its evidence must expire quickly.
    evidence_ttl_ms: int | None = None


# Verdicts are immutable: the hot path hands out these two instead of building one per partition.
_PASSED_LOCALLY = passed(Evidence.LOCAL, "added to the ongoing transaction (observed)")
_PASSED_FROM_CACHE = passed(Evidence.CACHE, "in the ongoing transaction (the coordinator said so)")


class Registry:
    def __init__(self, limits: RegistryLimits | None = None) -> None:
        self.limits = limits or RegistryLimits()
        self._records: OrderedDict[str, TxnRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, transactional_id: str) -> TxnRecord | None:
        return self._records.get(transactional_id)

    def _touch(self, transactional_id: str, now_ms: int) -> TxnRecord:
        rec = self._records.get(transactional_id)
        if rec is None:
            rec = TxnRecord(transactional_id, last_seen_ms=now_ms)
            self._records[transactional_id] = rec
            while len(self._records) > self.limits.max_entries:
                self._records.popitem(last=False)
        else:
            self._records.move_to_end(transactional_id)
        rec.last_seen_ms = now_ms
        return rec

    # -- what the proxy observed ---------------------------------------------------------------

    def init_producer_id(self, txn_id: str, producer_id: int, epoch: int, timeout_ms: int, now_ms: int) -> None:
        rec = self._touch(txn_id, now_ms)
        rec.apply(Event.INIT, now_ms)
        rec.producer_id, rec.producer_epoch, rec.timeout_ms = producer_id, epoch, timeout_ms

    def added(self, txn_id: str, producer_id: int, epoch: int, now_ms: int, *,
              partitions: Iterable[TopicPartition] = (), group: str | None = None) -> None:
        """A successful AddPartitionsToTxn (the partitions that succeeded) or AddOffsetsToTxn (the group)."""
        rec = self._touch(txn_id, now_ms)
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch):
            # A producer we did not see initialise (another proxy, or a proxy restart):
            # the coordinator accepted the add, so this is its current identity.
            rec.apply(Event.INIT, now_ms)
            rec.producer_id, rec.producer_epoch = producer_id, epoch
        rec.apply(Event.ADD, now_ms)
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
            rec.apply(Event.END, now_ms)

    def coordinator_says_ongoing(self, txn_id: str, producer_id: int, epoch: int, start_ms: int,
                                 partitions: set[TopicPartition], groups_partitions: set[TopicPartition],
                                 now_ms: int, timeout_ms: int | None = None) -> None:
        """Remember a coordinator answer "Ongoing, these partitions" as evidence of one generation (and the
        transaction's timeout it reports: an id whose InitProducerId went elsewhere is not 60 s by default)."""
        rec = self._touch(txn_id, now_ms)
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) or (
            rec.coordinator_start_ms is not None and rec.coordinator_start_ms != start_ms
        ):
            rec.apply(Event.INIT, now_ms)  # a different transaction than the one we knew
            rec.producer_id, rec.producer_epoch = producer_id, epoch
        rec.apply(Event.ADD, now_ms)
        rec.partitions.update(partitions | groups_partitions)
        rec.coordinator_start_ms = start_ms
        rec.coordinator_seen_ms = now_ms
        if timeout_ms is not None and timeout_ms > 0:
            rec.timeout_ms = timeout_ms

    def expire(self, now_ms: int) -> int:
        """Drop idle ids and end transactions past their timeout; returns how many ids were dropped."""
        dropped = 0
        for txn_id in list(self._records):
            rec = self._records[txn_id]
            if now_ms - rec.last_seen_ms > self.limits.idle_expiry_ms:
                del self._records[txn_id]
                dropped += 1
            elif rec.phase is Phase.ONGOING and rec.started_ms is not None \
                    and now_ms - rec.started_ms > rec.timeout_ms:
                # The coordinator aborts it; whatever we knew is no longer evidence.
                rec.apply(Event.TIMEOUT, now_ms)
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
        if (rec.producer_id, rec.producer_epoch) != (producer_id, epoch) or rec.phase is not Phase.ONGOING \
                or rec.started_ms is None:
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
            return Verdict(Outcome.FENCED, Evidence.LOCAL,
                           f"epoch {epoch} is older than {rec.producer_epoch} from InitProducerId")
        if epoch != rec.producer_epoch:
            return None
        if rec.phase is Phase.ENDED:
            # A registry that sees only part of a client's traffic (a sidecar; evidence_ttl_ms set) may have
            # missed the next transaction's AddPartitionsToTxn (sent to a coordinator elsewhere, or after a
            # coordinator moved), and it infers a timeout from its own clock: "ended" is as stale there as
            # "ongoing" is, and past the bound the coordinator decides. A rejection on stale evidence would
            # refuse a legitimate write (INVALID_TXN_STATE) to a client that did nothing wrong.
            if not self._within_ttl(rec.ended_ms, now_ms):  # without a TTL (a gateway), ENDED holds until an add
                return None
            return Verdict(Outcome.LATE_WRITE, Evidence.LOCAL,
                           "EndTxn was sent and no AddPartitionsToTxn followed")
        added = tp in rec.partitions or (group is not None and group in rec.groups)
        if rec.phase is Phase.ONGOING and added and self._fresh(rec, now_ms):
            return _PASSED_FROM_CACHE if rec.coordinator_seen_ms is not None else _PASSED_LOCALLY
        return None

    def passes_locally(self, txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition],
                       now_ms: int) -> Verdict | None:
        """The verdict `local_verdict` gives every partition of `tps` when each of them passes (one verdict
        for all: they share the transaction's record), else None (the general path decides).

        The relay's fast path asks this once per transactional Produce: one record lookup, then one set
        lookup per partition."""
        rec = self._records.get(txn_id)
        if rec is None or rec.producer_id != producer_id or rec.producer_epoch != epoch \
                or rec.phase is not Phase.ONGOING or not self._fresh(rec, now_ms):
            return None
        partitions = rec.partitions
        for tp in tps:
            if tp not in partitions:
                return None
        return _PASSED_FROM_CACHE if rec.coordinator_seen_ms is not None else _PASSED_LOCALLY

    def _fresh(self, rec: TxnRecord, now_ms: int) -> bool:
        return self._within_ttl(rec.coordinator_seen_ms if rec.coordinator_seen_ms is not None else rec.last_seen_ms,
                                now_ms)

    def _within_ttl(self, seen_ms: int | None, now_ms: int) -> bool:
        """Evidence from `seen_ms` still stands: always without a TTL, else strictly within it (0: never)."""
        ttl = self.limits.evidence_ttl_ms
        if ttl is None:
            return True
        return seen_ms is not None and now_ms - seen_ms < ttl

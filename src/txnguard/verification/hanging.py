"""Hanging transactions: which partitions hold one, judged as `kafka-transactions.sh find-hanging` judges,
after the threshold it uses (`MaxTimeout`) or after each transaction's own timeout (`OwnTimeout`).

Pure (no IO, no clock: every time is passed in). The IO half (proxy/hanging_io.py) asks the brokers
and feeds the answers to a `HangingScan`, which says what to ask next:

1. `AskProducers`: DescribeProducers for the partitions, in batches of 500 (the tool's
   MAX_BATCH_SIZE). An *open transaction* is an active producer whose current transaction start offset
   is present (>= 0); its age is `now - lastTimestamp`, `now` when the batch's answer arrived. A
   *candidate* is an open transaction older than the rule's floor: the maximum transaction timeout
   (`MaxTimeout`, the tool's `transactionDurationMs > maxTransactionTimeoutMs`), or the margin
   (`OwnTimeout`: no transaction's own timeout is shorter than 1 ms, so nothing younger can qualify).
2. `AskTransactionalIds`: ListTransactions (every broker) filtered to the candidates' producer
   ids, mapping producer id -> transactional id (listings of other producer ids are ignored).
3. `AskDescriptions`: DescribeTransactions of those transactional ids; TRANSACTIONAL_ID_NOT_FOUND
   is "no description" (None).
4. A candidate hangs if its producer id has no transactional id, or that id has no description, or
   the description's partitions do not contain the candidate's partition (the coordinator lists the
   partitions of an ongoing transaction and, in PrepareCommit/PrepareAbort, those whose marker is not
   written yet: a partition among them still gets its marker, however long it waits). The
   description's producer id, epoch and state are not compared, as the tool does not compare them.
   `MaxTimeout` ends here (`Done`): the tool's answer exactly.
5. `OwnTimeout` also needs the candidate older than its own transaction's timeout (the description's
   transactionTimeoutMs) plus the margin, and then asks once more (`AskProducersAgain`): a finding
   stands only if DescribeProducers, answered after the coordinator's answer, still shows the same
   producer's open transaction at the same start offset. Without that second look, a marker written
   between the two answers (the coordinator drops a partition from a PrepareCommit/PrepareAbort list
   only once its marker is written) would read as a partition the coordinator does not list.

Without ListTransactions (Kafka 2.8), `transaction_log_answered` takes steps 2 and 3 from the coordinator's own
log, `__transaction_state`, read to its end once DescribeProducers answered (the IO half reads it; the pure
TransactionLogView holds each id's latest state, `producers_in_log` maps producer ids to it): each candidate whose
producer id the log holds is judged by step 4 (and 5) exactly as from a DescribeTransactions answer, reason
CONFIRMED_BY_LOG; one the log does not hold, or every candidate when the log may not be read, is UNCONFIRMED.

Why the own timeout is enough. A coordinator aborts an ongoing transaction once it is older than its
own transactionTimeoutMs (measured from the transaction's start, checked every
transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default), fencing its producer
epoch. A write on the partition that is older than timeout + margin therefore belongs to a transaction
that has ended, or is being aborted, or was never told about the partition; while the partition is
listed, its marker is still coming and nothing is reported. Without a description (no transactional id,
or the id not found, or no ListTransactions at all) the transaction's timeout is unknown:
`OwnTimeout.unknown_ms` applies, the cluster's transaction.max.timeout.ms (no transaction may ask for
longer). The ages are the tool's: `lastTimestamp` is the batch's max timestamp
(the producer's clock for CreateTime topics), so a producer whose clock runs behind looks older; the
coordinator's answer and the second look still have to agree before anything is reported.

Source: TransactionsCommand.FindHangingTransactionsCommand and the admin client's DescribeProducers
/ListTransactions/DescribeTransactions handlers, Kafka 3.5.2 (unchanged in 4.x); the coordinator's
timeout abort: TransactionStateManager.timedOutTransactions and the coordinator's cleanup interval.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.verification.transaction_log_view import TransactionLogView

MAX_BATCH_SIZE = 500                   # partitions per DescribeProducers request (the tool's)
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15  # the tool's --max-transaction-timeout default
MINUTE_MS = 60_000
# Past a transaction's own timeout: the coordinator's check for timed-out transactions runs every
# transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s by default).
DEFAULT_MARGIN_MS = 10_000

# Why a candidate hangs (not in the tool's table; in the JSON, logs and audit records).
NO_TRANSACTIONAL_ID = "no_transactional_id"            # ListTransactions knows no id for this producer id
TRANSACTIONAL_ID_NOT_FOUND = "transactional_id_not_found"  # DescribeTransactions: TRANSACTIONAL_ID_NOT_FOUND
NOT_IN_TRANSACTION = "partition_not_in_transaction"    # the coordinator's transaction does not list it
# Kafka 2.8 has no ListTransactions or DescribeTransactions (KIP-664 finished in 3.0): an open transaction
# whose producer last wrote longer ago than the maximum transaction timeout is reported without the
# coordinator's confirmation. The coordinator aborts every transaction within its own timeout (at most
# transaction.max.timeout.ms), so such a partition hangs unless its abort marker is still on its way, or
# unless the age is wrong: it is the producer's last *timestamp*, which a live transaction can show as
# old (event-time timestamps that Kafka Streams and MirrorMaker keep from their input, a producer clock
# behind). Reported, never aborted without a person's word (`Finding.confirmed`).
UNCONFIRMED = "unconfirmed_coordinator_cannot_be_asked"
# Kafka 2.8 again, with the coordinator's own log instead (issue 31 item 5): `__transaction_state`, read to its end
# after DescribeProducers answered, holds what DescribeTransactions would answer for every transactional id (each
# change is appended and replicated before the coordinator answers its client). A candidate whose producer id the
# log holds is judged from that description exactly as from DescribeTransactions' (`HangingScan._judge`); one it
# reports carries this reason, and counts as confirmed. A producer id the log does not hold stays UNCONFIRMED.
CONFIRMED_BY_LOG = "confirmed_by_transaction_log"
# Findings no coordinator confirmed: `txnguard hanging --abort` leaves them alone unless told, by a flag of its own,
# that a person checked each one (see `Finding.confirmed`). Every such class is listed here.
UNCONFIRMED_REASONS = frozenset({UNCONFIRMED})

HEADERS = ("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
           "LastTimestamp", "Duration(min)")


@dataclass(frozen=True, slots=True)
class ProducerState:
    """One active producer of a partition, as DescribeProducers answers (-1: absent)."""

    producer_id: int
    producer_epoch: int
    last_timestamp_ms: int
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1
    last_sequence: int = -1

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_start_offset >= 0  # the admin client: < 0 is OptionalLong.empty()


@dataclass(frozen=True, slots=True)
class TransactionView:
    """What DescribeTransactions says about a transactional id (error NONE)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    partitions: frozenset[TopicPartition]
    timeout_ms: int = -1        # transactionTimeoutMs (-1: not known)
    start_time_ms: int = -1     # transactionStartTimeMs, the coordinator's clock (-1: no transaction started)


def transaction_view(desc: DescribedTransaction) -> TransactionView:
    """A description (DescribeTransactions' answer, or the log's: TransactionLogView.describe) as the scan uses it."""
    return TransactionView(desc.transactional_id, desc.state, desc.producer_id, desc.producer_epoch, desc.partitions,
                           desc.timeout_ms, desc.start_time_ms)


def producers_in_log(view: TransactionLogView, read: Container[int]) -> dict[int, TransactionView]:
    """Producer id -> its transactional id's description, from the coordinator's log: what ListTransactions and
    DescribeTransactions together give on 3.x. Only ids whose `__transaction_state` partition is in `read` (read to
    its end after DescribeProducers answered): a partition read less far could miss the AddPartitionsToTxn that
    makes a live transaction's partition legitimate. Were one producer id under two ids (the coordinator never
    allocates one twice), the id changed last wins."""
    out: dict[int, TransactionView] = {}
    for txn_id, logged in view.items():
        desc = view.describe(txn_id) if logged.partition in read else None
        if desc is not None:
            out[desc.producer_id] = transaction_view(desc)
    return out


@dataclass(frozen=True, slots=True)
class MaxTimeout:
    """find-hanging's rule: one threshold for every transaction (`--max-transaction-timeout`)."""

    ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN * MINUTE_MS


@dataclass(frozen=True, slots=True)
class OwnTimeout:
    """Each transaction's own timeout (the coordinator's transactionTimeoutMs) plus `margin_ms`; `unknown_ms`
    when the coordinator cannot say (no transactional id for the producer, the id not found, or a broker
    without ListTransactions).

    `unknown_ms` None: the cluster's transaction.max.timeout.ms, which the IO half reads (DescribeConfigs) and
    sets before judging; no transaction can run longer than that. Until then (a pure caller that sets
    nothing) Kafka's default of it, 15 minutes, which is also find-hanging's default threshold."""

    margin_ms: int = DEFAULT_MARGIN_MS
    unknown_ms: int | None = None


Rule = MaxTimeout | OwnTimeout


def candidate_floor_ms(rule: Rule) -> int:
    """An open transaction must be older than this to be worth asking its coordinator about."""
    return rule.ms if isinstance(rule, MaxTimeout) else rule.margin_ms


def threshold_ms(rule: Rule, description: TransactionView | None) -> int:
    """The age a candidate must pass to hang, given its coordinator's description (None: none)."""
    if isinstance(rule, MaxTimeout):
        return rule.ms
    if description is None or description.timeout_ms <= 0:
        return DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN * MINUTE_MS if rule.unknown_ms is None else rule.unknown_ms
    return description.timeout_ms + rule.margin_ms


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    topic: str
    partition: int
    producer: ProducerState
    age_ms: int = 0           # now - last timestamp, now when DescribeProducers answered

    @property
    def topic_partition(self) -> TopicPartition:
        return self.topic, self.partition


@dataclass(frozen=True, slots=True)
class Finding:
    """A hanging transaction: the tool's row, plus what the coordinator said."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int    # -1 when the partition has none (the tool prints -1 too)
    start_offset: int
    last_timestamp_ms: int
    reason: str
    transactional_id: str | None = None
    coordinator_state: str | None = None  # the state DescribeTransactions named, if it knew the id
    threshold_ms: int | None = None       # the age it had to pass (the rule's, for this transaction)
    transaction_timeout_ms: int | None = None  # the coordinator's transactionTimeoutMs, if it described it

    @property
    def confirmed(self) -> bool:
        """A coordinator was asked (or its log read: CONFIRMED_BY_LOG) and does not list this partition in the
        producer's transaction. An unconfirmed
        finding rests on the producer's last timestamp alone, which a live transaction can show too (event-time
        timestamps, a clock behind, a timeout above the threshold): it is never aborted by default."""
        return self.reason not in UNCONFIRMED_REASONS

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        """Identity of one hanging transaction across scans."""
        return self.topic, self.partition, self.producer_id, self.producer_epoch, self.start_offset

    def duration_min(self, now_ms: int) -> int:
        """Whole minutes since the producer's last write, as the tool prints (TimeUnit.toMinutes truncates)."""
        return _trunc_div(now_ms - self.last_timestamp_ms, MINUTE_MS)

    def row(self, now_ms: int) -> tuple[str, ...]:
        return (self.topic, str(self.partition), str(self.producer_id), str(self.producer_epoch),
                str(self.coordinator_epoch), str(self.start_offset), str(self.last_timestamp_ms),
                str(self.duration_min(now_ms)))

    def as_dict(self, now_ms: int) -> dict[str, object]:
        return {
            "topic": self.topic, "partition": self.partition, "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch, "coordinator_epoch": self.coordinator_epoch,
            "start_offset": self.start_offset, "last_timestamp_ms": self.last_timestamp_ms,
            "age_ms": now_ms - self.last_timestamp_ms, "duration_min": self.duration_min(now_ms),
            "reason": self.reason, "transactional_id": self.transactional_id,
            "coordinator_state": self.coordinator_state, "threshold_ms": self.threshold_ms,
            "transaction_timeout_ms": self.transaction_timeout_ms, "confirmed": self.confirmed,
        }


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


# -- the steps of a scan --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AskProducers:
    """DescribeProducers for these partitions (one batch)."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class AskTransactionalIds:
    """ListTransactions on every broker, ProducerIdFilters = these producer ids."""

    producer_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class AskDescriptions:
    """DescribeTransactions of these transactional ids."""

    transactional_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class AskProducersAgain:
    """DescribeProducers once more for the partitions of the findings (`OwnTimeout` only): asked after the
    coordinator answered, it tells a marker written meanwhile from a transaction that still hangs."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class Done:
    findings: tuple[Finding, ...]


Step = AskProducers | AskTransactionalIds | AskDescriptions | AskProducersAgain | Done


def is_candidate(producer: ProducerState, now_ms: int, floor_ms: int) -> bool:
    return producer.has_open_transaction and now_ms - producer.last_timestamp_ms > floor_ms


@dataclass
class HangingScan:
    """One scan as a sequence: `start()`, then feed each answer to the step's method; ends with `Done`."""

    partitions: Sequence[TopicPartition]
    rule: Rule = field(default_factory=MaxTimeout)
    batch_size: int = MAX_BATCH_SIZE
    candidates: list[OpenTransaction] = field(default_factory=list)
    open_transactions: list[OpenTransaction] = field(default_factory=list)  # every one seen, candidate or not
    oldest_open_age_ms: int | None = None   # now - last timestamp of the oldest open transaction seen
    described_partitions: int = 0
    _next_batch: int = 0
    _transactional_ids: dict[int, str] = field(default_factory=dict)
    _pending: tuple[Finding, ...] = ()      # findings awaiting the second look (OwnTimeout)

    def start(self) -> Step:
        return self._next_producers_step()

    def _next_producers_step(self) -> Step:
        if self._next_batch < len(self.partitions):
            batch = tuple(self.partitions[self._next_batch:self._next_batch + self.batch_size])
            self._next_batch += len(batch)
            return AskProducers(batch)
        if not self.candidates:
            return Done(())
        return AskTransactionalIds(frozenset(c.producer.producer_id for c in self.candidates))

    def producers_answered(self, answers: Mapping[TopicPartition, Sequence[ProducerState]], now_ms: int) -> Step:
        """One batch's answers (partitions that failed are simply absent), `now_ms` when they arrived."""
        floor = candidate_floor_ms(self.rule)
        for (topic, partition), producers in answers.items():
            self.described_partitions += 1
            for p in producers:
                if not p.has_open_transaction:
                    continue
                open_txn = OpenTransaction(topic, partition, p, now_ms - p.last_timestamp_ms)
                self.open_transactions.append(open_txn)
                if p.last_timestamp_ms >= 0:
                    self.oldest_open_age_ms = open_txn.age_ms if self.oldest_open_age_ms is None else max(
                        self.oldest_open_age_ms, open_txn.age_ms)
                if is_candidate(p, now_ms, floor):
                    self.candidates.append(open_txn)
        return self._next_producers_step()

    def transactional_ids_answered(self, listings: Iterable[tuple[str, int]]) -> Step:
        """(transactional id, producer id) listings from every broker; unrequested producer ids are ignored."""
        wanted = {c.producer.producer_id for c in self.candidates}
        for transactional_id, producer_id in listings:
            if producer_id in wanted:
                self._transactional_ids[producer_id] = transactional_id
        if not self._transactional_ids:
            return self._second_look(self._judge({}))
        return AskDescriptions(frozenset(self._transactional_ids.values()))

    def transactional_ids_unavailable(self) -> Done:
        """The brokers lack ListTransactions (Kafka < 3.0): every candidate older than the threshold for an
        undescribed transaction, unconfirmed (see UNCONFIRMED)."""
        limit = threshold_ms(self.rule, None)
        return Done(tuple(_finding(c, UNCONFIRMED, None, None, limit) for c in self.candidates if c.age_ms > limit))

    def transaction_log_answered(self, producers: Mapping[int, TransactionView]) -> Step:
        """The brokers lack ListTransactions, and the coordinator's log was read instead: `producers` maps each
        producer id it holds to its transactional id's description (`producers_in_log`). A candidate whose producer
        id is there is judged as a DescribeTransactions answer is, and a finding says the log confirmed it
        (CONFIRMED_BY_LOG); one whose producer id is not there is UNCONFIRMED, as without the log (same threshold:
        that of an undescribed transaction). Then, under `OwnTimeout`, the second look, for both."""
        for c in self.candidates:
            desc = producers.get(c.producer.producer_id)
            if desc is not None:
                self._transactional_ids[c.producer.producer_id] = desc.transactional_id
        judged = self._judge({d.transactional_id: d for d in producers.values()
                              if d.transactional_id in self._transactional_ids.values()})
        # _judge names a candidate without a transactional id NO_TRANSACTIONAL_ID: here that is "not in the log",
        # which says nothing of the coordinator (an id expired, a log partition not read): unconfirmed.
        return self._second_look(tuple(
            replace(f, reason=UNCONFIRMED if f.transactional_id is None else CONFIRMED_BY_LOG) for f in judged))

    def descriptions_answered(self, descriptions: Mapping[str, TransactionView | None]) -> Step:
        """Every asked id: its description, or None for TRANSACTIONAL_ID_NOT_FOUND."""
        return self._second_look(self._judge(descriptions))

    def producers_answered_again(self, answers: Mapping[TopicPartition, Sequence[ProducerState]]) -> Done:
        """The second look: a finding stands while its partition still shows the same producer's open transaction
        at the same start offset (a partition that failed to answer is not confirmed this time)."""
        still = []
        for f in self._pending:
            producers = answers.get((f.topic, f.partition), ())
            if any(p.producer_id == f.producer_id and p.current_txn_start_offset == f.start_offset
                   for p in producers if p.has_open_transaction):
                still.append(f)
        self._pending = ()
        return Done(tuple(still))

    def _second_look(self, findings: tuple[Finding, ...]) -> Step:
        if not findings or isinstance(self.rule, MaxTimeout):
            return Done(findings)  # the tool's answer, exactly
        self._pending = findings
        return AskProducersAgain(tuple(sorted({(f.topic, f.partition) for f in findings})))

    def _judge(self, descriptions: Mapping[str, TransactionView | None]) -> tuple[Finding, ...]:
        out = []
        for c in self.candidates:
            txn_id = self._transactional_ids.get(c.producer.producer_id)
            desc = descriptions.get(txn_id) if txn_id is not None else None
            if txn_id is None:
                reason = NO_TRANSACTIONAL_ID
            elif desc is None:
                reason = TRANSACTIONAL_ID_NOT_FOUND
            elif c.topic_partition not in desc.partitions:
                reason = NOT_IN_TRANSACTION
            else:
                continue  # the coordinator will still write this partition's marker
            limit = threshold_ms(self.rule, desc)
            if c.age_ms <= limit:
                continue  # its own transaction may still be running: not yet
            out.append(_finding(c, reason, txn_id, desc, limit))
        return tuple(out)


def _finding(c: OpenTransaction, reason: str, txn_id: str | None, desc: TransactionView | None,
             limit: int) -> Finding:
    p = c.producer
    return Finding(c.topic, c.partition, p.producer_id, p.producer_epoch, p.coordinator_epoch,
                   p.current_txn_start_offset, p.last_timestamp_ms, reason, txn_id,
                   desc.state if desc is not None else None, limit,
                   desc.timeout_ms if desc is not None and desc.timeout_ms > 0 else None)


def find_hanging(producers: Mapping[TopicPartition, Sequence[ProducerState]], now_ms: int, rule: Rule,
                 listings: Iterable[tuple[str, int]], descriptions: Mapping[str, TransactionView | None],
                 producers_later: Mapping[TopicPartition, Sequence[ProducerState]] | None = None,
                 ) -> tuple[Finding, ...]:
    """The whole judgement in one call, for answers already in hand (ListTransactions and
    DescribeTransactions may answer for more than the candidates: the extra are ignored).
    `producers_later`: the second look's answers (`OwnTimeout`; default: the same as `producers`)."""
    scan = HangingScan(sorted(producers), rule, batch_size=max(1, len(producers)))
    step = scan.start()
    if isinstance(step, AskProducers):
        step = scan.producers_answered(producers, now_ms)
    if isinstance(step, AskTransactionalIds):
        step = scan.transactional_ids_answered(listings)
    if isinstance(step, AskDescriptions):
        step = scan.descriptions_answered(descriptions)
    if isinstance(step, AskProducersAgain):
        step = scan.producers_answered_again(producers if producers_later is None else producers_later)
    assert isinstance(step, Done)
    return step.findings


# -- the tool's table ---------------------------------------------------------------------------------


def table(findings: Iterable[Finding], now_ms: int) -> str:
    """The table `find-hanging` prints: each cell padded to its column's width, then a tab."""
    rows = [HEADERS, *(f.row(now_ms) for f in findings)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    return "".join("".join(cell.ljust(w) + "\t" for cell, w in zip(r, widths, strict=True)) + "\n" for r in rows)


# -- findings across scans: each logged and audited once -------------------------------------------------


@dataclass
class FindingTracker:
    """Remembers the findings of the last scan, so each new one is reported once and its end noticed."""

    current: dict[tuple[str, int, int, int, int], Finding] = field(default_factory=dict)

    def update(self, findings: Iterable[Finding]) -> tuple[list[Finding], list[Finding]]:
        """(new since the last scan, gone since the last scan). A finding confirmed now that was unconfirmed before
        (or the reverse) counts as new: on 2.8 a proxy's scan may find one before its log follower has read the log,
        and the record that says a person must check it must not be the only one."""
        fresh = {f.key: f for f in findings}
        new = [f for k, f in fresh.items() if k not in self.current or self.current[k].confirmed != f.confirmed]
        gone = [f for k, f in self.current.items() if k not in fresh]
        self.current = fresh
        return new, gone

    def per_partition(self) -> dict[TopicPartition, int]:
        counts: dict[TopicPartition, int] = {}
        for f in self.current.values():
            counts[(f.topic, f.partition)] = counts.get((f.topic, f.partition), 0) + 1
        return counts


# -- abort -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AbortSpec:
    """What WriteTxnMarkers (abort) is sent with, as the admin client's AbortTransactionSpec."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int

    def describe(self, start_offset: int) -> str:
        return (f"topic {self.topic} partition {self.partition} producer id {self.producer_id} "
                f"epoch {self.producer_epoch} start offset {start_offset} (coordinator epoch {self.coordinator_epoch})")


def abort_spec(topic: str, partition: int, producers: Iterable[ProducerState], start_offset: int) -> AbortSpec | None:
    """`kafka-transactions.sh abort --start-offset`: the first active producer whose open transaction starts
    there; its coordinator epoch, or 0 when it has none. None: no open transaction starts at that offset."""
    for p in producers:
        if p.has_open_transaction and p.current_txn_start_offset == start_offset:
            return AbortSpec(topic, partition, p.producer_id, p.producer_epoch, max(p.coordinator_epoch, 0))
    return None

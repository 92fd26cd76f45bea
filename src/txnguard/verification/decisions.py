"""From a checked request to a decision: the decision half of the transaction guard, pure.

`TransactionRules` watches the transaction life cycle (InitProducerId,
AddPartitionsToTxn v0-3, AddOffsetsToTxn, EndTxn) into the registry, says which
requests it `wants` to check, and turns a transactional Produce (<= v11) or a
TxnOffsetCommit (<= v4) into a `Decision`, at once when the registry can decide
alone (the hot path), else into a `PendingCheck` whose `question` someone with
IO must answer (`resume` takes the `Answer`, one kind per kind of question, and may ask again).

No IO, no clock of its own: wall-clock milliseconds and a CPU/perf clock arrive
through the `Clock` the caller passes. What the shell logs, counts and audits is
in the `Decision` (`records`, `elapsed_ms`, `cpu_ms`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, assert_never

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from txnguard.codecs import native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import BoundsExceeded, CodecError
from txnguard.codecs.groups import CONSUMER_OFFSETS, offsets_partition_for
from txnguard.codecs.header import FIRST_FLEXIBLE_PRODUCE, RequestHead, peek_request, produce_timeout_ms
from txnguard.codecs.lifecycle_scan import (
    AddOffsetsSeen,
    AddPartitionsSeen,
    EndTxnSeen,
    InitProducerIdSeen,
    TxnRequest,
    TxnResponse,
    from_kio_request,
    from_kio_response,
    read_txn_offset_commit,
    read_txn_request,
    read_txn_response,
)
from txnguard.codecs.native import scan_transactional
from txnguard.codecs.produce import (
    Rejection,
    merged_produce_response,
    txn_offset_commit_rejection,
    without_partitions,
)
from txnguard.codecs.produce_scan import scan_produce
from txnguard.codecs.synthesis import add_to_txn_error
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.policies.enforcement import Enforcement
from txnguard.policies.error_mapping import ErrorChoice
from txnguard.policies.policy import Policy
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import (
    Answer,
    AwaitEndTxn,
    Check,
    CountOffsetsPartitions,
    DescribeTransaction,
    EndTxnSettled,
    EndTxnStillInDoubt,
    HeldForEndTxn,
    OffsetCommitWrite,
    OffsetsPartitionCount,
    OffsetsPartitionCountFailed,
    PartitionVerdicts,
    ProduceWrite,
    TimedOutEndTxn,
    TimedOutInitProducerId,
    TransactionDescription,
    TransactionDescriptionFailed,
    VerifyPartitions,
    Write,
    answers,
)
from txnguard.verification.checks import Question as Question  # re-exported: connection/commands.py's Ask carries one
from txnguard.verification.concurrent import ABSORBED_KEYS, ConcurrentRetry
from txnguard.verification.hold_limits import HoldLimits
from txnguard.verification.in_doubt import EndTxnLedger, SentEndTxn
from txnguard.verification.judge import coordinator_unreachable, group_partitions
from txnguard.verification.passed import UNCHECKED, Passed, PassedOffsets, Unchecked
from txnguard.verification.plan import (
    LAST_PRODUCE_VERSION_BEFORE_TV2,
    LAST_TXN_OFFSET_COMMIT_VERSION_BEFORE_TV2,
    plan_produce,
)
from txnguard.verification.registry import Registry
from txnguard.verification.timeouts import FIRST_BUMP_VERSION, PRODUCE_REPLIES, end_txn_reply, timed_out
from txnguard.verification.verdicts import Evidence, Outcome, Verdict

# The API keys this module reads (codecs/api_keys.py).
PRODUCE_KEY, INIT_PRODUCER_ID, TXN_OFFSET_COMMIT_KEY = ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.TXN_OFFSET_COMMIT
ADD_PARTITIONS, ADD_OFFSETS, END_TXN = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN
OBSERVED = frozenset({INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN})
LAST_CLIENT_ADD_PARTITIONS_VERSION = 3  # v4+ is the broker-to-coordinator batch shape

FORWARDED = "forwarded"  # a VerdictRecord's decision when the partition passed

# From least to most exposed to a change between check and append.
_EVIDENCE_ORDER = ("local", "log", "cache", "leader", "coordinator", "request")


# What an observed life-cycle request leaves for its answer: the request as read, or a forwarded EndTxn in doubt.
Observed = InitProducerIdSeen | AddPartitionsSeen | AddOffsetsSeen | SentEndTxn


def _txn_response(body: memoryview, key: int, version: int) -> TxnResponse | None:
    """A life-cycle answer read in place, or by kio; None when neither can read it (nothing is learned)."""
    resp = read_txn_response(body, key, version)
    if resp is not None:
        return resp
    try:
        _, decoded = schemas.decode_response(body, key, version)
    except Exception:  # noqa: BLE001
        return None
    return from_kio_response(key, decoded)


# A NamedTuple record built without its generated __new__ (a Python call, half a record's cost on the hot path):
# the fields in their order, as `Passed(...)` takes them.
_new_record = tuple.__new__
_OFF, _LAST_PRODUCE = Enforcement.OFF, LAST_PRODUCE_VERSION_BEFORE_TV2  # module globals: read per write


def _init_producer_id_seen(req: Any) -> InitProducerIdSeen:
    """An InitProducerId decoded by kio, as the in-place reader gives it (what its answer is observed with)."""
    seen = from_kio_request(INIT_PRODUCER_ID, req)
    assert isinstance(seen, InitProducerIdSeen)
    return seen


class Clock(Protocol):
    """Time, passed in. `perf` and `cpu` are seconds of a monotonic and a thread-CPU clock."""

    def wall_ms(self) -> int: ...
    def perf(self) -> float: ...
    def cpu(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Everything a decision needs to know about the checked request (once 15 positional parameters)."""

    kind: Check                    # what is checked, and what only that kind carries (verification/checks.py)
    api_version: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    mode: Enforcement
    frame: memoryview              # the original frame, length prefix included
    header: Any                    # decoded request header (Produce: None until a rejection needs it)
    request: Any                   # decoded request body (likewise)
    client: ClientInfo
    inspection_ms: float = 0.0     # decoding the request, before verification starts (Kafka's own start)

    @property
    def api(self) -> str:
        """The kind's name in log lines, metric labels and audit records."""
        return self.kind.api

    def decoded(self) -> tuple[Any, Any]:
        """(header, body) with kio: decoded at check time for TxnOffsetCommit; for Produce only when
        a rejection must rebuild the request or merge its answer (the scan already checked every size)."""
        if self.request is not None:
            return self.header, self.request
        return schemas.decode_request(self.frame[4:])


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    """One partition's verdict and what happened to the write: for metrics, logs and the audit log."""

    target: str                     # "topic-partition", or "group:<id>"
    verdict: Verdict
    decision: str                   # "forwarded" | "rejected" | "forwarded_unenforced"
    error: ErrorChoice | None       # the error the client family gets (None: passed)
    enforced: bool


@dataclass
class Decision:
    """What happens to a checked request: forward (maybe reduced) and/or answer with rejections."""

    forward: bytes | memoryview | None               # the frame to send the broker; None: answer alone
    rejections: dict[TopicPartition, Rejection] = field(default_factory=dict)
    local_response: bytes | None = None             # when nothing is forwarded
    context: RequestContext | None = None           # None when nothing was checked (mode off)
    records: list[VerdictRecord] = field(default_factory=list)
    elapsed_ms: float = 0.0                         # VerificationTimeMs
    cpu_ms: float | None = None                     # thread CPU time, for decisions taken without waiting
    # The check-to-append window: when the evidence was in hand (Clock.perf) and which evidence
    # it was (the weakest of the request's partitions); None when nothing passed.
    evidence_at: float | None = None
    evidence: str | None = None
    observe: Observed | None = None                 # a forwarded life-cycle request whose answer is observed
    local_reason: str = "verification"              # why the proxy answered alone (a metric label)


@dataclass
class PendingCheck:
    context: RequestContext
    question: Question
    started: float                             # Clock.perf when verification started
    verdicts: dict[TopicPartition, Verdict] = field(default_factory=dict)


def _weakest(verdicts: list[Verdict]) -> str:
    return max((v.evidence.value for v in verdicts), key=_EVIDENCE_ORDER.index)


def _write(ctx: RequestContext) -> Write:
    """The write whose partitions have verdicts: only a write is verified partition by partition."""
    kind = ctx.kind
    match kind:
        case ProduceWrite() | OffsetCommitWrite():
            return kind
        case HeldForEndTxn() | TimedOutEndTxn() | TimedOutInitProducerId():
            raise AssertionError(f"{ctx.api} is not a write: it has no partition verdicts")
        case _:
            assert_never(kind)


def _target(write: Write, tp: TopicPartition) -> str:
    """What a verdict is about, in logs and audit records."""
    match write:
        case ProduceWrite():
            return f"{tp[0]}-{tp[1]}"
        case OffsetCommitWrite(group=group):
            return f"group:{group}"
        case _:
            assert_never(write)


_native_observe_request, _native_observe_response = native.observe_request, native.observe_response
_REGISTRY_CORE, _LEDGER_CORE = native.RegistryCore, native.EndTxnLedgerCore


class TransactionRules:
    """KIP-890 part 1 decisions for every connection of one proxy (they share the registry)."""

    def __init__(self, registry: Registry, policy: Policy, *, enabled: bool = True, ask_leader: bool = True,
                 holds: HoldLimits | None = None, concurrent: ConcurrentRetry | None = None,
                 in_doubt: EndTxnLedger | None = None) -> None:
        self.registry = registry
        # The KAFKA-17754 defence (verification/in_doubt.py); None: off.
        self.in_doubt = in_doubt
        self.policy = policy
        self.enabled = enabled
        self.ask_leader = ask_leader
        self.holds = holds or HoldLimits()
        self.concurrent = concurrent or ConcurrentRetry()
        self.offsets_partitions: int | None = None
        # A decision taken without waiting carries its thread CPU time (`Decision.cpu_ms`), which only the
        # audit record shows; a thread CPU clock read costs ~2 us, so the shell turns this off with no audit.
        self.measures_cpu = True

    # -- which requests -----------------------------------------------------------------------------

    def family(self, software_name: str | None, client_id: str | None, listener: str | None) -> str:
        """The client's family, as the policy classifies it (the errors it gets, the audit's name for it)."""
        return self.policy.family(software_name, client_id, listener)

    def wants(self, key: int, version: int) -> bool:
        if not self.enabled:
            return False
        if key == PRODUCE_KEY:
            return 3 <= version <= LAST_PRODUCE_VERSION_BEFORE_TV2
        return key == TXN_OFFSET_COMMIT_KEY and version <= LAST_TXN_OFFSET_COMMIT_VERSION_BEFORE_TV2

    # -- observing the transaction life cycle ---------------------------------------------------------

    def observe_request(self, key: int, version: int, body: memoryview, now_ms: int,
                        connection_id: int = 0) -> Observed | None:
        """Decode an observed request; what the response handler needs (None: nothing to watch).

        An EndTxn is written down as in doubt until its answer (its `SentEndTxn` is what comes back)."""
        if key == ADD_PARTITIONS and version > LAST_CLIENT_ADD_PARTITIONS_VERSION:
            return None
        req = read_txn_request(body, peek_request(body))  # in place; kio for what it cannot read plainly
        if req is None:
            try:
                _, decoded = schemas.decode_request(body)
            except BoundsExceeded:
                raise  # sizes the frame cannot hold: the broker closes such a connection, and so do we
            except CodecError:
                return None  # values kio refuses (an unknown tag, say): the broker judges; we only watch
            req = from_kio_request(key, decoded)
        return self._observed(req, now_ms, connection_id)

    def observe_request_in_place(self, head: RequestHead, data: bytes | memoryview, start: int, stop: int,
                                 clock: Clock, connection_id: int) -> tuple[Observed | None, bool] | None:
        """`observe_request` for the relay's fast path, which neither decodes with kio nor holds nor checks, of the
        request in `data[start:stop]` (the frame without its length prefix, read where it lies: a slice of a read
        cost more than the native reader's whole read of it). None
        leaves the request to the general path untouched (the rules off, a request the coordinator-timeout check
        wants, a shape the in-place reader does not read, or an AddPartitionsToTxn/AddOffsetsToTxn the EndTxn
        defence holds); otherwise (what observe_request returns, with the same effects; whether the request's
        bytes are kept to ask again: `absorbs`)."""
        key, version = head.api_key, head.api_version
        if not self.enabled or (self.policy.timeout_recovery and self.wants_lifecycle(key, version)):
            return None
        now_ms = clock.wall_ms()
        if key == ADD_PARTITIONS and version > LAST_CLIENT_ADD_PARTITIONS_VERSION:
            return None, False
        if self._native_state():  # the same rules in one native call (native/src/py_observe.rs)
            in_doubt = self.in_doubt
            seen: tuple[Observed | None, bool] | None = _native_observe_request(
                data, start, stop, key, version, now_ms, connection_id, self.registry, in_doubt,
                in_doubt is not None and in_doubt.limits.enabled, self.concurrent.enabled)
            return seen
        req = read_txn_request(data, head, start, stop)
        if req is None:
            return None
        if self.in_doubt is not None and isinstance(req, (AddPartitionsSeen, AddOffsetsSeen)) \
                and self.holds_for_end_txn(req, connection_id, now_ms):
            return None
        observed = self._observed(req, now_ms, connection_id)
        return observed, self.absorbs(key, observed)

    def _native_state(self) -> bool:
        """Whether the registry and the EndTxn ledger (or its absence) are the native ones: then the fast path's
        life-cycle rules run in one native call each, asking them directly. Asked per frame: tests swap them."""
        in_doubt = self.in_doubt
        return isinstance(self.registry, _REGISTRY_CORE) and (in_doubt is None or isinstance(in_doubt, _LEDGER_CORE))

    def absorbs(self, key: int, observed: Observed | None) -> bool:
        """Whether the core keeps an observed request's bytes to ask the coordinator again itself, should it
        refuse the whole request with CONCURRENT_TRANSACTIONS (verification/concurrent.py)."""
        return key in ABSORBED_KEYS and observed is not None and self.concurrent.enabled

    def retry_delay_ms(self, retries: int, waited_ms: float) -> float | None:
        """How long the core waits before asking again after CONCURRENT_TRANSACTIONS; None: the budget is spent."""
        return self.concurrent.delay_ms(retries, waited_ms)

    def _observed(self, req: TxnRequest, now_ms: int, connection_id: int) -> Observed | None:
        # By type, not by a class pattern: one per life-cycle request, and a pattern reads each field by name.
        if isinstance(req, EndTxnSeen):
            txn_id, pid, epoch, committed = req
            self.registry.end_txn(txn_id, pid, epoch, now_ms)
            if self.in_doubt is None:
                return None  # EndTxn takes effect when sent: its answer changes nothing in the registry
            return self.in_doubt.sent(txn_id, pid, epoch, committed, connection_id, now_ms)
        return req  # InitProducerIdSeen, AddPartitionsSeen, AddOffsetsSeen: their answers teach the registry

    def observe_response(self, key: int, version: int, request: Observed | None, body: memoryview,
                         now_ms: int) -> bool:
        """Learn from a life-cycle answer; True when it refuses the whole request with
        CONCURRENT_TRANSACTIONS (the core may then ask again itself: verification/concurrent.py)."""
        # The EndTxn in doubt last: it is whichever ledger's token (native or Python) the rules were given.
        match request:
            case None:
                return False
            case InitProducerIdSeen() | AddPartitionsSeen() | AddOffsetsSeen():
                resp = _txn_response(body, key, version)
                return resp is not None and self._learn(request, resp, now_ms)
            case _:
                # Any answer, error or not: the coordinator has processed it and it can no longer land later.
                if self.in_doubt is not None:
                    self.in_doubt.answered(request)
                return False

    def observe_response_in_place(self, key: int, version: int, request: Observed | None, data: bytes | memoryview,
                                  start: int, stop: int, now_ms: int, absorbable: bool) -> bool:
        """`observe_response` for the relay's fast path, of the answer in `data[start:stop]` (from its correlation
        id, read where it lies): False leaves the answer to the general path untouched
        (not readable in place, or a whole-request CONCURRENT_TRANSACTIONS the core may ask again: `absorbable`);
        True: learned, with the same effects, and the answer goes to the client as it is. The relay's native book
        (native/src/book.rs) calls the native branch's function itself where the registry and the ledger are the
        native ones, and this method otherwise; the property test of the native rules drives both branches here."""
        if self._native_state():  # the same rules in one native call (native/src/py_observe.rs)
            learned: bool = _native_observe_response(data, start, stop, key, version, request, now_ms, absorbable,
                                                     self.registry, self.in_doubt)
            return learned
        if not isinstance(request, (InitProducerIdSeen, AddPartitionsSeen, AddOffsetsSeen)):  # a tuple: C-fast
            if request is not None and self.in_doubt is not None:  # an EndTxn's answer: no longer in doubt
                self.in_doubt.answered(request)
            return True
        resp = read_txn_response(data, key, version, start, stop)
        if resp is None or (resp.all_concurrent and absorbable):
            return False
        self._learn(request, resp, now_ms)
        return True

    def _learn(self, request: InitProducerIdSeen | AddPartitionsSeen | AddOffsetsSeen, resp: TxnResponse,
               now_ms: int) -> bool:
        """What the registry learns from a life-cycle answer; True as `observe_response` says (only
        AddPartitionsToTxn and AddOffsetsToTxn are asked again: concurrent.ABSORBED_KEYS)."""
        match request:
            case InitProducerIdSeen(transactional_id=txn_id):
                if resp.error_code == 0 and txn_id:  # ErrorCode.none
                    self.registry.init_producer_id(txn_id, resp.producer_id, resp.producer_epoch,
                                                   request.transaction_timeout_ms, now_ms)
                    if self.in_doubt is not None:
                        # A new epoch fences every EndTxn of the old one: none of them can land any more.
                        self.in_doubt.fenced(txn_id, resp.producer_id, resp.producer_epoch)
                return False
            case AddPartitionsSeen():
                # What counts as added: the partitions an AddPartitionsToTxn (v0-3) answer accepted.
                if resp.accepted:
                    self.registry.added(request.transactional_id, request.producer_id, request.producer_epoch,
                                        now_ms, partitions=resp.accepted)
                return resp.all_concurrent
            case AddOffsetsSeen():
                if resp.error_code == 0:  # ErrorCode.none
                    self.registry.added(request.transactional_id, request.producer_id, request.producer_epoch,
                                        now_ms, group=request.group_id)
                return resp.all_concurrent
            case _:
                assert_never(request)

    # -- the KAFKA-17754 defence: no new transaction while an EndTxn is in doubt ---------------------------

    def end_txn_hold(self, key: int, version: int, frame: memoryview, request: Observed, client: ClientInfo,
                     connection_id: int, clock: Clock) -> PendingCheck | None:
        """Hold an AddPartitionsToTxn/AddOffsetsToTxn (decoded: `request`) while an EndTxn in doubt could land
        in the transaction it opens; None: forward it (and any other request). See verification/in_doubt.py."""
        if not isinstance(request, AddPartitionsSeen | AddOffsetsSeen) or \
                not self.holds_for_end_txn(request, connection_id, clock.wall_ms()):
            return None
        assert self.in_doubt is not None
        txn_id, producer_id, epoch = request.transactional_id, request.producer_id, request.producer_epoch
        started = clock.perf()
        ctx = RequestContext(HeldForEndTxn(ApiKey(key)), version, txn_id, producer_id, epoch, Enforcement.ENFORCE,
                             frame, None, request, client)
        # No longer than a held write may wait (a share of the client's request timeout), nor than the
        # defence's own bound: then CONCURRENT_TRANSACTIONS, which the client retries.
        learned = self.registry.get(txn_id)
        hold_ms = min(self.holds.budget_ms(learned.request_timeout_ms if learned is not None else None),
                      float(self.in_doubt.limits.hold_ms))
        return PendingCheck(ctx, AwaitEndTxn(txn_id, producer_id, epoch, hold_ms=hold_ms, connection_id=connection_id),
                            started)

    def holds_for_end_txn(self, request: AddPartitionsSeen | AddOffsetsSeen, connection_id: int, now_ms: int) -> bool:
        """Whether an EndTxn in doubt could land in the transaction this request opens (then it waits)."""
        return (self.in_doubt is not None and self.in_doubt.limits.enabled
                and self.in_doubt.blocking(request.transactional_id, request.producer_id, request.producer_epoch,
                                           connection_id, now_ms) is not None)

    def end_txn_orphaned(self, observed: Observed, now_ms: int) -> None:
        """A forwarded EndTxn whose connection closed unanswered: its outcome will never be seen (it stays in doubt)."""
        if self.in_doubt is not None and not isinstance(observed, (InitProducerIdSeen, AddPartitionsSeen,
                                                                   AddOffsetsSeen)):
            self.in_doubt.orphaned(observed, now_ms)

    def _end_txn_sent(self, txn_id: str, producer_id: int, epoch: int, committed: bool, connection_id: int,
                      now_ms: int) -> SentEndTxn | None:
        """A checked EndTxn (timeout_recovery) that is forwarded is in doubt like any other until its answer."""
        if self.in_doubt is None:
            return None
        return self.in_doubt.sent(txn_id, producer_id, epoch, committed, connection_id, now_ms)

    def _after_in_doubt(self, check: PendingCheck, answer: EndTxnSettled | EndTxnStillInDoubt,
                        clock: Clock) -> Decision:
        """Forward once the doubt ended; else answer CONCURRENT_TRANSACTIONS, the coordinator's own "the
        previous transaction is still completing", which every client retries after a backoff."""
        ctx = check.context
        assert isinstance(ctx.kind, HeldForEndTxn)  # the only kind that awaits an EndTxn
        elapsed = (clock.perf() - check.started) * 1000
        match answer:
            case EndTxnSettled():
                return Decision(forward=ctx.frame, context=ctx, elapsed_ms=elapsed)
            case EndTxnStillInDoubt():
                header = peek_request(ctx.frame[4:])
                _, request = schemas.decode_request(ctx.frame[4:])  # kio: the answer is built from the request
                response = add_to_txn_error(ctx.kind.key, ctx.api_version, header.correlation_id, request,
                                            ErrorCode.concurrent_transactions)
                return Decision(forward=None, local_response=response, context=ctx, elapsed_ms=elapsed,
                                local_reason="end_txn_in_doubt")
            case _:
                assert_never(answer)

    # -- passing on local evidence, for the relay's fast path (connection/relay.py) ------------------------

    def pass_produce_locally(self, data: bytes | memoryview, start: int, stop: int, version: int,
                             client: ClientInfo, clock: Clock) -> Passed | None:
        """A transactional Produce read in place (`data[start:stop]`, from its transactional id to the frame's
        end) that `check_produce` would pass at once: what its `Decided` would have recorded. None leaves it to
        the general path (not wanted, not readable in place, acks=0, the policy's mode off, a partition
        without local evidence). The native reader's PanicException goes to the caller (its connection closes)."""
        if not self.enabled or not 3 <= version <= _LAST_PRODUCE:  # `wants`, inline: per write
            return None
        parsing = clock.perf()
        found = scan_transactional(data, start, stop, version >= FIRST_FLEXIBLE_PRODUCE)
        if found is None:
            return None
        txn_id, producer_id, epoch, partitions, acks = found
        if not acks:
            return None  # acks=0: a rejection would close the connection; the general path says so
        started = clock.perf()
        measures_cpu = self.measures_cpu
        on_cpu = clock.cpu() if measures_cpu else 0.0
        mode = self.policy.mode_for(txn_id, partitions[0][0])
        if mode is _OFF:
            return None
        wall_ms = clock.wall_ms()
        verdict = self.registry.passes_locally(txn_id, producer_id, epoch, partitions, wall_ms)
        if verdict is None:
            return None
        decided = clock.perf()
        return _new_record(Passed, (client, txn_id, producer_id, epoch, version, partitions, verdict, mode,
                                    (started - parsing) * 1000, (decided - started) * 1000,
                                    (clock.cpu() - on_cpu) * 1000 if measures_cpu else None, wall_ms, decided))

    def pass_offset_commit_locally(self, data: bytes | memoryview, head: RequestHead, start: int, stop: int,
                                   client: ClientInfo, clock: Clock, place: int) -> PassedOffsets | Unchecked | None:
        """A TxnOffsetCommit (v0-v4) read in place (`data[start:stop]`: the frame without its length prefix) that
        `check_txn_offset_commit` would pass at once (a plain forward, no log line): what its `Decided` would
        have recorded, at `place` in the ledger; UNCHECKED when the policy leaves it unchecked (forwarded as it
        is). None leaves it to the general path (not wanted, not readable in place, the __consumer_offsets
        partition count not known yet, a verdict that is not a local pass)."""
        version = head.api_version
        if version < 0 or not self.wants(TXN_OFFSET_COMMIT_KEY, version):
            return None
        parsing = clock.perf()
        commit = read_txn_offset_commit(data, head, start, stop)
        if commit is None:
            return None
        started = clock.perf()
        measures_cpu = self.measures_cpu
        on_cpu = clock.cpu() if measures_cpu else 0.0
        txn_id = commit.transactional_id
        mode = self.policy.mode_for(txn_id, CONSUMER_OFFSETS)
        if mode is Enforcement.OFF:
            return UNCHECKED
        count = self.offsets_partitions
        if count is None:
            return None  # the general path asks for it first
        group, producer_id, epoch = commit.group_id, commit.producer_id, commit.producer_epoch
        wall_ms = clock.wall_ms()
        verdict = self.registry.local_verdict(txn_id, producer_id, epoch,
                                              (CONSUMER_OFFSETS, offsets_partition_for(group, count)), wall_ms,
                                              group=group)
        if verdict is None or not verdict.passed:
            return None
        decided = clock.perf()
        return PassedOffsets(client, txn_id, producer_id, epoch, version, group, verdict, mode,
                             (started - parsing) * 1000, (decided - started) * 1000,
                             (clock.cpu() - on_cpu) * 1000 if measures_cpu else None, wall_ms, decided, place)

    # -- checking writes ---------------------------------------------------------------------------------

    def check_produce(self, frame: memoryview, version: int, client: ClientInfo,
                      clock: Clock) -> Decision | PendingCheck:
        """A decision now when the registry can decide alone, else a check with a question."""
        # One in-place pass reads and bounds-checks what verification needs; kio decodes only for a
        # rejection. kio alone was cheaper than a scan, but kio must not see unchecked sizes (issue 7),
        # and checking them first cost 3x kio's own decode (callgrind, one-partition Produce v9).
        parsing = clock.perf()
        body = frame[4:]
        scanned_id, partitions = scan_produce(body, peek_request(body))
        txn_id = str(scanned_id)
        # As in Kafka (AddPartitionsToTxnManager), verification starts once the request is parsed.
        started, on_cpu = clock.perf(), (clock.cpu() if self.measures_cpu else 0.0)
        mode = self.policy.mode_for(txn_id, partitions[0].topic if partitions else None)
        if mode is Enforcement.OFF:
            return Decision(forward=frame)
        now_ms = clock.wall_ms()
        plan = plan_produce(self.registry, txn_id, partitions, now_ms)
        ctx = RequestContext(ProduceWrite(tuple(partitions)), version, txn_id, plan.producer_id, plan.producer_epoch,
                             mode, frame, None, None, client, inspection_ms=(started - parsing) * 1000)
        if plan.pending:
            # The request's own timeout bounds a hold, and stands for the client's request timeout
            # on this transactional id's TxnOffsetCommit (which carries none).
            timeout_ms = produce_timeout_ms(body, peek_request(body))
            self.registry.request_timeout(txn_id, timeout_ms)
            question = VerifyPartitions(txn_id, plan.producer_id, plan.producer_epoch, tuple(plan.pending),
                                        ask_leader=self.ask_leader, hold_ms=self.holds.budget_ms(timeout_ms))
            return PendingCheck(ctx, question, started, dict(plan.verdicts))
        # Decided without waiting: the thread's CPU time tells the proxy's own cost apart from
        # time the host's scheduler gave to other processes (both are in the audit record).
        return self.decide(ctx, plan.verdicts, started, clock,
                           cpu_ms=(clock.cpu() - on_cpu) * 1000 if self.measures_cpu else None)

    def check_txn_offset_commit(self, frame: memoryview, version: int, client: ClientInfo,
                                clock: Clock) -> Decision | PendingCheck:
        parsing = clock.perf()
        body = frame[4:]
        found = read_txn_offset_commit(body, peek_request(body))  # in place; kio for what it cannot read plainly
        if found is not None:
            header, req = None, None  # decoded by ctx.decoded() if a rejection must answer it
            txn_id, group, pid, epoch = found.transactional_id, found.group_id, found.producer_id, found.producer_epoch
        else:
            header, req = schemas.decode_request(body)
            txn_id, group, pid, epoch = str(req.transactional_id), str(req.group_id), int(req.producer_id), \
                int(req.producer_epoch)
        started, on_cpu = clock.perf(), (clock.cpu() if self.measures_cpu else 0.0)
        mode = self.policy.mode_for(txn_id, CONSUMER_OFFSETS)
        if mode is Enforcement.OFF:
            return Decision(forward=frame)
        ctx = RequestContext(OffsetCommitWrite(group), version, txn_id, pid, epoch, mode, frame, header, req, client,
                             inspection_ms=(started - parsing) * 1000)
        if self.offsets_partitions is None:
            return PendingCheck(ctx, CountOffsetsPartitions(), started)
        decided = self._group_verdict(ctx, started, clock)
        if isinstance(decided, Decision) and self.measures_cpu:
            decided.cpu_ms = (clock.cpu() - on_cpu) * 1000
        return decided

    def _group_verdict(self, ctx: RequestContext, started: float, clock: Clock) -> Decision | PendingCheck:
        assert self.offsets_partitions is not None and isinstance(ctx.kind, OffsetCommitWrite)
        group = ctx.kind.group
        tp = (CONSUMER_OFFSETS, offsets_partition_for(group, self.offsets_partitions))
        local = self.registry.local_verdict(ctx.transactional_id, ctx.producer_id, ctx.producer_epoch, tp,
                                            clock.wall_ms(), group=group)
        if local is not None:
            return self.decide(ctx, {tp: local}, started, clock)
        learned = self.registry.get(ctx.transactional_id)
        budget_ms = self.holds.budget_ms(learned.request_timeout_ms if learned is not None else None)
        # The budget runs from the start of verification: a first question (the offsets partition
        # count, which may wait a whole question timeout on a frozen bootstrap broker) spends it too.
        # An exhausted budget still leaves one question, bounded by its own timeout.
        hold_ms = max(budget_ms - (clock.perf() - started) * 1000, 0.0) if budget_ms > 0 else 0.0
        return PendingCheck(ctx, VerifyPartitions(ctx.transactional_id, ctx.producer_id, ctx.producer_epoch, (tp,),
                                                  hold_ms=hold_ms), started)

    def resume(self, check: PendingCheck, answer: Answer, clock: Clock) -> Decision | PendingCheck:
        """The answer to a check's question: a decision, or (TxnOffsetCommit) the next question."""
        ctx = check.context
        if not answers(check.question, answer):
            raise AssertionError(f"{type(answer).__name__} does not answer {type(check.question).__name__}")
        match answer:
            case PartitionVerdicts(verdicts=found):
                verdicts = dict(check.verdicts)
                verdicts.update(found)
                self._remember(ctx, answer, clock.wall_ms())
                return self.decide(ctx, verdicts, check.started, clock)
            case OffsetsPartitionCount(partitions=partitions):
                self.offsets_partitions = partitions
                return self._group_verdict(ctx, check.started, clock)
            case OffsetsPartitionCountFailed(failure=failure):
                # No partition count: cannot verify; retriable for the client.
                v = coordinator_unreachable(f"cannot read __consumer_offsets metadata: {failure}")
                return self.decide(ctx, {(CONSUMER_OFFSETS, -1): v}, check.started, clock)
            case TransactionDescription() | TransactionDescriptionFailed():
                return self._timeout_decision(ctx, answer, check.started, clock)
            case EndTxnSettled() | EndTxnStillInDoubt():
                return self._after_in_doubt(check, answer, clock)
            case _:
                assert_never(answer)

    def _remember(self, ctx: RequestContext, answer: PartitionVerdicts, now_ms: int) -> None:
        """Keep a coordinator's "Ongoing" as evidence for this generation (bounded by the registry's TTL)."""
        desc = answer.description
        if desc is None or desc.state != "Ongoing" or not any(v.passed for v in answer.verdicts.values()):
            return
        self.registry.coordinator_says_ongoing(ctx.transactional_id, ctx.producer_id, ctx.producer_epoch,
                                               desc.start_time_ms, set(desc.partitions),
                                               set(group_partitions(desc)), now_ms, timeout_ms=desc.timeout_ms)

    # -- from verdicts to a decision ------------------------------------------------------------------------

    def decide(self, ctx: RequestContext, verdicts: dict[TopicPartition, Verdict], started: float, clock: Clock,
               cpu_ms: float | None = None) -> Decision:
        records: list[VerdictRecord] = []
        rejections: dict[TopicPartition, Rejection] = {}
        write = _write(ctx)
        for tp, v in verdicts.items():
            target = _target(write, tp)
            if v.passed:
                records.append(VerdictRecord(target, v, FORWARDED, None, False))
                continue
            enforce = ctx.mode is Enforcement.ENFORCE
            choice = self._timed_out_write(ctx, v, clock) or \
                self.policy.error_for(ctx.api, v.outcome, ctx.client.family, v.underlying)
            records.append(VerdictRecord(target, v, "rejected" if enforce else "forwarded_unenforced", choice, enforce))
            if enforce:
                rejections[tp] = Rejection(choice.code, choice.render(v.underlying))
        passed = [v for v in verdicts.values() if v.passed]
        decision = self._shape(ctx, write, rejections)
        decision.records = records
        decision.elapsed_ms = (clock.perf() - started) * 1000
        decision.cpu_ms = cpu_ms
        if passed and decision.forward is not None:
            decision.evidence_at = clock.perf()
            decision.evidence = _weakest(passed)
        return decision

    @staticmethod
    def _shape(ctx: RequestContext, write: Write, rejections: dict[TopicPartition, Rejection]) -> Decision:
        """Forward as is, forward a reduced request, or answer alone."""
        if not rejections:
            return Decision(forward=ctx.frame, context=ctx)
        header, request = ctx.decoded()
        correlation_id = int(header.correlation_id)
        match write:
            case OffsetCommitWrite():
                code = next(iter(rejections.values())).error_code
                body = txn_offset_commit_rejection(request, ctx.api_version, code)
                out_header = schemas.response_header_for(TXN_OFFSET_COMMIT_KEY, ctx.api_version, correlation_id)
            case ProduceWrite(partitions=partitions):
                if not all((p.topic, p.partition) in rejections for p in partitions):
                    reduced = without_partitions(request, rejections)
                    return Decision(forward=schemas.encode(header, reduced), rejections=rejections, context=ctx)
                body = merged_produce_response(request, ctx.api_version, None, rejections)
                out_header = schemas.response_header_for(PRODUCE_KEY, ctx.api_version, correlation_id)
            case _:
                assert_never(write)
        return Decision(forward=None, rejections=rejections, local_response=schemas.encode(out_header, body),
                        context=ctx)

    # -- coordinator-side timeouts (the KIP-588 idea; verification/timeouts.py) -------------------------------

    def wants_lifecycle(self, key: int, version: int) -> bool:
        """EndTxn and KIP-360 InitProducerId are checked only with the policy's timeout_recovery on."""
        if not self.policy.timeout_recovery:
            return False
        # EndTxn v5+ is transaction version 2: the client bumps its epoch with every transaction itself.
        return (key == END_TXN and version <= LAST_END_TXN_VERSION_BEFORE_TV2) or \
            (key == INIT_PRODUCER_ID and version >= FIRST_BUMP_VERSION)

    def check_lifecycle(self, frame: memoryview, version: int, client: ClientInfo,
                        clock: Clock) -> Decision | PendingCheck:
        """EndTxn or InitProducerId of a transaction this proxy saw outlive its timeout: ask the
        coordinator first. Anything else passes at once, observed as it always is."""
        started = clock.perf()
        try:
            header, req = schemas.decode_request(frame[4:])
        except BoundsExceeded:
            raise
        except CodecError:
            return Decision(forward=frame)  # the broker judges what kio refuses; we only watch
        key, now_ms = int(header.request_api_key), clock.wall_ms()
        txn_id = str(req.transactional_id) if req.transactional_id else ""
        pid, epoch = int(req.producer_id), int(req.producer_epoch)
        candidate = self.registry.timeout_candidate(txn_id, pid, epoch, now_ms) \
            if txn_id and pid >= 0 and epoch >= 0 and self.policy.mode_for(txn_id) is Enforcement.ENFORCE else None
        kind: TimedOutEndTxn | TimedOutInitProducerId
        if key == END_TXN:
            kind = TimedOutEndTxn(bool(req.committed))
            if candidate is None or end_txn_reply(client.family, kind.committed) is None:
                self.registry.end_txn(txn_id, pid, epoch, now_ms)
                return Decision(forward=frame, observe=self._end_txn_sent(txn_id, pid, epoch, kind.committed,
                                                                          client.connection_id, now_ms))
        else:
            kind = TimedOutInitProducerId()
            if candidate is None:
                return Decision(forward=frame, observe=_init_producer_id_seen(req))
        ctx = RequestContext(kind, version, txn_id, pid, epoch, Enforcement.ENFORCE, frame, header, req, client)
        return PendingCheck(ctx, DescribeTransaction(txn_id), started)

    def _timeout_decision(self, ctx: RequestContext, answer: TransactionDescription | TransactionDescriptionFailed,
                          started: float, clock: Clock) -> Decision:
        req, now_ms, kind = ctx.request, clock.wall_ms(), ctx.kind
        candidate = self.registry.timeout_candidate(ctx.transactional_id, ctx.producer_id, ctx.producer_epoch,
                                                    now_ms)
        why: str | None
        match answer:
            case TransactionDescription(description=desc):
                why = timed_out(desc, candidate) if candidate is not None else None
            case TransactionDescriptionFailed():
                why = None  # no answer proves no timeout: the request passes as it is
            case _:
                assert_never(answer)
        match kind:
            case TimedOutEndTxn(committed=committed):
                reply = end_txn_reply(ctx.client.family, committed)
                if why is None or reply is None:
                    self.registry.end_txn(ctx.transactional_id, ctx.producer_id, ctx.producer_epoch, now_ms)
                    return Decision(forward=ctx.frame, observe=self._end_txn_sent(
                        ctx.transactional_id, ctx.producer_id, ctx.producer_epoch, committed,
                        ctx.client.connection_id, now_ms))
                # Not forwarded: the coordinator would answer PRODUCER_FENCED. The registry keeps the
                # candidate, so the client's InitProducerId that follows is rewritten.
                m = schemas.response_schema(END_TXN, ctx.api_version)
                body = m(throttle_time=datetime.timedelta(0), error_code=ErrorCode(reply.code))
                out_header = schemas.response_header_for(END_TXN, ctx.api_version, int(ctx.header.correlation_id))
                choice = ErrorChoice(reply.code)
                return self._timeout_record(Decision(forward=None, local_response=schemas.encode(out_header, body),
                                                     context=ctx), why, f"{reply.why}: answered {choice.name}",
                                            choice, started, clock)
            case TimedOutInitProducerId():
                if why is None:
                    return Decision(forward=ctx.frame, observe=_init_producer_id_seen(req))
                # The coordinator's own compare-and-set decides: it bumps E+1 to E+2 only if E+1 is current.
                bumped = replace(req, producer_epoch=i16(ctx.producer_epoch + 1))
                observe = _init_producer_id_seen(req)
                return self._timeout_record(
                    Decision(forward=schemas.encode(ctx.header, bumped), observe=observe, context=ctx),
                    why, f"InitProducerId sent with the coordinator's epoch {ctx.producer_epoch + 1}", None, started,
                    clock)
            case ProduceWrite() | OffsetCommitWrite() | HeldForEndTxn():
                raise AssertionError(f"{ctx.api} is not checked for a coordinator timeout")
            case _:
                assert_never(kind)

    def _timed_out_write(self, ctx: RequestContext, verdict: Verdict, clock: Clock) -> ErrorChoice | None:
        """A late write of a transaction the registry saw outlive its timeout, for a family that
        bumps its epoch by itself on a Produce error (timeouts.PRODUCE_REPLIES): that error, so
        that the bump (which the proxy then claims, or the coordinator aborts with) follows."""
        if not self.policy.timeout_recovery or verdict.outcome is not Outcome.LATE_WRITE or \
                not isinstance(ctx.kind, ProduceWrite):
            return None
        code = PRODUCE_REPLIES.get(ctx.client.family)
        if code is None or self.registry.timeout_candidate(ctx.transactional_id, ctx.producer_id,
                                                           ctx.producer_epoch, clock.wall_ms()) is None:
            return None
        return ErrorChoice(code)

    @staticmethod
    def _timeout_record(decision: Decision, why: str, what: str, choice: ErrorChoice | None, started: float,
                        clock: Clock) -> Decision:
        assert decision.context is not None
        verdict = Verdict(Outcome.FENCED, Evidence.COORDINATOR, f"{why}; {what}", "TRANSACTION_TIMED_OUT")
        decision.records = [VerdictRecord(f"txn:{decision.context.transactional_id}", verdict, TIMEOUT_RECOVERED,
                                          choice, True)]
        decision.elapsed_ms = (clock.perf() - started) * 1000
        return decision


LAST_END_TXN_VERSION_BEFORE_TV2 = 4
TIMEOUT_RECOVERED = "timeout_recovered"  # the audit record's decision for a KIP-588 rewrite

"""Hanging transactions, the IO half: ask the brokers what `find-hanging` asks, abort as `abort` does.

The judgement is pure (txnguard.verification.hanging); this module carries out its steps on its
own connections (never a client's):

* Metadata for the partitions in scope and the brokers;
* DescribeProducers to each partition's leader, and only to it, in batches of 500 partitions. A follower
  answers DescribeProducers from its own log too, and one that is catching up shows a transaction whose
  marker it has not fetched yet as open: a false finding. So `--broker-id` picks the partitions (those
  with a replica there), not the broker asked, and a sidecar scans only the partitions its broker leads
  (it learns its broker's id with DescribeConfigs: a broker describes only itself), so that each finding
  is reported by one sidecar;
* ListTransactions on every broker, filtered to the candidates' producer ids;
* FindCoordinator + DescribeTransactions for their transactional ids;
* under the own-timeout rule (the default), DescribeProducers once more for the partitions found, after
  the coordinators answered, to each partition's leader as fresh metadata names it then (a leader that
  moved meanwhile is not asked through a stale view): a finding stands only if its open transaction is
  still there;
* when there are candidates whose transaction timeout the coordinator cannot give, DescribeConfigs of
  every broker's transaction.max.timeout.ms: the largest is the threshold for them (no transaction may
  ask for a longer timeout; Kafka's default, 15 minutes, when no broker answers);
* on brokers that lack ListTransactions (Kafka < 3.0: each connection reads the broker's ApiVersions and
  never sends what it does not list), the coordinator's own log instead: `__transaction_state` read to its
  end, after DescribeProducers answered (a one-shot read with the log follower's own reading loop,
  LogFollower.read_once; the proxy's periodic scan reads its running follower's partitions to their end
  instead), gives each producer id's transactional id, state, partitions and timeout, judged as a
  DescribeTransactions answer (verification/hanging.py CONFIRMED_BY_LOG). A producer id the log does not
  hold, or every candidate when the log may not be read (no DESCRIBE or READ on the topic: one line says
  so), is reported unconfirmed (UNCONFIRMED): DescribeProducers alone cannot tell a hanging transaction
  from one whose abort marker is still being written, nor from a live one whose producer writes old
  timestamps;
* for an abort: DescribeProducers on the partition's leader to find the producer whose open
  transaction starts at the hanging transaction's start offset, then WriteTxnMarkers (abort,
  TransactionResult=false) to the leader with its producer id, epoch and coordinator epoch (0 when
  it has none): what Admin.abortTransaction sends for `kafka-transactions.sh abort`.

Used by `txnguard hanging` (proxy/hanging_cli.py: any cluster, proxy or not) and, with
`health.hanging_scan_interval_s`, by the proxy itself (proxy/hanging_monitor.py): a periodic scan that
exports gauges, logs each finding once and writes one audit record per new finding. This module knows
neither of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.describe_configs.v1.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.list_transactions.v0.request import ListTransactionsRequest
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
)
from kio.static.primitive import i8, i16, i32

from txnguard.codecs.describe_transactions import read_describe_transactions_v0
from txnguard.codecs.errors import CodecError
from txnguard.codecs.schemas import api_name
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.codecs.transaction_log import TOPIC as TRANSACTION_LOG
from txnguard.proxy.config import HostPort
from txnguard.proxy.kafka_client import BrokerConnections, UnsupportedApi, UpstreamError
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.hanging import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
    MINUTE_MS,
    AbortSpec,
    AskDescriptions,
    AskProducers,
    AskProducersAgain,
    AskTransactionalIds,
    Done,
    Finding,
    HangingScan,
    OwnTimeout,
    ProducerState,
    Rule,
    Step,
    TransactionView,
    abort_spec,
    producers_in_log,
    transaction_view,
)
from txnguard.verification.transaction_log_view import TransactionLogView

RETRIABLE_COORDINATOR = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                                   ErrorCode.not_coordinator})
ATTEMPTS = 5
NOT_HELD = frozenset({"NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION"})
BACKOFF_S = 0.2
DESCRIBE_CONCURRENCY = 16  # transactional ids described at once
BROKER_RESOURCE = 4        # DescribeConfigs' resource type of a broker (ConfigResource.Type.BROKER)
TRANSACTION_MAX_TIMEOUT = "transaction.max.timeout.ms"
# transaction.max.timeout.ms is read-only (a broker restart changes it): the periodic scan, which may need it every
# second, reads it again after this long rather than asking every broker each time.
MAX_TIMEOUT_TTL_S = 300.0


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class LogRead:
    """The coordinator's log, read to its end for one scan: producer id -> its transactional id's description
    (`producers_in_log`), and why it could not be read (None: read), or which of its partitions were not."""

    producers: dict[int, TransactionView]
    problem: str | None = None
    unread_partitions: tuple[int, ...] = ()


TransactionLogSource = Callable[[], Awaitable[LogRead]]


class _Quiet:
    """The one-shot reader's logger: the command says what went wrong in one line of its own (LogRead.problem)."""

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *_args, **_kwargs: None


def log_read_of(follower: LogFollower, read: set[int]) -> LogRead:
    """What a follower (one-shot or running) read, for the scan."""
    if follower.denied:
        return LogRead({}, f"the principal may not DESCRIBE or READ {TRANSACTION_LOG} ({follower.problem})")
    if follower.topic_exists is False:
        return LogRead({})  # no transaction ever on this cluster: no producer id to know
    if not read:
        return LogRead({}, f"{TRANSACTION_LOG} was not read to its end: {follower.problem or 'no partition read'}")
    count = follower.view.partition_count
    unread = tuple(sorted(set(range(count) if count is not None else follower.leaders) - read))  # leaderless too
    return LogRead(producers_in_log(follower.view, read), None, unread)


async def read_from_follower(follower: LogFollower, budget_s: float) -> LogRead:
    """The running follower's view, its partitions read to their end as of now (only those it reads healthily:
    read once, leader answering)."""
    if follower.denied:
        return log_read_of(follower, set())
    usable = [p for p in follower.leaders if follower.partition_usable(p)]
    return log_read_of(follower, await follower.read_to_end(usable, budget_s))


class HangingScanError(RuntimeError):
    """A step of the scan could not be carried out (the tool would exit 1 here too)."""


class MissingApi(HangingScanError):
    """A broker does not offer an API (or the version) a step needs; nothing was sent to it. The message is one
    line naming the API, its version and the broker, for the command to print as it is."""

    def __init__(self, broker: str, cause: UnsupportedApi) -> None:
        name = "".join(w.title() for w in api_name(cause.api_key).split("_"))
        offered = (f"it offers v{cause.offered[0]}-v{cause.offered[1]}" if cause.offered
                   else "its ApiVersions does not list it")
        super().__init__(f"{broker} does not offer {name} v{cause.version} ({offered})")
        self.api_key = cause.api_key
        self.version = cause.version


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


@dataclass(frozen=True)
class PartitionInfo:
    leader: int
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class ClusterView:
    brokers: dict[int, HostPort]
    partitions: dict[TopicPartition, PartitionInfo]


@dataclass(frozen=True)
class Scope:
    """What to search, as find-hanging's options: --topic [--partition], --broker-id.

    `local_broker`: every partition, asked of the first bootstrap broker only (a sidecar's own
    broker): the partitions it holds answer, the others answer an error and are left out, as
    `--broker-id` of that broker would.
    """

    topic: str | None = None
    partition: int | None = None
    broker_id: int | None = None
    local_broker: bool = False


@dataclass
class ScanResult:
    findings: tuple[Finding, ...]
    now_ms: int
    partitions: int                       # partitions in scope
    described: int                        # partitions whose producers were described
    oldest_open_age_ms: int | None
    errors: dict[TopicPartition, str] = field(default_factory=dict)  # partitions that answered an error
    # The brokers lack ListTransactions (Kafka < 3.0) and the coordinator's log could not be read: candidates
    # reported as they are.
    unconfirmed: bool = False
    # The threshold of a transaction whose own timeout is unknown (own-timeout rule), and where it came from;
    # None when no candidate needed it.
    unknown_timeout_ms: int | None = None
    unknown_timeout_source: str | None = None
    # Kafka < 3.0 with candidates: "read" when the coordinator's log was read in place of ListTransactions and
    # DescribeTransactions, else why not; None when it was not needed.
    transaction_log: str | None = None
    transaction_log_unread: tuple[int, ...] = ()  # its partitions not read to their end (their ids unconfirmed)


class ClusterAdmin:
    """The few admin requests the scan and the abort need, over the proxy's own connections."""

    def __init__(self, bootstrap: Sequence[HostPort], *, ssl_context: Any = None, timeout_s: float = 10.0,
                 address_of: Callable[[str, int], HostPort] | None = None, auth: Any = None) -> None:
        if not bootstrap:
            raise ValueError("no bootstrap address")
        self.bootstrap = tuple(bootstrap)
        self.ssl_context = ssl_context
        self.auth = auth  # upstream_auth: the proxy's own SASL principal
        self.timeout_s = timeout_s
        self.address_of = address_of or (lambda host, port: HostPort(host, port))
        self._connections = BrokerConnections(ssl_context=ssl_context, connect_timeout_s=timeout_s, auth=auth)
        self._broker_ids: dict[HostPort, int] = {}  # from the last metadata: to name a broker in an error
        self._own_id: int | None = None             # a sidecar's broker (bootstrap[0]), once learned
        self._max_timeout: tuple[float, tuple[int, str]] | None = None  # (monotonic time read, answer)

    async def close(self) -> None:
        self._connections.close()
        self._own_id = self._max_timeout = None  # after a failure the next scan learns both again

    def name_of(self, address: HostPort) -> str:
        broker_id = self._broker_ids.get(address)
        return f"broker {address}" if broker_id is None else f"broker {broker_id} ({address})"

    async def request(self, address: HostPort, payload: Any) -> Any:
        conn = await self._connections.get(address)
        try:
            return await conn.request(payload, self.timeout_s)
        except UnsupportedApi as e:  # a definite answer: say which API and which broker, in one line
            raise MissingApi(self.name_of(address), e) from None

    async def _any_broker(self, payload: Any) -> Any:
        last: Exception | None = None
        for address in self.bootstrap:
            try:
                return await self.request(address, payload)
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                last = e
        raise HangingScanError(f"no bootstrap broker answered: {last}")

    async def metadata(self, topic: str | None = None) -> ClusterView:
        topics = None if topic is None else (MetadataRequestTopic(name=TopicName(topic)),)
        resp = await self._any_broker(MetadataRequest(
            topics=topics, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False))
        brokers = {int(b.node_id): self.address_of(str(b.host), int(b.port)) for b in resp.brokers}
        self._broker_ids.update({address: broker_id for broker_id, address in brokers.items()})
        partitions: dict[TopicPartition, PartitionInfo] = {}
        for t in resp.topics:
            if t.error_code != ErrorCode.none:
                if topic is not None:
                    raise HangingScanError(f"topic {topic}: {_error_name(int(t.error_code))}")
                continue
            for p in t.partitions:
                partitions[(str(t.name), int(p.partition_index))] = PartitionInfo(
                    int(p.leader_id), tuple(int(r) for r in p.replica_nodes))
        return ClusterView(brokers, partitions)

    async def read_transaction_log(self) -> LogRead:
        """`__transaction_state` read once to its end as of now, on connections of its own (the log follower's
        reading loop, not followed after), with this admin's TLS, SASL and timeout."""
        follower = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: self.bootstrap, self.address_of,
                               ssl_context=self.ssl_context, auth=self.auth, connect_timeout_s=self.timeout_s,
                               timeout_s=self.timeout_s, log=_Quiet())
        try:
            return log_read_of(follower, await follower.read_once(self.timeout_s))
        finally:
            await follower.close()

    async def broker_config(self, address: HostPort, broker_ids: Iterable[int], key: str,
                            ) -> tuple[dict[int, str | None], dict[int, str]]:
        """DescribeConfigs of BROKER resources, asked of one broker: (id -> value, id -> error name). A broker
        describes only itself (another id: INVALID_REQUEST), which is how a sidecar learns its broker's id."""
        resp = await self.request(address, DescribeConfigsRequest(resources=tuple(
            DescribeConfigsResource(resource_type=i8(BROKER_RESOURCE), resource_name=str(b), configuration_keys=(key,))
            for b in broker_ids)))
        values: dict[int, str | None] = {}
        errors: dict[int, str] = {}
        for r in resp.results:
            if r.error_code != ErrorCode.none:
                errors[int(r.resource_name)] = _error_name(int(r.error_code))
                continue
            values[int(r.resource_name)] = next((c.value for c in r.configs if c.name == key), None)
        return values, errors

    async def own_broker_id(self, view: ClusterView) -> int:
        """The id of the broker at bootstrap[0] (a sidecar's own): the one id it describes (cached)."""
        if self._own_id is None:
            try:
                values, errors = await self.broker_config(self.bootstrap[0], sorted(view.brokers),
                                                          TRANSACTION_MAX_TIMEOUT)
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                raise HangingScanError(f"DescribeConfigs to {self.bootstrap[0]}: {e}") from e
            if len(values) != 1:
                raise HangingScanError(
                    f"cannot tell which broker {self.bootstrap[0]} is: DescribeConfigs of brokers "
                    f"{sorted(view.brokers)} answered {errors or values} (a sidecar's scan needs DESCRIBE_CONFIGS on "
                    "the cluster to learn its broker's id, so that it asks only the partitions that broker leads)")
            (self._own_id,) = values
        return self._own_id

    async def transaction_max_timeout_ms(self, view: ClusterView) -> tuple[int, str]:
        """The cluster's transaction.max.timeout.ms (the largest any broker gives, each asked for its own), and
        where it came from; Kafka's default (15 minutes) when no broker answers (never kept: the next scan asks)."""
        if self._max_timeout is not None and time.monotonic() - self._max_timeout[0] < MAX_TIMEOUT_TTL_S:
            return self._max_timeout[1]

        async def one(broker_id: int, address: HostPort) -> int | str:
            try:
                values, errors = await self.broker_config(address, [broker_id], TRANSACTION_MAX_TIMEOUT)
                value = values.get(broker_id)
                return int(value) if value is not None else errors.get(broker_id, "not listed")
            except (HangingScanError, UpstreamError, OSError, CodecError, TimeoutError, ValueError) as e:
                return str(e)

        answers = dict(zip(view.brokers, await asyncio.gather(*(one(b, a) for b, a in view.brokers.items())),
                           strict=True))
        known = {b: v for b, v in answers.items() if isinstance(v, int)}
        if known:
            answer = max(known.values()), f"{TRANSACTION_MAX_TIMEOUT} of brokers {sorted(known)} (DescribeConfigs)"
            self._max_timeout = time.monotonic(), answer
            return answer
        return (DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN * MINUTE_MS,
                f"Kafka's default {TRANSACTION_MAX_TIMEOUT}: no broker described it ({answers})")

    async def describe_producers(self, address: HostPort, tps: Sequence[TopicPartition],
                                 ) -> tuple[dict[TopicPartition, list[ProducerState]], dict[TopicPartition, str]]:
        by_topic: dict[str, list[int]] = {}
        for topic, p in tps:
            by_topic.setdefault(topic, []).append(p)
        topics = tuple(TopicRequest(name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps))
                       for t, ps in by_topic.items())
        resp = await self.request(address, DescribeProducersRequest(topics=topics))
        answers: dict[TopicPartition, list[ProducerState]] = {}
        errors: dict[TopicPartition, str] = {}
        for t in resp.topics:
            for p in t.partitions:
                tp = (str(t.name), int(p.partition_index))
                if p.error_code != ErrorCode.none:
                    errors[tp] = _error_name(int(p.error_code))
                    continue
                answers[tp] = [ProducerState(int(s.producer_id), int(s.producer_epoch), int(s.last_timestamp),
                                             int(s.coordinator_epoch), int(s.current_txn_start_offset),
                                             int(s.last_sequence)) for s in p.active_producers]
        return answers, errors

    async def list_transactions(self, brokers: Iterable[HostPort], producer_ids: Iterable[int],
                                ) -> list[tuple[str, int]]:
        """ListTransactions on every broker (each answers for the coordinators it hosts)."""
        request = ListTransactionsRequest(state_filters=(), producer_id_filters=tuple(
            ProducerId(p) for p in sorted(producer_ids)))

        async def one(address: HostPort) -> list[tuple[str, int]]:
            for attempt in range(ATTEMPTS):
                try:
                    resp = await self.request(address, request)
                except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                    raise HangingScanError(f"ListTransactions to {address}: {e}") from e
                if resp.error_code == ErrorCode.none:
                    return [(str(s.transactional_id), int(s.producer_id)) for s in resp.transaction_states]
                if resp.error_code != ErrorCode.coordinator_load_in_progress or attempt == ATTEMPTS - 1:
                    raise HangingScanError(f"ListTransactions to {address}: {_error_name(int(resp.error_code))}")
                await asyncio.sleep(BACKOFF_S)
            raise AssertionError("unreachable")

        answers = await asyncio.gather(*(one(a) for a in dict.fromkeys(brokers)))
        return [listing for answer in answers for listing in answer]

    async def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TransactionView | None]:
        """Each id's description; None for TRANSACTIONAL_ID_NOT_FOUND (the tool's "no description"). Up to
        DESCRIBE_CONCURRENCY ids at a time (the own-timeout rule asks about every open transaction older than
        its margin, so there can be many; the connections pipeline their requests)."""
        ids = sorted(transactional_ids)
        gate = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

        async def one(txn_id: str) -> TransactionView | None:
            async with gate:
                return await self._describe_one(txn_id)

        return dict(zip(ids, await asyncio.gather(*(one(i) for i in ids)), strict=True))

    async def _describe_one(self, txn_id: str) -> TransactionView | None:
        last = ""
        for _ in range(ATTEMPTS):
            found = await self._any_broker(FindCoordinatorRequest(key=txn_id, key_type=i8(1)))
            if found.error_code != ErrorCode.none:
                last = _error_name(int(found.error_code))
                if found.error_code not in RETRIABLE_COORDINATOR:
                    raise HangingScanError(f"FindCoordinator {txn_id}: {last}")
                await asyncio.sleep(BACKOFF_S)
                continue
            address = self.address_of(str(found.host), int(found.port))
            try:
                conn = await self._connections.get(address)
                _, _, frame = await conn.request_raw(DescribeTransactionsRequest(
                    transactional_ids=(TransactionalId(txn_id),)), self.timeout_s)
                (desc,) = read_describe_transactions_v0(frame[5:])  # header v1: correlation id + tags
            except UnsupportedApi as e:
                raise MissingApi(self.name_of(address), e) from None
            except (UpstreamError, OSError, CodecError, TimeoutError, ValueError) as e:
                raise HangingScanError(f"DescribeTransactions {txn_id} at {address}: {e}") from e
            if desc.error_code == ErrorCode.none:
                return transaction_view(desc)
            if desc.error_code == ErrorCode.transactional_id_not_found:
                return None
            last = _error_name(desc.error_code)
            if desc.error_code not in RETRIABLE_COORDINATOR:
                raise HangingScanError(f"DescribeTransactions {txn_id}: {last}")
            await asyncio.sleep(BACKOFF_S)
        raise HangingScanError(f"DescribeTransactions {txn_id}: still {last} after {ATTEMPTS} attempts")

    async def write_abort_marker(self, address: HostPort, spec: AbortSpec) -> int:
        """WriteTxnMarkers with TransactionResult=false for one partition; the partition's error code."""
        resp = await self.request(address, WriteTxnMarkersRequest(markers=(WritableTxnMarker(
            producer_id=ProducerId(spec.producer_id), producer_epoch=i16(spec.producer_epoch), transaction_result=False,
            topics=(WritableTxnMarkerTopic(name=TopicName(spec.topic), partition_indexes=(i32(spec.partition),)),),
            coordinator_epoch=i32(spec.coordinator_epoch)),)))
        for marker in resp.markers:
            for t in marker.topics:
                for p in t.partitions:
                    if (str(t.name), int(p.partition_index)) == (spec.topic, spec.partition):
                        return int(p.error_code)
        raise HangingScanError(f"WriteTxnMarkers response did not name {spec.topic}-{spec.partition}")


# -- the scan ------------------------------------------------------------------------------------------------


def _in_scope(view: ClusterView, scope: Scope, own: int | None) -> list[TopicPartition]:
    if scope.topic is not None and scope.partition is not None:
        return [(scope.topic, scope.partition)]
    if own is not None:  # a sidecar: what its broker leads (each partition is some sidecar's, once)
        return sorted(tp for tp, info in view.partitions.items() if info.leader == own)
    return sorted(tp for tp, info in view.partitions.items()
                  if scope.broker_id is None or scope.broker_id in info.replicas)


def _leaders(admin: ClusterAdmin, view: ClusterView, own: int | None) -> Callable[[TopicPartition], HostPort | None]:
    """Whom to ask about a partition: its leader in `view`, never a follower (None: no leader to ask). A sidecar
    asks its own broker directly (bootstrap[0]), and only about what that broker leads in `view`."""
    def target(tp: TopicPartition) -> HostPort | None:
        info = view.partitions.get(tp)
        if info is None:
            return None
        if own is not None:
            return admin.bootstrap[0] if info.leader == own else None
        return view.brokers.get(info.leader)
    return target


async def scan(admin: ClusterAdmin, scope: Scope, rule: Rule, clock: Callable[[], int] = now_ms,
               transaction_log: TransactionLogSource | None = None) -> ScanResult:
    """One scan of `scope` under `rule` (MaxTimeout: find-hanging's; OwnTimeout: each transaction's own
    timeout): the pure HangingScan's steps, carried out, every DescribeProducers to the partition's leader.
    `transaction_log`: how to read the coordinator's log where ListTransactions is missing (default: once, to its
    end, `ClusterAdmin.read_transaction_log`)."""
    view = await admin.metadata(scope.topic)
    if scope.broker_id is not None and scope.broker_id not in view.brokers:
        raise HangingScanError(f"broker {scope.broker_id} is not in the cluster's metadata")
    own = await admin.own_broker_id(view) if scope.local_broker else None
    partitions = _in_scope(view, scope, own)
    target = _leaders(admin, view, own)

    # Partitions of one broker next to each other, so a batch of 500 goes to as few brokers as possible.
    partitions.sort(key=lambda tp: (str(target(tp)), tp))
    hs = HangingScan(partitions, rule)
    errors: dict[TopicPartition, str] = {}
    unconfirmed = False
    log: LogRead | None = None
    unknown: tuple[int, str] | None = None
    step: Step = hs.start()
    while not isinstance(step, Done):
        if isinstance(step, AskProducers):
            answers = await _describe_batch(admin, step.partitions, target, errors)
            step = hs.producers_answered(answers, clock())
        elif isinstance(step, AskTransactionalIds):
            if isinstance(hs.rule, OwnTimeout):
                given = hs.rule.unknown_ms
                # Candidates exist: the threshold of one whose timeout nobody can give is the cluster's maximum.
                unknown = await admin.transaction_max_timeout_ms(view) if given is None else (given, "given")
                hs.rule = dataclasses.replace(hs.rule, unknown_ms=unknown[0])
            try:
                listings = await admin.list_transactions(view.brokers.values(), step.producer_ids)
            except MissingApi:  # Kafka < 3.0: never sent; the coordinator's log, read now, stands in for it
                log = await (transaction_log or admin.read_transaction_log)()
                if log.problem is None:
                    step = hs.transaction_log_answered(log.producers)
                else:  # the candidates stand unconfirmed
                    step, unconfirmed = hs.transactional_ids_unavailable(), True
                continue
            step = hs.transactional_ids_answered(listings)
        elif isinstance(step, AskDescriptions):
            step = hs.descriptions_answered(await admin.describe_transactions(step.transactional_ids))
        elif isinstance(step, AskProducersAgain):
            # The leader as known now: leadership may have moved since the first look (a failure, or a partition
            # no longer this sidecar's: not confirmed this time).
            fresh = _leaders(admin, await admin.metadata(scope.topic), own)
            step = hs.producers_answered_again(await _describe_batch(admin, step.partitions, fresh, {}))
    if scope.local_broker:  # partitions the local broker does not hold are not in its scope
        errors = {tp: e for tp, e in errors.items() if e not in NOT_HELD}
    return ScanResult(step.findings, clock(), len(partitions), hs.described_partitions, hs.oldest_open_age_ms, errors,
                      unconfirmed, unknown[0] if unknown else None, unknown[1] if unknown else None,
                      transaction_log=None if log is None else log.problem or "read",
                      transaction_log_unread=() if log is None else log.unread_partitions)


async def _describe_batch(admin: ClusterAdmin, partitions: Sequence[TopicPartition],
                          target: Callable[[TopicPartition], HostPort | None],
                          errors: dict[TopicPartition, str]) -> dict[TopicPartition, list[ProducerState]]:
    """One AskProducers step: a DescribeProducers per broker, at once; failures go to `errors`."""
    by_broker: dict[HostPort, list[TopicPartition]] = {}
    for tp in partitions:
        address = target(tp)
        if address is None:
            errors[tp] = "LEADER_NOT_AVAILABLE"
        else:
            by_broker.setdefault(address, []).append(tp)
    answers: dict[TopicPartition, list[ProducerState]] = {}
    results = await asyncio.gather(*(admin.describe_producers(a, tps) for a, tps in by_broker.items()),
                                   return_exceptions=True)
    for (address, tps), result in zip(by_broker.items(), results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, UpstreamError | OSError | CodecError | TimeoutError):
                raise result
            errors.update({tp: f"no answer from {address}: {result}" for tp in tps})
            continue
        answers.update(result[0])
        errors.update(result[1])
    return answers


# -- abort ---------------------------------------------------------------------------------------------------


@dataclass
class AbortPlan:
    finding: Finding
    spec: AbortSpec | None          # None: no open transaction starts at the finding's offset any more
    leader: HostPort | None


async def plan_abort(admin: ClusterAdmin, finding: Finding) -> AbortPlan:
    """`kafka-transactions.sh abort --topic --partition --start-offset`: look the producer up on the leader."""
    view = await admin.metadata(finding.topic)
    info = view.partitions.get((finding.topic, finding.partition))
    leader = view.brokers.get(info.leader) if info is not None else None
    if leader is None:
        raise HangingScanError(f"{finding.topic}-{finding.partition} has no leader")
    answers, errors = await admin.describe_producers(leader, [(finding.topic, finding.partition)])
    tp = (finding.topic, finding.partition)
    if tp in errors:
        raise HangingScanError(f"DescribeProducers {finding.topic}-{finding.partition}: {errors[tp]}")
    return AbortPlan(finding, abort_spec(finding.topic, finding.partition, answers.get(tp, []), finding.start_offset),
                     leader)


async def abort(admin: ClusterAdmin, plan: AbortPlan) -> str:
    """Send the abort marker; the error name ("NONE" on success). A moved leader is looked up once more."""
    assert plan.spec is not None and plan.leader is not None
    code = await admin.write_abort_marker(plan.leader, plan.spec)
    if code == ErrorCode.not_leader_or_follower:
        fresh = await plan_abort(admin, plan.finding)
        if fresh.spec is None or fresh.leader is None:
            return "TRANSACTION_GONE"
        code = await admin.write_abort_marker(fresh.leader, fresh.spec)
    return _error_name(code)

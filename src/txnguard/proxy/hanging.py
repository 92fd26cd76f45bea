"""Hanging transactions, the IO half: ask the brokers what `find-hanging` asks, abort as `abort` does.

The judgement is pure (txnguard.verification.hanging); this module carries out its steps on its
own connections (never a client's):

* Metadata for the partitions in scope and the brokers;
* DescribeProducers to each partition's leader (or to `--broker-id`, or to a sidecar's own broker),
  in batches of 500 partitions;
* ListTransactions on every broker, filtered to the candidates' producer ids;
* FindCoordinator + DescribeTransactions for their transactional ids;
* on brokers that lack ListTransactions (Kafka < 3.0: each connection reads the broker's ApiVersions and
  never sends what it does not list), the candidates are reported unconfirmed (verification/hanging.py
  UNCONFIRMED): DescribeProducers alone cannot tell a hanging transaction from one whose abort marker
  is still being written;
* for an abort: DescribeProducers on the partition's leader to find the producer whose open
  transaction starts at the hanging transaction's start offset, then WriteTxnMarkers (abort,
  TransactionResult=false) to the leader with its producer id, epoch and coordinator epoch (0 when
  it has none): what Admin.abortTransaction sends for `kafka-transactions.sh abort`.

Used by `txnguard hanging` (any cluster, proxy or not) and, with `health.hanging_scan_interval_s`,
by the proxy itself (`HangingMonitor`): a periodic scan that exports gauges, logs each finding
once and writes one audit record per new finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

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
from txnguard.proxy import logs
from txnguard.proxy.config import HostPort, ProxyMode
from txnguard.proxy.kafka_client import BrokerConnections, UnsupportedApi, UpstreamError
from txnguard.verification.audit import hanging_record
from txnguard.verification.hanging import (
    AbortSpec,
    AskDescriptions,
    AskProducers,
    AskTransactionalIds,
    Done,
    Finding,
    FindingTracker,
    HangingScan,
    ProducerState,
    Step,
    TopicPartition,
    TransactionView,
    abort_spec,
)

if TYPE_CHECKING:
    from txnguard.proxy.config import ProxyConfig
    from txnguard.proxy.guard import AuditLog
    from txnguard.proxy.metrics import ProxyMetrics

RETRIABLE_COORDINATOR = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                                   ErrorCode.not_coordinator})
ATTEMPTS = 5
NOT_HELD = frozenset({"NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION"})
BACKOFF_S = 0.2


def now_ms() -> int:
    return int(time.time() * 1000)


class HangingScanError(RuntimeError):
    """A step of the scan could not be carried out (the tool would exit 1 here too)."""


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
    unconfirmed: bool = False  # the brokers lack ListTransactions (Kafka < 3.0): candidates reported as they are


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

    async def close(self) -> None:
        self._connections.close()

    async def request(self, address: HostPort, payload: Any) -> Any:
        conn = await self._connections.get(address)
        return await conn.request(payload, self.timeout_s)

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
        """Each id's description; None for TRANSACTIONAL_ID_NOT_FOUND (the tool's "no description")."""
        out: dict[str, TransactionView | None] = {}
        for txn_id in sorted(transactional_ids):
            out[txn_id] = await self._describe_one(txn_id)
        return out

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
            except (UpstreamError, OSError, CodecError, TimeoutError, ValueError) as e:
                raise HangingScanError(f"DescribeTransactions {txn_id} at {address}: {e}") from e
            if desc.error_code == ErrorCode.none:
                return TransactionView(txn_id, desc.state, desc.producer_id, desc.producer_epoch, desc.partitions)
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


def _in_scope(view: ClusterView, scope: Scope) -> list[TopicPartition]:
    if scope.topic is not None and scope.partition is not None:
        return [(scope.topic, scope.partition)]
    return sorted(tp for tp, info in view.partitions.items()
                  if scope.broker_id is None or scope.broker_id in info.replicas)


async def scan(admin: ClusterAdmin, scope: Scope, max_transaction_timeout_ms: int,
               clock: Callable[[], int] = now_ms) -> ScanResult:
    """One find-hanging scan of `scope`: the pure HangingScan's steps, carried out."""
    view = await admin.metadata(scope.topic)
    if scope.broker_id is not None and scope.broker_id not in view.brokers:
        raise HangingScanError(f"broker {scope.broker_id} is not in the cluster's metadata")
    partitions = _in_scope(view, scope)

    def target(tp: TopicPartition) -> HostPort | None:
        if scope.local_broker:
            return admin.bootstrap[0]
        if scope.broker_id is not None:
            return view.brokers[scope.broker_id]
        info = view.partitions.get(tp)
        return view.brokers.get(info.leader) if info is not None else None

    # Partitions of one broker next to each other, so a batch of 500 goes to as few brokers as possible.
    partitions.sort(key=lambda tp: (str(target(tp)), tp))
    hs = HangingScan(partitions, max_transaction_timeout_ms)
    errors: dict[TopicPartition, str] = {}
    unconfirmed = False
    step: Step = hs.start()
    while not isinstance(step, Done):
        if isinstance(step, AskProducers):
            answers = await _describe_batch(admin, step.partitions, target, errors)
            step = hs.producers_answered(answers, clock())
        elif isinstance(step, AskTransactionalIds):
            try:
                listings = await admin.list_transactions(view.brokers.values(), step.producer_ids)
            except UnsupportedApi:  # Kafka < 3.0: never sent; the candidates stand unconfirmed
                step, unconfirmed = hs.transactional_ids_unavailable(), True
                continue
            step = hs.transactional_ids_answered(listings)
        elif isinstance(step, AskDescriptions):
            step = hs.descriptions_answered(await admin.describe_transactions(step.transactional_ids))
    if scope.local_broker:  # partitions the local broker does not hold are not in its scope
        errors = {tp: e for tp, e in errors.items() if e not in NOT_HELD}
    return ScanResult(step.findings, clock(), len(partitions), hs.described_partitions, hs.oldest_open_age_ms, errors,
                      unconfirmed)


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


# -- continuous detection in the proxy -----------------------------------------------------------------------


class HangingMonitor:
    """The proxy's periodic scan (`health.hanging_scan_interval_s`)."""

    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics, audit: AuditLog, ssl_context: Any = None) -> None:
        h = config.health
        assert h.hanging_scan_interval_s is not None
        self.interval_s = h.hanging_scan_interval_s
        self.max_transaction_timeout_ms = int(h.hanging_max_transaction_timeout_s * 1000)
        self.scope = Scope(local_broker=config.mode is ProxyMode.SIDECAR)
        self.admin = ClusterAdmin(config.upstream, ssl_context=ssl_context, timeout_s=config.verification.timeout_s,
                                  auth=config.upstream_auth)
        self.metrics = metrics
        self.audit = audit
        self.tracker = FindingTracker()
        self.log = logs.get(component="hanging")
        self.scans = 0
        self.last: ScanResult | None = None

    async def run(self) -> None:
        try:
            while True:
                await self.scan_once()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.admin.close()

    async def scan_once(self) -> ScanResult | None:
        m = self.metrics
        try:
            result = await scan(self.admin, self.scope, self.max_transaction_timeout_ms)
        except Exception as e:  # noqa: BLE001 - whatever failed, the next scan runs (and the proxy never notices)
            m.hanging_scans.labels("failed").inc()
            self.log.warning("hanging_scan_failed", error=str(e) if isinstance(e, HangingScanError) else repr(e))
            await self.admin.close()  # a fresh start next time
            return None
        self.scans += 1
        self.last = result
        m.hanging_scans.labels("ok").inc()
        before = self.tracker.per_partition()
        new, gone = self.tracker.update(result.findings)
        after = self.tracker.per_partition()
        for (topic, partition), n in after.items():
            m.hanging_transactions.labels(topic, str(partition)).set(n)
        for topic, partition in before.keys() - after.keys():
            with contextlib.suppress(KeyError):
                m.hanging_transactions.remove(topic, str(partition))
        m.oldest_open_transaction_age.set((result.oldest_open_age_ms or 0) / 1000)
        for f in new:
            self.log.warning("hanging_transaction_found", **_facts(f, result.now_ms),
                             max_transaction_timeout_ms=self.max_transaction_timeout_ms)
            self.audit.write(hanging_record(time_ms=result.now_ms, proxy_id=self.audit.proxy_id, finding=f,
                                            max_transaction_timeout_ms=self.max_transaction_timeout_ms))
        for f in gone:
            self.log.info("hanging_transaction_resolved", **_facts(f, result.now_ms))
        if result.errors:
            self.log.warning("hanging_scan_partial", failed_partitions=len(result.errors),
                             example=next(iter(result.errors.items())))
        return result


def _facts(f: Finding, now: int) -> dict[str, Any]:
    return {"topic": f.topic, "partition": f.partition, "producer_id": f.producer_id,
            "producer_epoch": f.producer_epoch, "coordinator_epoch": f.coordinator_epoch,
            "start_offset": f.start_offset, "last_timestamp_ms": f.last_timestamp_ms,
            "age_s": round((now - f.last_timestamp_ms) / 1000, 1), "transactional_id": f.transactional_id,
            "reason": f.reason, "coordinator_state": f.coordinator_state}


def attach(config: ProxyConfig, metrics: ProxyMetrics, audit: AuditLog, ssl_context: Any) -> HangingMonitor | None:
    """The monitor when `health.hanging_scan_interval_s` is set (off by default)."""
    if config.health.hanging_scan_interval_s is None:
        return None
    return HangingMonitor(config, metrics, audit, ssl_context)


# -- `txnguard hanging` ----------------------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "hanging", help="find hanging transactions (as kafka-transactions.sh find-hanging) and optionally abort them",
        description="Find partitions whose last stable offset is held by a transaction the coordinator will never "
                    "finish, judged exactly as kafka-transactions.sh find-hanging. Works against any cluster, "
                    "through a txnguard proxy or not. With neither --topic nor --broker-id every topic (internal ones "
                    "too) is searched, each partition asked of its leader.")
    p.add_argument("--bootstrap", help="host:port[,host:port...] of the cluster (or of a proxy); default: the "
                                       "upstream of --config")
    p.add_argument("--config", help="a txnguard proxy config: its upstream, upstream_tls and upstream_auth (SASL "
                                    "SCRAM) are used, so the scan runs as the proxy's own principal, as the proxy's "
                                    "periodic scan does (TXNGUARD_* environment overrides apply, e.g. the password)")
    p.add_argument("--topic", help="search this topic only")
    p.add_argument("--partition", type=int, help="and this partition only (needs --topic)")
    p.add_argument("--broker-id", type=int, help="search the partitions with a replica on this broker, asking it")
    p.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                   help="open transactions whose producer last wrote longer ago than this are candidates (default "
                        "15, the tool's; keep it at least the cluster's transaction.max.timeout.ms)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tool's table")
    p.add_argument("--abort", action="store_true",
                   help="abort the hanging transactions found (WriteTxnMarkers, as kafka-transactions.sh abort); "
                        "a dry run unless confirmed with --yes or at the interactive prompt")
    p.add_argument("--start-offset", type=int, help="with --abort: only the transaction starting at this offset")
    p.add_argument("--yes", action="store_true", help="with --abort: abort without asking")
    p.add_argument("--dry-run", action="store_true", help="with --abort: only show what would be aborted")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for each request (default 30)")


def run_cli(args: Any, *, stdin: Any = None, stdout: Any = None, stderr: Any = None) -> int:
    import sys

    from txnguard.proxy.config import ConfigError, parse_host_port

    out, err, inp = stdout or sys.stdout, stderr or sys.stderr, stdin or sys.stdin
    if args.partition is not None and args.topic is None:
        print("txnguard hanging: --partition needs --topic", file=err)
        return 2
    if (args.start_offset is not None or args.yes or args.dry_run) and not args.abort:
        print("txnguard hanging: --start-offset, --yes and --dry-run go with --abort", file=err)
        return 2
    if args.bootstrap is None and args.config is None:
        print("txnguard hanging: give --bootstrap or --config", file=err)
        return 2
    try:
        connect = _connection_settings(args)
        bootstrap = [parse_host_port("--bootstrap", b.strip()) for b in args.bootstrap.split(",")] \
            if args.bootstrap else list(connect.upstream)
    except (ConfigError, OSError) as e:
        print(f"txnguard hanging: {e}", file=err)
        return 2
    scope = Scope(topic=args.topic, partition=args.partition, broker_id=args.broker_id)
    return asyncio.run(_run(args, bootstrap, scope, out, err, inp, connect))


class _Connect(NamedTuple):
    """How the CLI reaches the cluster: a proxy config's upstream, TLS and SASL (--config), or nothing set."""

    upstream: tuple[HostPort, ...] = ()
    ssl_context: Any = None
    auth: Any = None


def _connection_settings(args: Any) -> _Connect:
    """TLS and SASL of the proxy config given with --config (none without it): the proxy's own principal."""
    if args.config is None:
        return _Connect()
    from txnguard.proxy.config import load
    from txnguard.proxy.server import upstream_ssl_context  # not at module level: server imports this module

    cfg = load(args.config)
    return _Connect(cfg.upstream, upstream_ssl_context(cfg), cfg.upstream_auth)


async def _run(args: Any, bootstrap: list[HostPort], scope: Scope, out: Any, err: Any, inp: Any,
               connect: _Connect) -> int:
    import json

    admin = ClusterAdmin(bootstrap, timeout_s=args.timeout, ssl_context=connect.ssl_context, auth=connect.auth)
    try:
        try:
            result = await scan(admin, scope, args.max_transaction_timeout * 60_000)
        except (HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
            print(f"txnguard hanging: {e}", file=err)
            return 1
        for tp, problem in sorted(result.errors.items()):
            print(f"txnguard hanging: {tp[0]}-{tp[1]}: {problem}", file=err)
        if result.unconfirmed:
            print("txnguard hanging: the brokers lack ListTransactions and DescribeTransactions (Kafka < 3.0): "
                  "open transactions older than --max-transaction-timeout are listed unconfirmed by their "
                  "coordinator (one whose abort marker is still being written would be listed too)", file=err)
        aborted: list[dict[str, Any]] = []
        status = 1 if result.errors else 0
        if not args.json:  # what was found first, then what is done about it
            from txnguard.verification.hanging import table

            out.write(table(result.findings, result.now_ms))
        if args.abort:
            chosen = [f for f in result.findings if args.start_offset is None or f.start_offset == args.start_offset]
            for f in chosen:
                outcome = await _abort_one(admin, f, args, out, err, inp)
                aborted.append({**f.as_dict(result.now_ms), "outcome": outcome})
                if outcome not in ("NONE", "dry_run", "declined"):
                    status = 1
        if args.json:
            report: dict[str, Any] = {
                "findings": [f.as_dict(result.now_ms) for f in result.findings],
                "scanned_partitions": result.partitions, "described_partitions": result.described,
                "oldest_open_transaction_age_ms": result.oldest_open_age_ms,
                "max_transaction_timeout_ms": args.max_transaction_timeout * 60_000,
                "unconfirmed": result.unconfirmed,
                "errors": {f"{t}-{p}": problem for (t, p), problem in sorted(result.errors.items())},
            }
            if args.abort:
                report["aborts"] = aborted
            print(json.dumps(report, indent=2), file=out)
        return status
    finally:
        await admin.close()


async def _abort_one(admin: ClusterAdmin, f: Finding, args: Any, out: Any, err: Any, inp: Any) -> str:
    """One confirmed abort: the outcome's name (NONE, an error name, dry_run, declined, TRANSACTION_GONE)."""
    # Progress goes to stderr when stdout carries JSON.
    say = err if args.json else out
    try:
        plan = await plan_abort(admin, f)
    except (HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
        print(f"cannot abort {f.topic}-{f.partition} at {f.start_offset}: {e}", file=err)
        return "lookup_failed"
    if plan.spec is None:
        print(f"no open transaction starts at offset {f.start_offset} on {f.topic}-{f.partition} any more: "
              "nothing to abort", file=say)
        return "TRANSACTION_GONE"
    what = plan.spec.describe(f.start_offset)
    if args.dry_run or (not args.yes and not _interactive(inp)):
        print(f"dry run: would abort the hanging transaction on {what}"
              f"{'' if args.dry_run else '; confirm with --yes'}", file=say)
        return "dry_run"
    if not args.yes:
        print(f"Abort the hanging transaction on {what}? [y/N] ", end="", file=err, flush=True)
        answer = inp.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("not aborted", file=say)
            return "declined"
    try:
        outcome = await abort(admin, plan)
    except (HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
        print(f"abort of {what} failed: {e}", file=err)
        return "failed"
    if outcome == "NONE":
        print(f"aborted the hanging transaction on {what}", file=say)
    else:
        print(f"abort of {what} failed: {outcome}", file=err)
    return outcome


def _interactive(inp: Any) -> bool:
    try:
        return bool(inp.isatty())
    except (AttributeError, ValueError):
        return False

"""Carry out the verification's questions: to the partition leader and to the transaction coordinator.

The pure core (txnguard.verification) decides what it can from observed
traffic; this module asks the rest, on the proxy's own connections:

* DescribeProducers to the partition leader: does this producer already have an
  open transaction on the partition? That is the broker's own "first write in
  this transaction was verified" test (currentTxnFirstOffset).
* DescribeTransactions to the coordinator (DESCRIBE on the transactional id):
  is the transaction Ongoing with this producer id and epoch, with the partition in it?
* or, as an option, AddPartitionsToTxn v4 with VerifyOnly to the coordinator: the very
  question the broker asks (TransactionCoordinator.handleVerifyPartitionsInTransaction),
  answered per partition; it needs CLUSTER_ACTION on the cluster and a 3.5+ coordinator.

Concurrent questions for one broker are batched into one request, with at most
one request in flight per broker (as the broker's AddPartitionsToTxnManager does).
Every wait is bounded by `timeout_s`; no answer is a retriable verdict.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from kio.schema.add_partitions_to_txn.v4.request import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
    AddPartitionsToTxnTransaction,
)
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i8, i16, i32

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction, read_describe_transactions_v0
from txnguard.codecs.errors import CodecError
from txnguard.codecs.groups import CONSUMER_OFFSETS
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.proxy import logs
from txnguard.proxy.access_report import AccessMonitor
from txnguard.proxy.capability_report import BrokerCapabilities
from txnguard.proxy.config import CoordinatorEvidence, HostPort, UpstreamAuth
from txnguard.proxy.kafka_client import BrokerConnections, UnsupportedApi, UpstreamAuthError, UpstreamError
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.access import MissingAcl, missing_acl, refused
from txnguard.verification.capabilities import DESCRIBE_TRANSACTIONS
from txnguard.verification.judge import (
    coordinator_unreachable,
    error_name,
    judge_description,
    judge_verify_only,
    leader_has_open_transaction,
)
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed

Key = Any
_VerifyAnswer = tuple[int, dict[TopicPartition, int]]  # (top-level error, error per partition)
VERIFY_ONLY_VERSION = 4  # AddPartitionsToTxn's first batch (broker-to-coordinator) version
COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
_T = TypeVar("_T")
_PASSED_BY_LEADER = passed(Evidence.LEADER, "an open transaction of this producer on the leader")


class _Batcher:
    """Collects keys for one broker and sends them as one request when the broker is free."""

    def __init__(self, name: str, send: Callable[[list[Key]], Any], metrics: ProxyMetrics) -> None:
        self.name = name
        self._send = send
        self._metrics = metrics
        self._pending: dict[Key, list[asyncio.Future[Any]]] = {}
        self._running = False
        self._task: asyncio.Task[None] | None = None

    def ask(self, key: Key) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append(fut)
        if not self._running:
            self._running = True
            # call_soon: every question asked in this loop iteration joins the same request.
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                self._metrics.coordinator_requests.labels(self.name).inc()
                self._metrics.coordinator_batch.labels(self.name).observe(len(batch))
                try:
                    answers = await self._send(list(batch))
                except Exception as e:  # noqa: BLE001 - every waiter must get an answer
                    for futs in batch.values():
                        for f in futs:
                            if not f.done():
                                f.set_exception(e)
                                f.exception()  # its waiter may have timed out already: mark it read
                    continue
                for key, futs in batch.items():
                    for f in futs:
                        if not f.done():
                            f.set_result(answers.get(key))
        finally:
            self._running = False


class Verifier:
    def __init__(self, bootstrap: tuple[HostPort, ...], metrics: ProxyMetrics, *, ssl_context: Any = None,
                 timeout_s: float = 5.0, connect_timeout_s: float = 5.0,
                 address_of: Callable[[str, int], HostPort] | None = None,
                 coordinator_evidence: CoordinatorEvidence = CoordinatorEvidence.DESCRIBE_TRANSACTIONS,
                 auth: UpstreamAuth | None = None) -> None:
        self.bootstrap = bootstrap
        self.auth = auth  # the proxy's own SASL principal (upstream_auth); None: no SASL
        self.access = AccessMonitor(metrics, auth.principal if auth else "User:ANONYMOUS")
        self._topics_visible: dict[str, float] = {}  # topic -> when Metadata last showed DESCRIBE on it
        self.verify_only = coordinator_evidence is CoordinatorEvidence.VERIFY_ONLY
        self.metrics = metrics
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        # Where the proxy itself connects for an address a broker advertised (identity by default).
        self.address_of = address_of or (lambda host, port: HostPort(host, port))
        # What each broker lists in ApiVersions (read on every connection the proxy opens): said once, and
        # an API a broker lacks is never sent to it (kafka_client.UnsupportedApi).
        self.capabilities = BrokerCapabilities(metrics)
        self._connections = BrokerConnections(
            ssl_context=ssl_context, connect_timeout_s=connect_timeout_s, auth=auth,
            on_open=(lambda: self.access.proved(("AUTHENTICATE", "SASL", auth.mechanism))) if auth else None,
            on_versions=self.capabilities.learned)
        self._coordinators: dict[str, HostPort] = {}
        self._describe: dict[HostPort, _Batcher] = {}
        self._producers: dict[HostPort, _Batcher] = {}
        self._verify: dict[HostPort, _Batcher] = {}
        self._verify_only_versions: dict[HostPort, int] = {}
        self._offsets_partitions: int | None = None
        self.log = logs.get(component="verifier")
        # The coordinator's log, asked first (proxy/log_follower.py); None: not followed.
        self.transaction_log: LogFollower | None = None
        self.transaction_log_wait_s = 0.5

    async def close(self) -> None:
        self._connections.close()

    async def read_api_versions(self, address: HostPort) -> None:
        """Open (or reuse) the proxy's own connection to `address`, which reads the broker's ApiVersions and
        tells `capabilities`: at start and for each broker Metadata names, so that what a broker lacks is
        known before a client needs it (proxy/server.py). The connection stays for the questions to come."""
        conn = await asyncio.wait_for(asyncio.shield(self._connections.get(address)), self.connect_timeout_s * 2)
        if conn.api_versions is None:
            self._connections.drop(address)  # read again on the next attempt
            raise UpstreamError("the broker's ApiVersions answer could not be read")

    async def _any_broker(self, payload: Any) -> Any:
        """Ask the first bootstrap broker that answers; the one that answered is tried first next time,
        and one that did not goes last, so a broker that is down costs one timeout, not one per question.

        Connecting is bounded by `timeout_s` too (shielded: the connection attempt may go on for the
        next question): a stopped broker whose accept queue is full can leave a connect hanging for the
        whole connect timeout, and every other transactional id's FindCoordinator would wait behind it.
        """
        last: Exception | None = None
        for address in list(self.bootstrap):
            try:
                conn = await asyncio.wait_for(asyncio.shield(self._connections.get(address)), self.timeout_s)
                answer = await conn.request(payload, self.timeout_s)
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                last = e
                self.bootstrap = (*(a for a in self.bootstrap if a != address), address)
                continue
            if self.bootstrap[0] != address:
                self.bootstrap = (address, *(a for a in self.bootstrap if a != address))
            return answer
        if isinstance(last, UpstreamAuthError):
            raise last  # every broker refused the proxy's credentials: say so, not "no answer"
        raise UpstreamError(f"no bootstrap broker answered: {last}")

    # -- the coordinator -----------------------------------------------------------------------------

    async def coordinator_of(self, txn_id: str, refresh: bool = False) -> HostPort:
        if not refresh and txn_id in self._coordinators:
            return self._coordinators[txn_id]
        self.metrics.coordinator_requests.labels("find_coordinator").inc()
        resp = await self._any_broker(FindCoordinatorRequest(key=txn_id, key_type=i8(1)))
        if resp.error_code != ErrorCode.none:
            raise _CoordinatorError(int(resp.error_code), missing_acl("find_coordinator", int(resp.error_code), txn_id))
        address = self.address_of(str(resp.host), int(resp.port))
        if len(self._coordinators) > 100_000:
            self._coordinators.clear()
        self._coordinators[txn_id] = address
        return address

    async def describe(self, txn_id: str) -> DescribedTransaction:
        """The coordinator's view of a transaction (DescribeTransactions).

        Raises UnsupportedApi, without sending anything, when the coordinator does not list
        DescribeTransactions (Kafka < 3.0): a definite "cannot be asked", never a retriable silence.
        """
        async def ask(address: HostPort) -> DescribedTransaction:
            if self.capabilities.lacks(address, DESCRIBE_TRANSACTIONS):
                raise UnsupportedApi(DESCRIBE_TRANSACTIONS, 0, None)
            desc: DescribedTransaction | None = await self._ask_batched(
                self._describe, "describe_transactions", self._send_describe, address, txn_id)
            if desc is None:
                raise UpstreamError("the coordinator's answer did not name the transactional id")
            return desc

        return await self._with_rediscovery(txn_id, ask, lambda desc: {desc.error_code})

    async def _with_rediscovery(self, txn_id: str, ask: Callable[[HostPort], Awaitable[_T]],
                                errors: Callable[[_T], set[int]]) -> _T:
        """Ask the coordinator of `txn_id`; an answer made only of NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE
        triggers one re-discovery. No answer at all forgets the coordinator (`_ask_batched`): after a
        failover the next question finds the new one instead of waiting on the old node again."""
        for attempt in range(2):
            answer = await ask(await self.coordinator_of(txn_id, refresh=attempt > 0))
            if attempt or not errors(answer) <= COORDINATOR_MOVED:
                return answer
            self._coordinators.pop(txn_id, None)
        raise AssertionError("unreachable")

    async def _verify_only_supported(self, address: HostPort) -> bool:
        """Does this coordinator take AddPartitionsToTxn v4 from us? Read from the ApiVersions answer of the
        connection the question would go on (each connection reads it when it opens), so a broker restarted
        on another Kafka version in a rolling upgrade (or downgrade) is judged by what it lists now.

        Kafka 3.5 has v4 only between brokers (its ApiVersions names v3 to clients). Where it is
        missing, the broker itself would skip verification; the proxy asks DescribeTransactions instead.
        """
        conn = await self._connections.get(address)
        ranges = conn.api_versions or {}
        known = ranges.get(ApiKey.ADD_PARTITIONS_TO_TXN, (0, -1))[1]
        if self._verify_only_versions.get(address) != known:  # said once per broker and answer
            self._verify_only_versions[address] = known
            if known < VERIFY_ONLY_VERSION:
                self.log.warning("verify_only_unsupported", coordinator=str(address), max_version=known,
                                 detail="the coordinator offers AddPartitionsToTxn up to v"
                                        f"{known}; VerifyOnly needs v4: asking DescribeTransactions instead")
        return known >= VERIFY_ONLY_VERSION

    async def verify_partitions(self, txn_id: str, producer_id: int, epoch: int,
                                pending: list[TopicPartition]) -> dict[TopicPartition, Verdict]:
        """AddPartitionsToTxn VerifyOnly for these partitions, judged as the broker judges the answer."""
        key = (txn_id, producer_id, epoch, tuple(pending))

        async def ask(address: HostPort) -> _VerifyAnswer:
            answer: _VerifyAnswer | None = await self._ask_batched(
                self._verify, "add_partitions_to_txn_verify_only", self._send_verify_only, address, key)
            if answer is None:
                # Another question for this id with another producer epoch took its place in the batch
                # (the broker answers the replaced one NETWORK_EXCEPTION too): retriable.
                raise UpstreamError("a concurrent VerifyOnly for this transactional id replaced this one")
            return answer

        top, codes = await self._with_rediscovery(
            txn_id, ask, lambda a: {a[0]} if a[0] != ErrorCode.none else set(a[1].values()))
        missing = missing_acl("add_partitions_to_txn_verify_only", top, "")
        if missing is not None:
            raise _NotAuthorized(missing)
        self.access.proved(("CLUSTER_ACTION", "Cluster", "kafka-cluster"))
        return {tp: judge_verify_only(top, codes.get(tp), tp) for tp in pending}

    async def _send_verify_only(self, address: HostPort, keys: list[Key]) -> dict[Key, _VerifyAnswer]:
        """One batched VerifyOnly request; questions for one id with one epoch share its entry."""
        entries: dict[str, tuple[int, int, set[TopicPartition]]] = {}
        for txn_id, pid, epoch, tps in keys:
            entry = entries.setdefault(txn_id, (pid, epoch, set()))
            if entry[:2] == (pid, epoch):
                entry[2].update(tps)
        transactions = []
        for txn_id, (pid, epoch, tps) in entries.items():
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(tps):
                by_topic.setdefault(topic, []).append(p)
            transactions.append(AddPartitionsToTxnTransaction(
                transactional_id=TransactionalId(txn_id), producer_id=ProducerId(pid), producer_epoch=i16(epoch),
                verify_only=True, topics=tuple(AddPartitionsToTxnTopic(name=TopicName(t), partitions=tuple(
                    i32(p) for p in ps)) for t, ps in by_topic.items())))
        conn = await self._connections.get(address)
        resp = await conn.request(AddPartitionsToTxnRequest(transactions=tuple(transactions)), self.timeout_s)
        codes: dict[str, dict[TopicPartition, int]] = {
            str(r.transactional_id): {(str(t.name), int(p.partition_index)): int(p.partition_error_code)
                                      for t in r.topic_results for p in t.results_by_partition}
            for r in resp.results_by_transaction}
        return {k: (int(resp.error_code), codes.get(k[0], {})) for k in keys if entries[k[0]][:2] == (k[1], k[2])}

    async def _ask_batched(self, batchers: dict[HostPort, _Batcher], api: str,
                           send: Callable[[HostPort, list[Key]], Any], address: HostPort, key: Key) -> Any:
        """One question in a coordinator's batch for `api`; no answer at all forgets that coordinator."""
        batcher = batchers.get(address)
        if batcher is None:
            batcher = batchers[address] = _Batcher(api, functools.partial(send, address), self.metrics)
        try:
            return await asyncio.wait_for(batcher.ask(key), self.timeout_s)
        except (UpstreamError, OSError, CodecError, TimeoutError):
            self._forget_coordinator(address)
            raise

    def _forget_coordinator(self, address: HostPort) -> None:
        for txn_id in [t for t, a in self._coordinators.items() if a == address]:
            del self._coordinators[txn_id]
        self._connections.drop(address)

    async def _send_describe(self, address: HostPort, ids: list[str]) -> dict[str, DescribedTransaction]:
        conn = await self._connections.get(address)  # a fresh connection reads ApiVersions first: request_raw
        # refuses (UnsupportedApi) what the broker does not list
        request = DescribeTransactionsRequest(transactional_ids=tuple(TransactionalId(i) for i in ids))
        _, _, frame = await conn.request_raw(request, self.timeout_s)
        # Response header v1: correlation id, then tagged fields (empty: one zero byte).
        described = read_describe_transactions_v0(frame[5:])
        return {d.transactional_id: d for d in described}

    # -- the leader ----------------------------------------------------------------------------------

    async def leader_open(self, leader: HostPort, tp: TopicPartition, producer_id: int, epoch: int) -> bool:
        batcher = self._producers.get(leader)
        if batcher is None:
            batcher = self._producers[leader] = _Batcher(
                "describe_producers", functools.partial(self._send_producers, leader), self.metrics)
        answer = await asyncio.wait_for(batcher.ask(tp), self.timeout_s)
        return answer is not None and leader_has_open_transaction(answer, producer_id, epoch)

    async def _send_producers(self, address: HostPort,
                              tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        by_topic: dict[str, list[int]] = {}
        for topic, p in tps:
            by_topic.setdefault(topic, []).append(p)
        conn = await self._connections.get(address)
        topics = tuple(TopicRequest(name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps))
                       for t, ps in by_topic.items())
        resp = await conn.request(DescribeProducersRequest(topics=topics), self.timeout_s)
        for t in resp.topics:  # READ on the topic: without it the leader gives no evidence (not essential)
            codes = {int(p.error_code) for p in t.partitions}
            missing = next(filter(None, (missing_acl("describe_producers", c, str(t.name)) for c in codes)), None)
            if missing is not None:
                self.access.refused(missing)
            elif ErrorCode.none in codes:
                self.access.proved(("READ", "Topic", str(t.name)))
        return {(str(t.name), int(p.partition_index)): p for t in resp.topics for p in t.partitions}

    # -- __consumer_offsets ------------------------------------------------------------------------------

    async def offsets_partitions(self) -> int:
        if self._offsets_partitions is None:
            resp = await self._any_broker(MetadataRequest(
                topics=(MetadataRequestTopic(name=TopicName(CONSUMER_OFFSETS)),), allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
            parts = len(resp.topics[0].partitions) if resp.topics else 0
            missing = missing_acl("metadata", int(resp.topics[0].error_code), CONSUMER_OFFSETS) if resp.topics else None
            if missing is not None:
                self.access.refused(missing)
                raise UpstreamError(missing.sentence(self.access.principal))
            if parts == 0:
                raise UpstreamError("__consumer_offsets has no partitions yet")
            self._offsets_partitions = parts
        return self._offsets_partitions

    # -- one verification ----------------------------------------------------------------------------------

    async def verify(self, txn_id: str, producer_id: int, epoch: int, pending: Iterable[TopicPartition],
                     leader: HostPort | None) -> tuple[dict[TopicPartition, Verdict], DescribedTransaction | None]:
        """Verdicts for the partitions the core could not decide alone, and the coordinator's answer if asked.

        With a leader to ask, the leader and the coordinator are asked at once: the leader answers
        for a partition already written in this transaction, the coordinator for a first write. Asked
        one after the other, a first write would wait two round trips. The extra coordinator
        questions are cheap: they join the coordinator's batch, one request in flight per broker.
        """
        pending = list(pending)
        if self.transaction_log is not None:
            # The coordinator's own log first: what it decides needs no question, on Kafka 2.8 too.
            logged = await self.transaction_log.verdicts(txn_id, producer_id, epoch, pending,
                                                         self.transaction_log_wait_s)
            if logged:
                if len(logged) == len(pending):
                    return logged, None
                rest, answered = await self._verify_asking(txn_id, producer_id, epoch,
                                                           [tp for tp in pending if tp not in logged], leader)
                return {**logged, **rest}, answered
        return await self._verify_asking(txn_id, producer_id, epoch, pending, leader)

    async def _verify_asking(self, txn_id: str, producer_id: int, epoch: int, pending: list[TopicPartition],
                             leader: HostPort | None,
                             ) -> tuple[dict[TopicPartition, Verdict], DescribedTransaction | None]:
        """The leader and the coordinator, for what neither this proxy nor the log decided."""
        if leader is None:
            return await self._ask_coordinator(txn_id, producer_id, epoch, pending)
        coordinator = asyncio.ensure_future(self._ask_coordinator(txn_id, producer_id, epoch, pending))
        checks = await asyncio.gather(*(self._leader_check(leader, tp, producer_id, epoch) for tp in pending))
        verdicts = {tp: _PASSED_BY_LEADER for tp, is_open in zip(pending, checks, strict=True) if is_open}
        if len(verdicts) == len(pending):
            return verdicts, None  # the coordinator's answer, when it comes, is not needed
        asked, desc = await coordinator
        return {tp: verdicts.get(tp) or asked[tp] for tp in pending}, desc

    async def _ask_coordinator(self, txn_id: str, producer_id: int, epoch: int, pending: list[TopicPartition],
                               ) -> tuple[dict[TopicPartition, Verdict], DescribedTransaction | None]:
        """The coordinator's verdict on each partition; never raises (no answer is a retriable verdict)."""
        try:
            if self.verify_only and await self._verify_only_supported(await self.coordinator_of(txn_id)):
                return await self.verify_partitions(txn_id, producer_id, epoch, pending), None
            desc = await self.describe(txn_id)
            missing = missing_acl("describe_transactions", desc.error_code, txn_id)
            if missing is not None:
                raise _NotAuthorized(missing)
        except (_CoordinatorError, _NotAuthorized, UpstreamAuthError) as e:
            missing = e.missing if not isinstance(e, UpstreamAuthError) else missing_acl(
                "sasl_authenticate", e.code, self.auth.mechanism if self.auth else "none")
            if missing is not None:  # the proxy's own principal lacks a right: fail closed, retriable
                self.access.refused(missing)
                return {tp: refused(missing, self.access.principal) for tp in pending}, None
            assert isinstance(e, _CoordinatorError)
            v = Verdict(Outcome.COORDINATOR_RETRIABLE, Evidence.COORDINATOR,
                        f"FindCoordinator answered {error_name(e.code)}", error_name(e.code))
            return {tp: v for tp in pending}, None
        except UnsupportedApi as e:
            # Kafka 2.8: no DescribeTransactions. Whatever local (gateway) or leader (sidecar) evidence there
            # was has been looked at already; without it the write is refused as not added, at once.
            v = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.NONE,
                        f"no evidence that the partition was added: the coordinator cannot be asked ({e}; "
                        "DescribeTransactions came with Kafka 3.0) and neither this proxy's own traffic nor the "
                        "leader shows it in this transaction", "UNSUPPORTED_VERSION")
            return {tp: v for tp in pending}, None
        except (TimeoutError, UpstreamError, OSError, CodecError) as e:
            v = coordinator_unreachable(f"no answer from the coordinator: {e!r}")
            return {tp: v for tp in pending}, None
        self.access.proved(("DESCRIBE", "TransactionalId", txn_id))
        verdicts = {tp: judge_description(desc, producer_id, epoch, tp) for tp in pending}
        for tp, v in verdicts.items():
            if v.outcome is Outcome.NOT_IN_TRANSACTION:
                hidden = await self._topic_hidden(tp[0])
                if hidden is not None:
                    self.access.refused(hidden)
                    verdicts[tp] = refused(hidden, self.access.principal)
            elif v.passed:
                self.access.proved(("DESCRIBE", "Topic", tp[0]))
        return verdicts, desc

    async def _topic_hidden(self, topic: str) -> MissingAcl | None:
        """DescribeTransactions leaves out, without an error, the partitions of topics the principal may not
        DESCRIBE: "not in the transaction" is then no evidence. Before a rejection stands, Metadata shows
        whether the proxy may see the topic (a yes is remembered for 10 s; rejections are rare)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._topics_visible.get(topic, -10.0) < 10.0:
            return None
        try:
            resp = await self._any_broker(MetadataRequest(
                topics=(MetadataRequestTopic(name=TopicName(topic)),), allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
        except (TimeoutError, UpstreamError, OSError, CodecError):
            return None  # cannot tell: the coordinator's answer stands
        code = int(resp.topics[0].error_code) if resp.topics else ErrorCode.none
        missing = missing_acl("metadata", code, topic)
        if missing is None:
            self._topics_visible[topic] = loop.time()
            if len(self._topics_visible) > 10_000:
                self._topics_visible.clear()
        return missing

    async def _leader_check(self, leader: HostPort, tp: TopicPartition, producer_id: int, epoch: int) -> bool:
        try:
            return await self.leader_open(leader, tp, producer_id, epoch)
        except (TimeoutError, UpstreamError, OSError, CodecError) as e:
            # No leader evidence: the coordinator decides. Logged, because it costs a round trip.
            self.log.warning("leader_check_failed", leader=str(leader), topic=tp[0], partition=tp[1], error=repr(e))
            return False


class _CoordinatorError(Exception):
    def __init__(self, code: int, missing: MissingAcl | None = None) -> None:
        super().__init__(f"FindCoordinator error {code}")
        self.code = code
        self.missing = missing  # set when the error is the proxy's own principal refused


class _NotAuthorized(Exception):
    def __init__(self, missing: MissingAcl) -> None:
        super().__init__(missing.error)
        self.missing = missing


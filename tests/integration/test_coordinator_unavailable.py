"""S4: the transaction coordinator stops answering in the middle of a transaction.

The proxy is told to check EVERY transactional write with the coordinator (no leader evidence,
evidence_ttl_ms=0), each question bounded by 1 s. The coordinator's node is frozen with SIGSTOP: its
sockets stay open, so connections succeed and requests get no answer at all (a long GC pause, a
frozen VM), the hardest case for a verifier. Kafka's brokers fence a frozen node after their 9 s
broker session timeout and move its coordinators elsewhere ("failover").

    client ─Init/AddPartitions/AddOffsets─▶ coordinator C             (before the freeze)
    client ─Produce─▶ proxy ─DescribeTransactions─▶ C                 ✓ Ongoing: forwarded to leader L
                                ══ C frozen (SIGSTOP) ══
    client ─Produce(timeout 30 s)─▶ proxy ─DescribeTransactions─▶ C … 1 s, no answer
                                    proxy … asks again, 0.1-1 s apart, while C cannot answer (a hold,
                                    as 3.9.2 holds it: issue 13), for up to 0.8 x 30 s
                                    proxy ─FindCoordinator, DescribeTransactions─▶ C' (after failover) ✓
           ◀─ the write, appended by L                                (no error; C still frozen)
    client ─TxnOffsetCommit─▶ … held the same way ─▶ group coordinator ✓
                                ══ C resumed (SIGCONT) ══
    client ─EndTxn(commit)─▶ C'                                       ✓ exactly the two records commit

    A client whose request allows less than a failover (Produce timeout 4 s) is answered within it:
    client ─Produce(timeout 4 s)─▶ proxy … held 3.2 s
           ◀─ NOT_ENOUGH_REPLICAS "Unable to verify the partition has been added to the transaction.
              Underlying error: NETWORK_EXCEPTION"                   (retriable; nothing written)
    client ─TxnOffsetCommit─▶ proxy … held 3.2 s (the id's Produce timeout)
           ◀─ COORDINATOR_LOAD_IN_PROGRESS                            (retriable; nothing written)

(a) Raw and deterministic, with the TxnActor: through the proxy on Kafka 3.5.2 (which has no
    verification of its own); the same sequence DIRECTLY against Kafka 3.9.2 with its native
    KIP-890 verification (S7 parity for S4). 3.9.2 does not answer the Produce with
    NOT_ENOUGH_REPLICAS: it HOLDS it until the coordinator has failed over (~8-12 s here) and then
    writes it; it answers TxnOffsetCommit with COORDINATOR_LOAD_IN_PROGRESS
    (GroupMetadataManager.maybeConvertOffsetCommitError turns the verification's NETWORK_EXCEPTION
    into it). The proxy holds both (issue 13: a fixed 1-5 s bound turned the pause into errors that a
    client with a small retry budget could not absorb), follows the failover (an unanswered question
    forgets the cached coordinator, so the next one finds the new coordinator while the old node is
    still frozen), and answers retriable errors like 3.9.2's only when the request's own timeout
    runs out first.
(b) Real clients through the proxy (kafka-python, confluent-kafka, aiokafka, and the Java 3.5.2
    TransactionalMessageCopier), the coordinator of their transactional id frozen for 4 s mid-run
    (shorter than the broker session timeout, so no failover): the proxy holds the write through
    the freeze, they finish without an error, and a read_committed consumer sees every committed
    record exactly once. Small retry budgets and longer freezes: test_coordinator_holds.py.

No assertion reads a stopwatch (durations are printed): "held through the failover" is shown by the
order of events (a frozen node answers nothing, so a write appended while it is still frozen was verified
by the coordinator that took over), "within the bound" by how the hold ended and the bound it had.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard.proxy import logs
from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.freezes import Freeze, txn_id_coordinated_by
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, gateway_for
from txnguard.testing.scenarios import TxnActor, error_name

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]

# Every transactional Produce / TxnOffsetCommit is checked with the coordinator, each question bounded by 1 s.
# The coordinator's log (which would answer first) is not followed: these tests are about its questions.
VERIFY_WITH_COORDINATOR = {"leader_evidence": False, "evidence_ttl_ms": 0, "timeout_s": 1.0,
                           "transaction_log": False}
UNVERIFIED = "Unable to verify the partition has been added to the transaction. Underlying error: "
COORDINATOR_UNAVAILABLE = {"reason": "coordinator_unavailable"}
HOLDS_DECIDED = {"ending": "decided"}
HOLDS_TIMED_OUT = {"ending": "timeout"}
PASSED_WITH_COORDINATOR = {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}
RETRIABLE_COMMIT_ERRORS = {"COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR"}
FAMILIES = {"kafka-python": "kafka-python", "confluent-kafka": "librdkafka", "aiokafka": "aiokafka"}


# -- helpers -------------------------------------------------------------------------------------------------


@dataclass
class PatientActor(TxnActor):
    """A TxnActor whose sockets outwait a broker that holds a request (3.9.2 holds a Produce until its
    own verification is answered, up to its request.timeout.ms of 30 s)."""

    socket_timeout_s: float = 60.0

    def _client(self, host: str, port: int) -> raw.RawClient:
        return raw.RawClient(host, port, client_id=self.client_id, timeout=self.socket_timeout_s)


def _init_directly(cluster: Cluster, txn_id: str, node: int) -> str:
    """What node `node` answers to an InitProducerId for `txn_id` (a diagnostic, in a failure's message)."""
    (n,) = (n for n in cluster.nodes if n.id == node)
    started = time.monotonic()
    try:
        with raw.RawClient(n.host, n.port, timeout=30) as c:
            r = c.init_producer_id(txn_id, 60000)
        return f"node {node} answered {error_name(r.error_code)} in {time.monotonic() - started:.1f}s"
    except (OSError, raw.RawProtocolError) as e:
        return f"node {node} gave no answer ({e!r}) in {time.monotonic() - started:.1f}s"


def _group_coordinated_by(cluster: Cluster, prefix: str, accept: Callable[[int], bool]) -> str:
    for i in range(300):
        group = f"{prefix}-{i}"
        if accept(cluster.group_coordinator(group)):
            return group
    raise AssertionError("no group with a suitable coordinator")


def _listeners(proxy: ProxyThread, cluster: Cluster) -> dict[int, str]:
    """Broker id -> the gateway listener standing in for it (opened once the proxy learned the broker)."""
    p = proxy.proxy
    assert p is not None
    proxy.wait_for(lambda: all(n.id in p.listeners for n in cluster.nodes), 30, "a listener per broker")
    return {n.id: f"127.0.0.1:{p.listeners[n.id].address.port}" for n in cluster.nodes}


class LogTee:
    """The proxy's JSON log lines, kept as they are written (and still written to stderr)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        sys.stderr.write(text)
        with self._lock:
            self._partial += text
            *complete, self._partial = self._partial.split("\n")
            self.lines += [json.loads(line) for line in complete if line.startswith("{")]
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _timed(call: Callable[[], int]) -> tuple[int, float]:
    started = time.monotonic()
    code = call()
    return code, time.monotonic() - started


@dataclass
class S4Run:
    """What the raw client saw from the freeze on, and what the brokers held afterwards."""

    first_produce: tuple[str, str | None]  # code and message of the first Produce answer while frozen
    produce_answer_s: float  # how long that answer took
    first_commit: str  # the first TxnOffsetCommit answer while frozen
    commit_answer_s: float
    landed_while_frozen_s: float | None  # seconds from the freeze until the write landed, if still frozen
    first_commit_while_frozen: bool | None = None  # was the coordinator still frozen when it came
    produce_answers: list[tuple[str, str | None]] = field(default_factory=list)  # every Produce answer
    commit_answers: list[str] = field(default_factory=list)  # every TxnOffsetCommit answer
    end_txn: str = ""
    committed: list[bytes] = field(default_factory=list)  # the topic, read_committed, afterwards
    group_offsets: dict[int, int | None] = field(default_factory=dict)


def s4_sequence(cluster: Cluster, bootstrap_of: Callable[[int], str], *, stay_frozen_s: float,
                request_timeout_ms: int = 30_000) -> S4Run:
    """The raw S4 sequence; `bootstrap_of(node)` is where the client reaches a node (broker or proxy listener).

    While the coordinator is frozen the client only talks to live nodes: metadata and FindCoordinator
    to a third node, the write to a leader elsewhere, the offsets to a group coordinator elsewhere.
    Only the verification (the proxy's or the broker's own) needs the frozen node. With
    `stay_frozen_s` > 0 the client keeps retrying while the node stays frozen, up to that long.
    """
    # From a healed cluster: the module's sequences share it, and the last one froze a node (its replicas may
    # still be catching up, its coordinators moving back).
    cluster.wait_ready()
    cluster.wait_in_sync()
    u = uuid.uuid4().hex[:8]
    topic = fresh_topic(cluster, f"s4-{u}", replication_factor=3)
    leader = cluster.leader(topic, 0)
    txn_id, coordinator = txn_id_coordinated_by(cluster, f"s4-tid-{u}", lambda c: c != leader)
    group = _group_coordinated_by(cluster, f"s4-group-{u}", lambda c: c != coordinator)
    (third,) = (n.id for n in cluster.nodes if n.id not in (coordinator, leader))
    actor = PatientActor(bootstrap_of(third), txn_id, request_timeout_ms=request_timeout_ms)

    def produce() -> int:
        r = actor.produce(topic, 0, [b"during"])  # the sequence number only moves on success
        run.produce_answers.append((error_name(r.error_code), r.error_message))
        if r.error_code == ErrorCode.none and frozen_at is not None and cluster.paused(coordinator):
            run.landed_while_frozen_s = time.monotonic() - frozen_at
        return r.error_code

    def commit() -> int:
        (code,) = actor.commit_offsets(group, {topic: {0: 2}})
        run.commit_answers.append(error_name(code))
        if run.first_commit_while_frozen is None:
            run.first_commit_while_frozen = cluster.paused(coordinator)
        return code

    try:
        actor.init()
    except OSError as e:  # in one gate run no answer came for 60 s: say whether the coordinator answers directly
        raise AssertionError(f"InitProducerId through {bootstrap_of(third)}: {e!r}; asked directly, "
                             f"{_init_directly(cluster, txn_id, coordinator)}") from e
    assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
    assert actor.produce(topic, 0, [b"before"]).error_code == ErrorCode.none
    assert actor.add_offsets(group) == ErrorCode.none

    run = S4Run(("", None), 0.0, "", 0.0, None)
    frozen_at: float | None = None
    cluster.pause_node(coordinator)
    frozen_at = time.monotonic()
    try:
        # Both at once: a broker that holds the request makes each wait its full time.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            produced, committed = pool.submit(_timed, produce), pool.submit(_timed, commit)
            (p_code, run.produce_answer_s), (c_code, run.commit_answer_s) = produced.result(90), committed.result(90)
        run.first_produce, run.first_commit = run.produce_answers[0], run.commit_answers[0]
        # A client retries retriable answers; here it does so while the node stays frozen.
        while p_code != ErrorCode.none and time.monotonic() - frozen_at < stay_frozen_s:
            time.sleep(0.3)
            p_code = produce()
        while c_code != ErrorCode.none and time.monotonic() - frozen_at < stay_frozen_s:
            time.sleep(0.3)
            c_code = commit()
    finally:
        cluster.resume_node(coordinator)
        cluster.wait_ready()

    deadline = time.monotonic() + 60
    while p_code != ErrorCode.none or c_code != ErrorCode.none:
        assert time.monotonic() < deadline, f"no success within 60 s of the resume: {run}"
        if p_code != ErrorCode.none:
            p_code = produce()
        if c_code != ErrorCode.none:
            c_code = commit()
        time.sleep(0.2)
    run.end_txn = error_name(actor.end(commit=True))
    # The brokers, asked directly, after the markers are written.
    reader = clients.ConfluentKafkaClient()
    clients.stable_end_offsets(cluster.live_bootstrap(), topic)
    run.committed = reader.consume_committed(cluster.bootstrap_servers, topic)
    run.group_offsets = reader.committed_offsets(cluster.bootstrap_servers, group, topic)
    return run


@dataclass
class Proxied:
    run: S4Run
    metrics: dict[str, float]
    leaks: list[tuple[str, int]]
    expired_holds: list[dict[str, Any]]  # the proxy's `verification_hold_expired` log lines


def _proxied_s4(kafka_pool: ClusterPool, request_timeout_ms: int) -> Iterator[Proxied]:
    cluster = kafka_pool.get("3.5.2", 3)
    tee = LogTee()
    proxy = ProxyThread.from_settings(upstream=cluster.bootstrap_servers, mode="gateway", admin="127.0.0.1:0",
                                      verification=VERIFY_WITH_COORDINATOR, log_stream=tee).start()
    try:
        listeners = _listeners(proxy, cluster)
        run = s4_sequence(cluster, listeners.__getitem__, stay_frozen_s=0, request_timeout_ms=request_timeout_ms)
        m = proxy.metric
        metrics = {
            "failures": m("txnguard_verification_failures_total", COORDINATOR_UNAVAILABLE),
            "produce_rewrites": m("txnguard_error_rewrites_total", {
                "api": "produce", "from_error": "NETWORK_EXCEPTION", "to_error": "NOT_ENOUGH_REPLICAS",
                "client_family": "unknown"}),
            "commit_rewrites": m("txnguard_error_rewrites_total", {
                "api": "txn_offset_commit", "from_error": "NETWORK_EXCEPTION",
                "to_error": "COORDINATOR_LOAD_IN_PROGRESS",
                "client_family": "unknown"}),
            "passed": m("txnguard_verifications_total", PASSED_WITH_COORDINATOR),
            "holds_decided": m("txnguard_verification_hold_endings_total", HOLDS_DECIDED),
            "holds_timed_out": m("txnguard_verification_hold_endings_total", HOLDS_TIMED_OUT),
            "held_now": m("txnguard_verification_holds"),
        }
        assert proxy.wire is not None
        expired = [x for x in tee.lines if x.get("event") == "verification_hold_expired"]
        yield Proxied(run, metrics, proxy.wire.leaks(broker_addresses(cluster)), expired)
    finally:
        proxy.stop()
        logs.configure(proxy.config.log_level)  # stderr again for whatever logs next


@pytest.fixture(scope="module")
def proxied(kafka_pool: ClusterPool) -> Iterator[Proxied]:
    """The S4 sequence through a gateway in front of Kafka 3.5.2, the client's requests allowing 30 s
    (the default request timeout of Java, kafka-python and librdkafka): the proxy holds them."""
    yield from _proxied_s4(kafka_pool, request_timeout_ms=30_000)


@pytest.fixture(scope="module")
def proxied_short(kafka_pool: ClusterPool) -> Iterator[Proxied]:
    """The same with requests that allow 4 s, less than a failover: answered retriable within them,
    and the coordinator frozen only until those answers (shorter than the broker session timeout)."""
    yield from _proxied_s4(kafka_pool, request_timeout_ms=4_000)


@pytest.fixture(scope="module")
def native(kafka_pool: ClusterPool) -> S4Run:
    """The same sequence directly against Kafka 3.9.2 (native verification on), the coordinator left
    frozen for up to 45 s while the client retries: long enough for the brokers to fail it over."""
    cluster = kafka_pool.get("3.9.2", 3)
    return s4_sequence(cluster, lambda n: cluster.node(n).address, stay_frozen_s=45)


# -- (a) raw and deterministic -------------------------------------------------------------------------------


def test_s4_frozen_coordinator_through_the_proxy_the_write_is_held_until_failover_and_then_written(
    proxied: Proxied,
) -> None:
    run = proxied.run
    print(f"\nthrough the proxy, requests allowing 30 s: {run}\n{proxied.metrics}")
    # Held, not refused: the one answer is the write itself, appended while the old coordinator is
    # still frozen. Every write is checked with the coordinator and a frozen node answers nothing, so the
    # "Ongoing" that let it through came from the coordinator that took over: held through the failover
    # (the proxy found the new one), as 3.9.2 does natively. Within the hold bound: see the hold endings.
    assert run.produce_answers == [("NONE", None)], run
    assert run.landed_while_frozen_s is not None, run
    assert run.commit_answers == ["NONE"], run
    assert run.end_txn == "NONE"
    assert run.committed == [b"before", b"during"]
    assert run.group_offsets == {0: 2}
    # No verification failed and nothing was rewritten: the two checks were held, then decided by the
    # coordinator's answer before their bound (0.8 x 30 s) ran out: no hold ended by timeout.
    assert proxied.metrics["failures"] == 0, proxied.metrics
    assert proxied.metrics["produce_rewrites"] == proxied.metrics["commit_rewrites"] == 0, proxied.metrics
    assert proxied.metrics["holds_decided"] == 2 and proxied.metrics["holds_timed_out"] == 0, proxied.metrics
    assert proxied.expired_holds == [], proxied.expired_holds
    assert proxied.metrics["held_now"] == 0, proxied.metrics
    assert proxied.metrics["passed"] == 3, proxied.metrics  # the write before, the write and the offsets during
    assert proxied.leaks == []


def test_s4_a_request_allowing_less_than_a_failover_is_answered_retriable_within_its_own_timeout(
    proxied_short: Proxied,
) -> None:
    run = proxied_short.run
    print(f"\nthrough the proxy, requests allowing 4 s: {run}\n{proxied_short.metrics}")
    code, message = run.first_produce
    assert code == "NOT_ENOUGH_REPLICAS", run
    assert message == UNVERIFIED + "NETWORK_EXCEPTION", run
    assert run.first_commit == "COORDINATOR_LOAD_IN_PROGRESS", run
    # Held for 0.8 of the 4 s the request allows, then answered: before the client gives up on it. The
    # TxnOffsetCommit carries no timeout: its budget is 0.8 of its id's Produce timeout (not the 30 s
    # default), counted from the start of its verification, whose first question (the offsets partition
    # count) spent a little of it. The proxy's own account of each: a hold that ran out at that bound.
    bounds = {"offsets" if x["partitions"][0].startswith("__consumer_offsets") else "write": x["held_ms"]
              for x in proxied_short.expired_holds}
    assert len(proxied_short.expired_holds) == 2 and bounds.keys() == {"write", "offsets"}, proxied_short.expired_holds
    assert bounds["write"] == 3200 and bounds["offsets"] <= 3200, bounds
    # After the resume: the retried write and offsets pass, and the transaction commits exactly them.
    assert run.produce_answers[-1] == ("NONE", None) and run.commit_answers[-1] == "NONE", run
    assert run.end_txn == "NONE"
    assert run.committed == [b"before", b"during"]
    assert run.group_offsets == {0: 2}
    # Exactly the two answers sent during the freeze were verification failures, each rewritten,
    # each the end of a hold that ran out.
    m = proxied_short.metrics
    assert m["failures"] == 2 and m["holds_timed_out"] == 2, m
    assert m["produce_rewrites"] == m["commit_rewrites"] == 1, m
    # Every write before and after the freeze was checked with the coordinator, and passed.
    assert m["passed"] >= 3, m
    assert proxied_short.leaks == []


def test_s4_native_3_9_2_holds_the_write_until_failover_and_the_outcome_matches_the_proxy(
    proxied: Proxied, native: S4Run,
) -> None:
    print(f"\nproxy in front of 3.5.2: {proxied.run}\nnative 3.9.2: {native}")
    # Both hold the write through the failover and append it while the old node is still frozen.
    assert proxied.run.landed_while_frozen_s is not None and native.landed_while_frozen_s is not None
    # 3.9.2 holds the Produce while its own verification waits, and writes it once the coordinator has
    # failed over: it lands while the old node is still frozen, which answers nothing, so the verification
    # that let it through was answered by the coordinator that took over.
    assert native.landed_while_frozen_s is not None, native
    for code, message in native.produce_answers:
        assert code == "NONE" or (code == "NOT_ENOUGH_REPLICAS" and (message or "").startswith(UNVERIFIED)), native
    # Its TxnOffsetCommit verification asked the frozen node, which never answered (the node stays frozen
    # until both first answers are in): the group coordinator's question ends by its own request timeout,
    # a NETWORK_EXCEPTION that 3.8+ answers as COORDINATOR_LOAD_IN_PROGRESS. An order of events, not a race.
    assert native.first_commit_while_frozen is True, native
    assert native.first_commit == "COORDINATOR_LOAD_IN_PROGRESS", native
    assert set(native.commit_answers) <= RETRIABLE_COMMIT_ERRORS | {"NONE"}, native
    # At least as well as native: the proxy held the TxnOffsetCommit through the failover where 3.9.2
    # answered it retriable; then exactly the same committed transaction.
    assert proxied.run.commit_answers == ["NONE"]
    assert (native.end_txn, native.committed, native.group_offsets) == \
        (proxied.run.end_txn, proxied.run.committed, proxied.run.group_offsets)


def test_s7_parity_for_s4_txn_offset_commit_error_code(proxied_short: Proxied, native: S4Run) -> None:
    # When the proxy does answer an unverifiable TxnOffsetCommit, it answers what 3.9.2 answers.
    assert proxied_short.run.first_commit == native.first_commit


# -- (b) real clients ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster352(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 3)


@pytest.mark.parametrize("client_name", list(FAMILIES))
def test_s4_real_client_rides_out_a_frozen_coordinator_through_the_proxy(
    cluster352: Cluster, start_proxy: StartProxy, unique_name: NameFactory, client_name: str,
) -> None:
    cluster = cluster352
    topic = fresh_topic(cluster, unique_name("paced"), replication_factor=3)
    leader = cluster.leader(topic, 0)
    txn_id, coordinator = txn_id_coordinated_by(cluster, unique_name("tid"), lambda c: c != leader)
    proxy = gateway_for(cluster, start_proxy, verification=VERIFY_WITH_COORDINATOR)
    # Frozen after the 5th ack of the 3rd transaction, for 4 s (the broker session timeout is 9 s).
    freeze = Freeze(cluster, coordinator, hold_s=4.0, at=(2, 4))
    try:
        result = clients.paced_transactions(client_name, proxy.bootstrap, topic, txn_id, transactions=5,
                                            per_transaction=20, on_ack=freeze.hook, timeout_s=120)
    finally:
        freeze.release()
    held = proxy.metric("txnguard_verification_hold_endings_total", HOLDS_DECIDED)
    print(f"\n{client_name}: aborted {result.aborted} {result.errors}, {held:.0f} checks held through the "
          f"freeze, {proxy.metric('txnguard_verification_failures_total', COORDINATOR_UNAVAILABLE):.0f} "
          f"verification failures")

    assert freeze.frozen_at is not None
    # Why a hold is certain: when the hook returns the coordinator is stopped (every thread in state T);
    # the client's next request is the Produce of record 6 of an open transaction whose partition it added
    # before record 1; the proxy checks every write with the coordinator (no leader evidence, TTL 0),
    # which cannot answer its 1 s question, and the freeze lasts 4 s: that check is held, and decided
    # by the coordinator once it answers again, well inside the Produce's own 30 s timeout.
    assert held >= 1
    assert proxy.metric("txnguard_verification_failures_total", COORDINATOR_UNAVAILABLE) == 0
    assert proxy.metric("txnguard_error_rewrites_total", {
        "api": "produce", "from_error": "NETWORK_EXCEPTION", "to_error": "NOT_ENOUGH_REPLICAS",
        "client_family": FAMILIES[client_name]}) == 0
    # The client saw a slow acknowledgement, no error: no transaction had to be aborted, none failed.
    assert result.aborted == 0, result.errors
    expected = [v for t in range(5) for v in clients.paced_values(txn_id, t, 20)]
    assert result.committed == expected
    # read_committed, from the brokers directly: every committed record once, in order, nothing else.
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == expected
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []


@pytest.mark.java
def test_s4_java_copier_rides_out_a_frozen_coordinator_through_the_proxy(
    cluster352: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    cluster = cluster352
    source = fresh_topic(cluster, unique_name("in"), replication_factor=3)
    sink = fresh_topic(cluster, unique_name("out"), replication_factor=3)
    # A coordinator that leads neither topic if there is one (after a failover, e.g. in the test above,
    # a node may lead no __transaction_state partition until Kafka's 5-minute leader rebalance), else
    # one that at least does not lead the output.
    busy = {cluster.leader(source, 0), cluster.leader(sink, 0)}
    try:
        txn_id, coordinator = txn_id_coordinated_by(cluster, unique_name("tid"), lambda c: c not in busy)
    except AssertionError:
        txn_id, coordinator = txn_id_coordinated_by(cluster, unique_name("tid"),
                                                     lambda c: c != cluster.leader(sink, 0))
    group = _group_coordinated_by(cluster, unique_name("group"), lambda c: c != coordinator)
    # ~300-byte values: the copier's 512-byte batches then hold one record each, so a transaction is
    # mostly a long run of small Produce requests (see the note at the end).
    values = [f"java-{i:05d}-{'x' * 300}".encode() for i in range(3000)]
    clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, values, partition=0)
    proxy = gateway_for(cluster, start_proxy, verification=VERIFY_WITH_COORDINATOR)

    # The copier cannot be stopped at a chosen point as the paced clients stop themselves, and a freeze
    # from outside may land while AddPartitionsToTxn, AddOffsetsToTxn or EndTxn is in flight (the Java
    # producer sends no data meanwhile): then nothing the proxy checks meets it, and "no verification
    # failed" proves nothing. So the freeze is ordered onto checked traffic: once armed (mid-run), the
    # proxy's next check of this transactional id first stops its coordinator and only then asks it.
    #     copier ─Produce─▶ proxy ─(armed: SIGSTOP the coordinator)─▶ DescribeTransactions ─▶ C … no answer
    #            proxy … holds the check, asks again … C resumed after 4 s ✓ Ongoing ─▶ forwarded
    freeze = Freeze(cluster, coordinator, hold_s=4.0)
    armed = threading.Event()
    froze_on: list[list[tuple[str, int]]] = []  # the partitions of the check that the freeze was ordered onto
    assert proxy.proxy is not None
    verifier = proxy.proxy.guard.verifier
    ask = verifier.verify

    async def freeze_then_ask(txn: str, pid: int, epoch: int, pending: Any, leader: Any) -> Any:
        if txn == txn_id and armed.is_set():
            armed.clear()  # on the proxy's loop: exactly one check is frozen onto
            froze_on.append(list(pending))
            await asyncio.get_running_loop().run_in_executor(None, freeze.freeze)
        return await ask(txn, pid, epoch, pending, leader)

    verifier.verify = freeze_then_ask  # type: ignore[method-assign]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        copier = pool.submit(clients.java_transactional_copier, proxy.bootstrap, source, sink, txn_id, group,
                             max_messages=len(values), java_version="3.5.2", transaction_size=1000,
                             timeout_s=180)
        try:
            # Mid-run: half way through the second transaction (committed or not, in the output log).
            deadline = time.monotonic() + 120
            while _high_watermark(cluster, sink) < 1500 and not copier.done():
                assert time.monotonic() < deadline, "the copier made no progress"
                time.sleep(0.05)
            assert not copier.done(), "the copier finished before the freeze"
            armed.set()
            while freeze.resumed_at is None and not copier.done():  # frozen on the next check, resumed 4 s later
                assert time.monotonic() < deadline, "the freeze never ended"
                time.sleep(0.05)
        finally:
            freeze.release()
        result = copier.result(200)
    failures = proxy.metric("txnguard_verification_failures_total", COORDINATOR_UNAVAILABLE)
    held = proxy.metric("txnguard_verification_hold_endings_total", HOLDS_DECIDED)
    print(f"\nJava 3.5.2 copier: {result}; frozen on the check of {froze_on}; {held:.0f} checks held, "
          f"{failures:.0f} verification failures")

    assert result.shutdown_complete and (result.total_processed, result.remaining) == (len(values), 0)
    clients.stable_end_offsets(cluster.bootstrap_servers, sink)
    out = clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, sink)
    assert out == values  # no loss, no duplicate, in order
    # The freeze met a check: its question went to the stopped coordinator, which could not answer its
    # 1 s question; the proxy held it (its bound, 0.8 x the copier's 30 s request timeout, outlasts the
    # 4 s freeze) and the coordinator decided it once resumed. None of the checks failed.
    assert len(froze_on) == 1 and freeze.frozen_at is not None, "the copier finished before a check met the freeze"
    assert held >= 1
    assert failures == 0
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []


def _high_watermark(cluster: Cluster, topic: str) -> int:
    _, host, port = raw.leader_of(cluster.live_bootstrap(), topic, 0)
    with raw.RawClient(host, port) as c:
        return c.list_offsets(topic, 0, read_committed=False)

"""S4: the transaction coordinator stops answering in the middle of a transaction.

The proxy is told to check EVERY transactional write with the coordinator (no leader evidence,
evidence_ttl_ms=0), with a 1 s bound on each check. The coordinator's node is frozen with SIGSTOP:
its sockets stay open, so connections succeed and requests simply get no answer (a GC pause, a
frozen VM), the hardest case for a verifier.

    client ─Init/AddPartitions/AddOffsets─▶ coordinator C        (before the pause)
    client ─Produce─▶ proxy ─DescribeTransactions─▶ C            ✓ Ongoing, forwarded to leader L
                             ══ C frozen (SIGSTOP) ══
    client ─Produce─▶ proxy ─DescribeTransactions─▶ C ... 1 s, no answer
           ◀─ NOT_ENOUGH_REPLICAS "Unable to verify the partition has been added to the transaction.
              Underlying error: ..."                          (retriable; nothing written)
    client ─TxnOffsetCommit─▶ proxy ─DescribeTransactions─▶ C ... no answer
           ◀─ COORDINATOR_NOT_AVAILABLE                         (retriable; nothing written)
                             ══ C resumed (SIGCONT) ══
    client ─Produce / TxnOffsetCommit (retries)─▶ proxy ─▶ C ✓ ─▶ L / group coordinator
    client ─EndTxn(commit)─▶ C                                 ✓ the transaction commits

(a) raw and deterministic, with the TxnActor: through the proxy on Kafka 3.5.2 (no native
    verification), and the same sequence DIRECTLY against Kafka 3.9.2 with its native KIP-890
    verification: the same client-visible codes (S7 parity for S4).
(b) real clients through the proxy (kafka-python, confluent-kafka, aiokafka, Java 3.5.2
    TransactionalMessageCopier) while their coordinator is frozen for a few seconds mid-run:
    they retry, finish, and a read_committed consumer sees every committed record exactly once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import clients
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, gateway_for
from txnguard.testing.raw import RawClient
from txnguard.testing.scenarios import TxnActor, error_name, offsets

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]

# Every transactional Produce / TxnOffsetCommit is checked with the coordinator, bounded by 1 s.
VERIFY_WITH_COORDINATOR = {"leader_evidence": False, "evidence_ttl_ms": 0, "timeout_s": 1.0}
UNVERIFIED = "Unable to verify the partition has been added to the transaction. Underlying error: "
COORDINATOR_UNAVAILABLE = {"reason": "coordinator_unavailable"}


@dataclass
class PatientActor(TxnActor):
    """A TxnActor whose sockets wait long enough for a broker that holds a request (Kafka 3.9.2 waits
    for its own verification request, up to the broker's request.timeout.ms of 30 s)."""

    socket_timeout_s: float = 60.0

    def _client(self, host: str, port: int) -> RawClient:
        return RawClient(host, port, client_id=self.client_id, timeout=self.socket_timeout_s)


@contextlib.contextmanager
def paused(cluster: Cluster, node_id: int) -> Iterator[None]:
    """The node frozen for the block; always resumed, and the shared cluster ready again, afterwards."""
    cluster.pause_node(node_id)
    try:
        yield
    finally:
        cluster.resume_node(node_id)
        cluster.wait_ready()


def _txn_id_coordinated_by(cluster: Cluster, prefix: str, accept: Callable[[int], bool]) -> tuple[str, int]:
    for i in range(300):
        txn_id = f"{prefix}-{i}"
        coordinator = cluster.transaction_coordinator(txn_id)
        if accept(coordinator):
            return txn_id, coordinator
    raise AssertionError("no transactional id with a suitable coordinator")


def _group_coordinated_by(cluster: Cluster, prefix: str, accept: Callable[[int], bool]) -> str:
    for i in range(300):
        group = f"{prefix}-{i}"
        if accept(cluster.group_coordinator(group)):
            return group
    raise AssertionError("no group with a suitable coordinator")


def _retry(call: Callable[[], int], what: str, timeout_s: float = 60.0) -> list[str]:
    """Call until it answers NONE (as a client retries a retriable error); returns every answer seen."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        code = call()
        seen.append(error_name(code))
        if code == ErrorCode.none:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: no success within {timeout_s:.0f}s: {seen}")
        time.sleep(0.2)


def _listeners(proxy: ProxyThread, cluster: Cluster) -> dict[int, str]:
    """Broker id -> the gateway listener standing in for it (opened once the proxy learned the broker)."""
    p = proxy.proxy
    assert p is not None
    proxy.wait_for(lambda: all(n.id in p.listeners for n in cluster.nodes), 30, "a listener per broker")
    return {n.id: f"127.0.0.1:{p.listeners[n.id].address.port}" for n in cluster.nodes}


def _wait_stable(bootstrap: str, topic: str) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while True:
        hw, lso = offsets(bootstrap, topic, 0)
        if hw == lso or time.monotonic() > deadline:
            return hw, lso
        time.sleep(0.05)


@dataclass
class S4Run:
    """What the client saw while the coordinator was frozen, and after."""

    produce: tuple[str, str | None]
    txn_offset_commit: list[str]
    produce_retries: list[str]
    commit_retries: list[str]
    end_txn: str
    frozen_s: float


def _s4_sequence(cluster: Cluster, bootstrap_of: Callable[[int], str], unique_name: NameFactory) -> S4Run:
    """The raw S4 sequence; `bootstrap_of(node)` is where the client reaches that node (broker or proxy).

    Everything the client asks while the coordinator is frozen goes to other, live nodes: metadata and
    FindCoordinator to a live node, the write to a leader elsewhere, the offsets to a group coordinator
    elsewhere. Only the verification (the proxy's or the broker's own) needs the frozen node.
    """
    topic = fresh_topic(cluster, unique_name("s4"), replication_factor=3)
    leader = cluster.leader(topic, 0)
    txn_id, coordinator = _txn_id_coordinated_by(cluster, unique_name("tid"), lambda c: c != leader)
    group = _group_coordinated_by(cluster, unique_name("group"), lambda c: c != coordinator)
    (live,) = [n.id for n in cluster.nodes if n.id not in (coordinator, leader)][:1] or [leader]
    actor = PatientActor(bootstrap_of(live), txn_id)

    actor.init()
    assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
    assert actor.produce(topic, 0, [b"before"]).error_code == ErrorCode.none
    assert actor.add_offsets(group) == ErrorCode.none

    with paused(cluster, coordinator):
        started = time.monotonic()
        # Concurrently: a broker that holds the request makes each wait its full timeout.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            produced = pool.submit(actor.produce, topic, 0, [b"during"])
            committed = pool.submit(actor.commit_offsets, group, {topic: {0: 2}})
            r, codes = produced.result(90), committed.result(90)
        frozen_s = time.monotonic() - started

    produce_retries = _retry(lambda: actor.produce(topic, 0, [b"during"]).error_code, "produce after resume")
    commit_retries = _retry(lambda: actor.commit_offsets(group, {topic: {0: 2}})[0], "offsets after resume")
    end = actor.end(commit=True)
    # The brokers, asked directly: the transaction committed both records, once, and the offsets.
    reader = clients.ConfluentKafkaClient()
    stable = _wait_stable(cluster.live_bootstrap(), topic)
    assert stable == (3, 3), (cluster.version, stable, produce_retries, commit_retries,
                              reader.consume_committed(cluster.bootstrap_servers, topic))
    assert reader.consume_committed(cluster.bootstrap_servers, topic) == [b"before", b"during"]
    assert reader.committed_offsets(cluster.bootstrap_servers, group, topic) == {0: 2}
    return S4Run((error_name(r.error_code), r.error_message), [error_name(c) for c in codes],
                 produce_retries, commit_retries, error_name(end), frozen_s)


def _assert_client_view(run: S4Run) -> None:
    code, message = run.produce
    assert code == "NOT_ENOUGH_REPLICAS", run
    assert message is not None and message.startswith(UNVERIFIED), run
    assert run.txn_offset_commit == ["COORDINATOR_NOT_AVAILABLE"], run
    assert run.produce_retries[-1] == run.commit_retries[-1] == run.end_txn == "NONE", run


def test_s4_raw_coordinator_frozen_through_the_proxy_and_natively_on_3_9_2(
    kafka_pool: ClusterPool, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    # Through the proxy, in front of Kafka 3.5.2.
    cluster = kafka_pool.get("3.5.2", 3)
    proxy = gateway_for(cluster, start_proxy, verification=VERIFY_WITH_COORDINATOR)
    listeners = _listeners(proxy, cluster)
    proxied = _s4_sequence(cluster, listeners.__getitem__, unique_name)

    _assert_client_view(proxied)
    # The proxy answered within its 1 s bound (twice, concurrently) instead of holding the client.
    assert proxied.frozen_s < 5, proxied
    assert proxy.metric("txnguard_verification_failures_total", COORDINATOR_UNAVAILABLE) == 2
    for api, to in (("produce", "NOT_ENOUGH_REPLICAS"), ("txn_offset_commit", "COORDINATOR_NOT_AVAILABLE")):
        assert proxy.metric("txnguard_error_rewrites_total", {
            "api": api, "from_error": "NETWORK_EXCEPTION", "to_error": to, "client_family": "unknown"}) == 1
    # Every write before and after the freeze was checked with the coordinator, and passed.
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}) >= 3
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []

    # Directly against Kafka 3.9.2 with its native verification: what the client sees is the same.
    native_cluster = kafka_pool.get("3.9.2", 3)
    native = _s4_sequence(native_cluster, lambda n: native_cluster.node(n).address, unique_name)
    print(f"\nproxy (3.5.2): {proxied}\nnative (3.9.2): {native}")
    _assert_client_view(native)
    assert (native.produce[0], native.txn_offset_commit) == (proxied.produce[0], proxied.txn_offset_commit)

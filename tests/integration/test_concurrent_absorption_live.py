"""CONCURRENT_TRANSACTIONS absorbed (issue 11, the KIP-609 idea), on a real Kafka 3.5.2 with real clients.

    client ──▶ tap (counts 51s the client receives) ──▶ txnguard sidecar ──▶ Kafka 3.5.2
                                                           │ AddPartitionsToTxn ──▶ coordinator
                                                           │ ◀── CONCURRENT_TRANSACTIONS (markers of
                                                           │     the previous transaction still going)
                                                           │ 2 ms later, the same bytes ──▶
                                                           │ ◀── added
    client ◀── added ─────────────────────────────────────┘

A loop of one-record transactions makes the coordinator say CONCURRENT_TRANSACTIONS
often (Java 3.5.2: about every second transaction here). Each cell runs the loop until the
proxy has absorbed at least one refusal (bounded: a bounded retry until the condition
happens, the loops it took printed), so a pass means the condition happened and the client
still never saw the error. The control is a raw actor that makes the coordinator busy itself
(a commit whose transaction-log append waits for a frozen follower) and asks through the tap
and a proxy with absorption off: the tap sees the error the client receives, so the cells'
`tap.count == 0` can fail. The control does not depend on the race above.

Cells: Java 3.5.2 (the client that suffers most), confluent-kafka, kafka-python; control with a raw actor.
Throughput is measured by bench/short_transactions.py, not here.
"""

from __future__ import annotations

import pytest

from txnguard.testing import raw
from txnguard.testing.fixtures import ClusterPool
from txnguard.testing.kafka import Cluster
from txnguard.testing.short_transactions import ConcurrentTap, run_loop

pytestmark = pytest.mark.integration

ABSORBED = "txnguard_concurrent_transactions_absorptions_total"
LOOP, MAX_LOOPS = 60, 5   # transactions per loop; loops until one refusal was absorbed


@pytest.fixture(scope="module")
def one_node_sidecar(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 1, sidecars=True)


def absorbed(proxy: object, ending: str) -> float:
    return float(proxy.metric(ABSORBED, {"api": "add_partitions_to_txn", "ending": ending}))  # type: ignore[attr-defined]


@pytest.mark.parametrize("family", [pytest.param("java-3.5.2", marks=pytest.mark.java), "confluent-kafka",
                                    "kafka-python"])
def test_a_short_transaction_loop_through_the_proxy_never_sees_concurrent_transactions(
        family: str, one_node_sidecar: Cluster, start_proxy, unique_name) -> None:  # type: ignore[no-untyped-def]
    node = one_node_sidecar.nodes[0]
    topic = unique_name("short")
    raw.create_topic(one_node_sidecar.live_bootstrap(), topic, 1, -1, None)
    proxy = start_proxy(mode="sidecar", upstream=f"{node.host}:{node.port}")
    host, port = proxy.bootstrap.split(":")
    with ConcurrentTap((host, int(port)), node.sidecar_port) as tap:
        loops = 0
        while absorbed(proxy, "absorbed") == 0 and loops < MAX_LOOPS:
            run_loop(family, f"{node.host}:{node.sidecar_port}", topic, unique_name("txn"), LOOP)
            loops += 1
        print(f"\n{family}: {absorbed(proxy, 'absorbed'):.0f} absorbed in {loops} loop(s) of {LOOP} transactions "
              f"(at most {MAX_LOOPS}), asked again "
              f"{proxy.metric('txnguard_concurrent_transactions_retries_total', {'api': 'add_partitions_to_txn'}):.0f}"
              f" times, {proxy.metric('txnguard_concurrent_transactions_woken_total'):.0f} of them early on the "
              "follower's word")
        assert absorbed(proxy, "absorbed") > 0, f"no CONCURRENT_TRANSACTIONS in {loops * LOOP} transactions"
        assert tap.count == 0
    assert absorbed(proxy, "budget_spent") == 0


def _transaction_log_partition(transactional_id: str, partitions: int = 10) -> int:
    """Kafka's own choice: Utils.abs(String.hashCode()) % transaction.state.log.num.partitions (10 in the
    harness), where Utils.abs is Math.abs with Integer.MIN_VALUE taken to 0."""
    h = 0
    for ch in transactional_id:      # ASCII here: one UTF-16 unit per character, as Java hashes them
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def test_control_with_absorption_off_a_raw_actor_receives_concurrent_transactions_through_the_tap(
        kafka_pool: ClusterPool, start_proxy) -> None:  # type: ignore[no-untyped-def]
    """The control, with a raw actor that makes the coordinator busy itself (no loop waiting for luck):

        actor ─EndTxn(COMMIT)─▶ coordinator A: PrepareCommit appended to the transaction log, which waits
                                for follower F (frozen, SIGSTOP; still in the ISR, acks=all): A's
                                transition is pending, and EndTxn unanswered
        actor ─AddPartitionsToTxn─▶ tap ─▶ proxy (absorption off) ─▶ A
              ◀── CONCURRENT_TRANSACTIONS (the pending transition): the tap counts it on its way to the actor
        ══ F resumed (only now) ══ the commit completes

    So the tap the cells above rely on does see a CONCURRENT_TRANSACTIONS that reaches a client through
    a proxy that does not absorb it: their `tap.count == 0` can fail. Until the EndTxn has reached A,
    AddPartitionsToTxn of a partition already in the transaction is answered NONE at once: the actor
    asks again until A is busy (bounded; the tries are printed)."""
    import concurrent.futures
    import time
    import uuid

    from kio.schema.errors import ErrorCode

    from txnguard.testing.fixtures import fresh_topic
    from txnguard.testing.scenarios import TxnActor, error_name

    cluster = kafka_pool.get("3.5.2", 3)
    u = uuid.uuid4().hex[:8]
    topic = fresh_topic(cluster, f"busy-{u}", replication_factor=1)
    txn_id = f"busy-tid-{u}"
    coordinator = cluster.transaction_coordinator(txn_id)
    with raw.RawClient(*raw.any_broker(cluster.bootstrap_servers)) as c:
        (log,) = c.metadata(["__transaction_state"]).topics
    (part,) = [p for p in log.partitions if int(p.partition_index) == _transaction_log_partition(txn_id)]
    assert int(part.leader_id) == coordinator, part
    follower = next(int(n) for n in part.isr_nodes if int(n) != coordinator)
    proxy = start_proxy(mode="gateway", upstream=cluster.bootstrap_servers,
                        health={"concurrent_transactions_budget_ms": 0})
    assert proxy.proxy is not None
    listeners = proxy.proxy.listeners
    proxy.wait_for(lambda: coordinator in listeners, 30, "the coordinator's listener")
    # The actor bootstraps from A only: its EndTxn must not look for the coordinator on the frozen F first.
    a = cluster.node(coordinator)
    actor = TxnActor(f"{a.host}:{a.port}", txn_id)
    producer = actor.init()
    assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
    assert actor.produce(topic, 0, [b"v"]).error_code == ErrorCode.none
    with ConcurrentTap(("127.0.0.1", listeners[coordinator].address.port), 0) as tap, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        cluster.pause_node(follower)
        try:
            commit = pool.submit(actor.end, True)
            tries, answer = 0, "NONE"
            while answer == "NONE" and tries < 100:
                if tries:
                    time.sleep(0.02)                        # the EndTxn has not reached A yet
                tries += 1
                with raw.RawClient(tap.relay.host, tap.relay.port) as c:
                    r = c.add_partitions_to_txn(txn_id, producer, {topic: [0]})
                answer = error_name(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)
            busy = not commit.done()                        # A's commit was still waiting for F
            cluster.resume_node(follower)                   # the commit completes only now
            assert commit.result(30) == ErrorCode.none
        finally:
            cluster.resume_node(follower)
            cluster.wait_ready()
        seen = tap.count
    print(f"\nabsorption off: the actor got {answer} on try {tries}; the tap saw {seen} "
          f"CONCURRENT_TRANSACTIONS; absorbed {absorbed(proxy, 'absorbed'):.0f}")
    assert busy and answer == "CONCURRENT_TRANSACTIONS" and seen == 1
    assert absorbed(proxy, "absorbed") == 0

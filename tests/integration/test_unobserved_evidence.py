"""A proxy never breaks a healthy transaction on what it did not observe, and never passes a late write on what
it was only told (Kafka 3.5.2, no native verification, so every refusal and every pass is the proxy's).

    restart:  client ─Init (timeout 180 s), AddPartitions, Produce─▶ gateway 1 ─▶ Kafka
                           SIGTERM gateway 1; gateway 2 on the same ports (an empty registry)
              client ─AddPartitions (a new partition), Produce every few seconds, 90 s and more─▶ gateway 2
                           gateway 2 never saw the InitProducerId: the transaction's timeout is unknown to it,
                           and nothing may end the transaction on a default (it once did, at 60 s)
              client ─EndTxn(commit)─▶ every record read back read_committed, nothing refused

    replicas: client ─Init, AddPartitions, EndTxn─▶ gateway A        client ─Produce─▶ gateway B
              B asks the coordinator for the write inside the transaction (passes), and asks again after the
              commit (refused): a coordinator's answer is bounded evidence in a gateway too, no partition hangs
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import clients, raw
from txnguard.testing.bounce import free_port, gateway, listener_ports
from txnguard.testing.clients.java import java_producer_performance
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyProcess, ProxyThread
from txnguard.testing.scenarios import TxnActor

pytestmark = [pytest.mark.integration, pytest.mark.java]

TRANSACTION_TIMEOUT_MS = 180_000  # above the 60 s the registry once assumed for a timeout it never saw
PAST_THE_RESTART_S = 90           # the transaction keeps writing this long after the restart, then commits
JAVA_RECORDS = 100                # ProducerPerformance at 1 record/s: ~100 s, one transaction
JAVA_PARTITIONS = 16              # round robin: a partition first written (added) every second, most after the restart


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 1)


@pytest.fixture(scope="module")
def long_cluster(kafka_pool: ClusterPool) -> Cluster:
    """The test clusters cap transactions at 60 s; this one allows Kafka's default 15 minutes."""
    return kafka_pool.get("3.5.2", 1, {"transaction.max.timeout.ms": "900000"})


def _audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "decision"]


def _written(cluster: Cluster, topic: str, partitions: int) -> int:
    """Records in the log, committed or not (the high watermarks, from the broker itself)."""
    host, port = cluster.nodes[0].address.rsplit(":", 1)
    with raw.RawClient(host, int(port)) as c:
        return sum(c.list_offsets(topic, p, read_committed=False) for p in range(partitions))


class ConfluentLongTransaction(threading.Thread):
    """One confluent-kafka transaction: a record to partition 0 before the restart, then one every
    `PAST_THE_RESTART_S / 9` s to partitions 1 and 0 in turn (partition 1 added through the restarted gateway)."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str, restarted: threading.Event) -> None:
        super().__init__(name="confluent-long-transaction", daemon=True)
        self.bootstrap, self.topic, self.transactional_id = bootstrap, topic, transactional_id
        self.restarted = restarted
        self.wrote_before = threading.Event()
        self.sent = 0
        self.errors: list[str] = []
        self.committed = False

    def run(self) -> None:
        from confluent_kafka import KafkaException, Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
                      "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, "linger.ms": 0,
                      # The gateway's addresses stay the same across its restart (docs: troubleshooting).
                      "metadata.recovery.strategy": "none"})

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))

        try:
            p.init_transactions(60)
            p.begin_transaction()
            p.produce(self.topic, b"before", partition=0, on_delivery=delivered)
            p.flush(60)
            self.sent = 1
            self.wrote_before.set()
            if not self.restarted.wait(120):
                self.errors.append("the gateway was not restarted")
                return
            for i in range(10):
                p.produce(self.topic, f"after-{i}".encode(), partition=1 - i % 2, on_delivery=delivered)
                p.flush(60)
                self.sent += 1
                if i < 9:
                    time.sleep(PAST_THE_RESTART_S / 9)
            p.commit_transaction(60)
            self.committed = True
        except KafkaException as e:
            self.errors.append(str(e))
        finally:
            self.wrote_before.set()


def test_a_gateway_restarted_mid_transaction_lets_a_long_transaction_add_write_and_commit(
    long_cluster: Cluster, tmp_path: Path, unique_name: Any,
) -> None:
    """    confluent-kafka ─Init, Produce p0─▶ gateway 1        Java ─Init, Produce p0, p1 …─▶ gateway 1
                    SIGTERM gateway 1, gateway 2 on the same ports
           confluent-kafka ─AddPartitions p1, Produce every 10 s, 90 s─▶ gateway 2 ─▶ commit: 11 records
           Java (1 record/s, round robin over 16 partitions) ─AddPartitions, Produce, ~100 s─▶ gateway 2 ─▶ commit
    gateway 2 refused nothing; every record is read back read_committed; no partition hangs."""
    c_topic = fresh_topic(long_cluster, unique_name("confluent"), partitions=2)
    j_topic = fresh_topic(long_cluster, unique_name("java"), partitions=JAVA_PARTITIONS)
    port, admin, brokers = free_port(), free_port(), listener_ports(long_cluster)
    bootstrap = f"127.0.0.1:{port}"
    after = tmp_path / "after.jsonl"
    first = gateway(long_cluster, port, admin, tmp_path / "before.jsonl", tmp_path / "before.log", brokers)
    second: ProxyProcess | None = None
    restarted = threading.Event()
    confluent = ConfluentLongTransaction(bootstrap, c_topic, unique_name("tid-c"), restarted)
    java: dict[str, Any] = {}

    def run_java() -> None:
        try:
            java["result"] = java_producer_performance(
                bootstrap, j_topic, JAVA_RECORDS, "3.5.2", record_size=64, throughput=1,
                transactional_id=unique_name("tid-j"), transaction_duration_ms=10 * TRANSACTION_TIMEOUT_MS,
                producer_props={"transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS), "linger.ms": "0",
                                "partitioner.class": "org.apache.kafka.clients.producer.RoundRobinPartitioner"},
                timeout_s=240)
        except Exception as e:  # noqa: BLE001 - reported by the assertions below
            java["error"] = e

    java_thread = threading.Thread(target=run_java, name="java-long-transaction", daemon=True)
    try:
        confluent.start()
        java_thread.start()
        assert confluent.wrote_before.wait(90) and not confluent.errors, confluent.errors
        deadline = time.monotonic() + 90
        while _written(long_cluster, j_topic, JAVA_PARTITIONS) == 0:  # Java's transaction has begun and written
            assert time.monotonic() < deadline and java_thread.is_alive(), java
            time.sleep(0.2)
        first.terminate()
        second = gateway(long_cluster, port, admin, after, tmp_path / "after.log", brokers)
        restarted.set()
        confluent.join(PAST_THE_RESTART_S + 120)
        java_thread.join(240)
    finally:
        restarted.set()
        for p in (first, second):
            if p is not None and p.proc is not None and p.proc.poll() is None:
                p.terminate()
    refusals = [r for r in _audit(after) if r.get("decision") == "rejected"]
    print(f"\nconfluent-kafka: sent {confluent.sent}, committed {confluent.committed}, errors {confluent.errors}; "
          f"java: {java}; gateway 2 decisions {len(_audit(after))}, refusals {len(refusals)}")
    assert refusals == [], refusals[:3]
    assert confluent.committed and confluent.errors == [], confluent.errors
    assert "error" not in java and java["result"].records == JAVA_RECORDS, java
    assert len(_audit(after)) > 0  # gateway 2 did judge the writes after the restart
    clients.stable_end_offsets(long_cluster.bootstrap_servers, c_topic)
    clients.stable_end_offsets(long_cluster.bootstrap_servers, j_topic)
    reader = clients.ConfluentKafkaClient()
    assert sorted(reader.consume_committed(long_cluster.bootstrap_servers, c_topic)) == sorted(
        [b"before", *(f"after-{i}".encode() for i in range(10))])
    assert len(reader.consume_committed(long_cluster.bootstrap_servers, j_topic)) == JAVA_RECORDS


@pytest.mark.parametrize("log", [True, False], ids=["following-the-log", "asking-the-coordinator"])
def test_a_second_gateway_passes_the_write_inside_the_transaction_and_refuses_the_write_after_its_commit(
    cluster: Cluster, start_proxy: Any, tmp_path: Path, unique_name: Any, log: bool,
) -> None:
    """    client ─InitProducerId, AddPartitions p0─▶ gateway A
           client ─Produce p0 "inside"─▶ gateway B ─DescribeTransactions─▶ Ongoing {p0}: forwarded
           client ─EndTxn(commit)─▶ gateway A             … the commit marker is written …
           client ─Produce p0 "late" (same epoch, no add)─▶ gateway B ─asked again─▶ CompleteCommit: INVALID_TXN_STATE
    no partition hangs: the last stable offset reaches the high watermark, and only "inside" is committed.
    Gateway B decides both from the coordinator's log it follows; without the log, by asking the coordinator
    each time (an answer it was given is no evidence for the next write)."""
    topic = fresh_topic(cluster, unique_name("replicas"))
    audit_b = tmp_path / "b.jsonl"
    gateway_a: ProxyThread = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway",
                                         verification={"transaction_log": log})
    gateway_b: ProxyThread = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway",
                                         audit={"path": str(audit_b)}, verification={"transaction_log": log})
    txn_id = unique_name("tid")
    through_a = TxnActor(gateway_a.bootstrap, txn_id)
    through_a.init()
    assert through_a.add_partitions(topic, 0) == {0: 0}
    through_b = TxnActor(gateway_b.bootstrap, txn_id, producer=through_a.producer)

    assert through_b.produce(topic, 0, [b"inside"]).error_code == ErrorCode.none
    assert through_a.end(commit=True) == ErrorCode.none
    # The commit's marker is in the log (the EndTxn answer comes before it): a write now is after the transaction.
    # (Before the marker, the leader still has the transaction open, and a write would land inside the committed
    # transaction, as the broker's own part 1 also lets it: not this case.)
    assert clients.stable_end_offsets(cluster.bootstrap_servers, topic) == {0: 2}
    late = through_b.produce(topic, 0, [b"late"])

    assert late.error_code == ErrorCode.invalid_txn_state, late
    watermarks = clients.stable_end_offsets(cluster.bootstrap_servers, topic)  # raises while a transaction hangs
    assert watermarks == {0: 2}  # "inside" and the commit marker: "late" never reached the log
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"inside"]
    judged = [(r["outcome"], r["evidence"]) for r in _audit(audit_b)]
    if log:
        assert judged == [("pass", "log"), ("late_write", "log")], judged
    else:
        assert judged[0] in {("pass", "coordinator"), ("pass", "leader")}, judged
        assert judged[-1] == ("late_write", "coordinator"), judged


@pytest.mark.parametrize(("version", "zookeeper"), [("3.5.2", False), ("2.8.2", True)])
def test_a_client_spread_over_two_gateways_without_affinity_commits_and_its_late_writes_are_refused(
    kafka_pool: ClusterPool, start_proxy: Any, unique_name: Any, version: str, zookeeper: bool,
) -> None:
    """Gateway replicas without ClientIP affinity, as the chart renders them (evidence_ttl_ms 0: no replica reuses
    what it saw; each follows the coordinator's log):

        txn 1: ─Init, AddPartitions p0─▶ A    ─Produce "1"─▶ B ✓ (log)    ─EndTxn(commit)─▶ B
        txn 2: ─AddPartitions p0─▶ A          ─Produce "2"─▶ B ✓ (B forwarded txn 1's EndTxn: not a late write)
                                              ─Produce "3"─▶ A ✓           ─EndTxn(commit)─▶ A
        late:  ─Produce p0─▶ A ✗ and ─▶ B ✗ (A saw txn 2's adds and its EndTxn; B saw txn 1's: neither decides alone)
    exactly "1", "2", "3" committed; nothing hangs (on 2.8.2 too: no DescribeTransactions, the log decides)."""
    cluster = kafka_pool.get(version, 1, zookeeper=zookeeper)
    topic = fresh_topic(cluster, unique_name("spread"))
    spread = {"evidence_ttl_ms": 0}
    a: ProxyThread = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway", verification=spread)
    b: ProxyThread = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway", verification=spread)
    txn_id = unique_name("tid")
    via_a = TxnActor(a.bootstrap, txn_id)
    via_a.init()
    via_b = TxnActor(b.bootstrap, txn_id, producer=via_a.producer, sequences=via_a.sequences)

    assert via_a.add_partitions(topic, 0) == {0: 0}
    assert via_b.produce(topic, 0, [b"1"]).error_code == ErrorCode.none
    assert via_b.end(commit=True) == ErrorCode.none
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert via_a.add_partitions(topic, 0) == {0: 0}
    assert via_b.produce(topic, 0, [b"2"]).error_code == ErrorCode.none
    assert via_a.produce(topic, 0, [b"3"]).error_code == ErrorCode.none
    assert via_a.end(commit=True) == ErrorCode.none
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    late = [via_a.produce(topic, 0, [b"late-a"]), via_b.produce(topic, 0, [b"late-b"])]

    assert [r.error_code for r in late] == [ErrorCode.invalid_txn_state] * 2, late
    assert clients.stable_end_offsets(cluster.bootstrap_servers, topic) == {0: 5}  # 3 records, 2 markers
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"1", b"2", b"3"]
    for replica in (a, b):
        assert replica.metric("txnguard_verifications_total",
                              {"evidence": "log", "outcome": "late_write", "decision": "rejected"}) == 1

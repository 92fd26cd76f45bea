"""`txnguard hanging` leaves live transactions alone, on real brokers (issue 30, items 2, 3 and 6).

1. Kafka 2.8.2 in ZooKeeper mode has no ListTransactions or DescribeTransactions: the scan reads the coordinator's
   own log, `__transaction_state`, to its end instead (issue 31 item 5). A producer that stamps event time (as
   Kafka Streams and MirrorMaker keep their input's) two hours back, its transaction open and healthy:

       producer ─begin, produce p0 (CreateTime now - 2 h)─▶ broker         the transaction is open, live
       operator ─hanging --json─▶ __transaction_state: Ongoing, p0 added, 60 s timeout: nothing found
       operator ─hanging --abort --yes─▶ nothing to abort: no WriteTxnMarkers, the high watermark does not move
       producer ─commit─▶ read_committed reads the record back

   Beside it, a real hanging transaction (a transactional batch on a partition its transaction never added,
   stamped 30 minutes back):

       operator ─hanging --json─▶ __transaction_state: the producer id's transaction lists no such partition:
                                  found, confirmed_by_transaction_log
       operator ─hanging --abort --yes─▶ WriteTxnMarkers (abort): the last stable offset reaches the high watermark

2. A follower that lags: three Kafka 3.5.2 nodes (the follower's ISR removal after 2 s, its fencing after 60 s),
   a replication-factor-2 topic. The follower has the transaction's records, is stopped (SIGSTOP), and the
   transaction commits on the leader; while it is stopped, `--broker-id <follower>` must ask the leader only:

       producer ─begin, produce p0 (acks=all: the follower has it)─▶ leader
       follower: SIGSTOP                                       its log: the transaction still open
       producer ─commit─▶ leader (the follower leaves the ISR): the marker on the leader only
       operator ─hanging --topic --broker-id <follower> --max-transaction-timeout 0─▶ the leader: nothing open
       follower: SIGCONT

   Asked, the stopped follower would not answer at all (a running one that lags would answer "open"): the scan
   must not need it. The cluster is this test's own and stops with it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_hanging import lso_and_hw, make_open_transaction, txnguard

from txnguard.proxy import hanging_io
from txnguard.proxy.config import HostPort
from txnguard.testing import clients, kafka, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.freezes import txn_id_coordinated_by
from txnguard.testing.proxy import ProxyThread
from txnguard.testing.scenarios import wait_stable
from txnguard.verification.hanging import OwnTimeout

pytestmark = [pytest.mark.integration]

NameFactory = Callable[[str], str]
EVENT_TIME_BACK = datetime.timedelta(hours=2)
TRANSACTION_MAX_TIMEOUT_MS = 60_000  # the harness's brokers (testing/kafka.py _base_config)


class Producer:
    """A confluent-kafka transactional producer, step by step (clients.ConfluentKafkaClient runs a whole one)."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        from confluent_kafka import Producer as Confluent

        self.failures: list[str] = []
        self.p = Confluent({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                            "transaction.timeout.ms": TRANSACTION_MAX_TIMEOUT_MS})
        self.p.init_transactions(30)
        self.p.begin_transaction()

    def send(self, topic: str, value: bytes, timestamp_ms: int | None = None) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.failures.append(str(err))

        self.p.produce(topic, value=value, partition=0, timestamp=timestamp_ms or 0, on_delivery=delivered)
        assert self.p.flush(30) == 0 and self.failures == [], self.failures

    def commit(self) -> None:
        self.p.commit_transaction(60)


def test_zookeeper_2_8_an_event_time_transaction_is_not_hanging_on_the_coordinators_log_and_commits(
    kafka_pool: ClusterPool, unique_name: NameFactory,
) -> None:
    cluster = kafka_pool.get("2.8.2", 1, zookeeper=True)  # test_kafka_28.py's cluster
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("eventtime"))
    event_time = datetime.datetime.now(datetime.UTC) - EVENT_TIME_BACK
    producer = Producer(bootstrap, unique_name("tid"))
    producer.send(topic, b"event-0", int(event_time.timestamp() * 1000))
    assert lso_and_hw(bootstrap, topic) == (0, 1)  # open: the last stable offset waits at its first record

    scan = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--json")
    assert scan.returncode == 0, scan.stderr
    report = json.loads(scan.stdout)
    # Two hours old by its timestamp, but the log says Ongoing with this partition, within its 60 s timeout.
    assert report["findings"] == []
    assert report["described_partitions"] == 1 and report["unconfirmed"] is False
    assert report["transaction_log"] == "read"

    done = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr
    assert clients.parse_find_hanging(done.stdout) == []
    assert lso_and_hw(bootstrap, topic) == (0, 1)  # no abort marker was written

    producer.commit()
    wait_stable(bootstrap, topic)  # EndTxn returns before the marker is written
    assert lso_and_hw(bootstrap, topic) == (2, 2)  # the record and the commit marker
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, topic) == [b"event-0"]


def test_zookeeper_2_8_a_hanging_transaction_is_confirmed_by_the_coordinators_log_and_abort_yes_aborts_it(
    kafka_pool: ClusterPool, unique_name: NameFactory,
) -> None:
    cluster = kafka_pool.get("2.8.2", 1, zookeeper=True)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("hung"))
    txn_id = unique_name("tid")
    hung = make_open_transaction(bootstrap, topic, txn_id, before=3, after=2)  # p0 never added; a 2.8 broker appends
    assert lso_and_hw(bootstrap, topic) == (3, 7)

    scan = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--json")
    assert scan.returncode == 0, scan.stderr
    report = json.loads(scan.stdout)
    (finding,) = report["findings"]
    assert (finding["producer_id"], finding["start_offset"], finding["transactional_id"]) == \
        (hung.producer_id, hung.start_offset, txn_id)
    assert (finding["reason"], finding["confirmed"]) == ("confirmed_by_transaction_log", True)
    # The log gave its state and its own timeout (InitProducerId's 60 s): the threshold is that plus the margin.
    assert (finding["coordinator_state"], finding["transaction_timeout_ms"], finding["threshold_ms"]) == \
        ("Empty", 60_000, 70_000)
    assert report["unconfirmed"] is False and report["transaction_log"] == "read"

    done = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"aborted the hanging transaction on topic {topic} partition 0 producer id {hung.producer_id}" in done.stdout
    assert lso_and_hw(bootstrap, topic) == (8, 8)  # the abort marker at 7: the last stable offset reaches the end
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, topic) == \
        [b"before-0", b"before-1", b"before-2", b"after-0", b"after-1"]


def test_zookeeper_2_8_the_proxys_scan_confirms_from_its_log_follower_and_leaves_a_live_transaction_alone(
    kafka_pool: ClusterPool, unique_name: NameFactory, start_proxy: Callable[..., ProxyThread], tmp_path: Path,
) -> None:
    """The gateway already follows __transaction_state: its periodic scan judges from that follower's view.

        producer ─begin, produce live-topic p0 (CreateTime now - 2 h)─▶ broker     live, Ongoing in the log
        raw client ─transactional batch on hung-topic p0, never added─▶ broker     hanging
        gateway scan (every 0.5 s) ─▶ one audit record: hung-topic, confirmed_by_transaction_log
                                   ─▶ live-topic: no series, scan after scan; then it commits
    """
    cluster = kafka_pool.get("2.8.2", 1, zookeeper=True)
    bootstrap = cluster.bootstrap_servers
    live_topic, hung_topic = fresh_topic(cluster, unique_name("live")), fresh_topic(cluster, unique_name("hung"))
    event_time = datetime.datetime.now(datetime.UTC) - EVENT_TIME_BACK
    producer = Producer(bootstrap, unique_name("live-tid"))
    producer.send(live_topic, b"event-0", int(event_time.timestamp() * 1000))
    txn_id = unique_name("hung-tid")
    hung = make_open_transaction(bootstrap, hung_topic, txn_id)

    audit = tmp_path / "audit.jsonl"
    p = start_proxy(upstream=bootstrap, mode="gateway", audit_path=str(audit), health={"hanging_scan_interval_s": 0.5})
    p.wait_for(lambda: p.metric("txnguard_hanging_transactions", {"topic": hung_topic, "partition": "0"}) == 1,
               timeout=60, what="the hanging transaction's gauge")
    scans = p.metric("txnguard_hanging_scans_total", {"outcome": "ok"})
    p.wait_for(lambda: p.metric("txnguard_hanging_scans_total", {"outcome": "ok"}) >= scans + 3,
               timeout=30, what="three more scans")

    records = [r for r in map(json.loads, audit.read_text().splitlines()) if r["kind"] == "hanging"]
    assert [(r["topic"], r["producer_id"], r["start_offset"], r["reason"], r["transactional_id"]) for r in records] \
        == [(hung_topic, hung.producer_id, hung.start_offset, "confirmed_by_transaction_log", txn_id)]
    assert p.proxy is not None
    assert p.proxy.metrics.registry.get_sample_value(
        "txnguard_hanging_transactions", {"topic": live_topic, "partition": "0"}) is None
    # Judged from the follower the gateway already runs (no one-shot read of its own).
    assert p.proxy.hanging is not None and p.proxy.hanging.follower is p.proxy.guard.follower is not None
    last = p.proxy.hanging.last
    assert last is not None and last.transaction_log == "read" and not last.unconfirmed
    producer.commit()
    wait_stable(bootstrap, live_topic)
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, live_topic) == [b"event-0"]


@pytest.fixture(scope="module")
def lagging_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka.Cluster]:
    """Three 3.5.2 nodes of this module's own: a stopped follower leaves the ISR after 2 s (so a commit does not
    wait for it) and is fenced only after 60 s (so it stays in the metadata, as a follower that lags does)."""
    cluster = kafka.up("3.5.2", 3, tmp_path_factory.mktemp("lagging"), {"replica.lag.time.max.ms": "2000",
                                                                         "broker.session.timeout.ms": "60000"},
                       die_with_parent=True, quick_jit=True)
    try:
        yield cluster
    finally:
        cluster.down(grace_s=0)


def test_a_scan_asks_the_leader_not_a_follower_that_lags(lagging_cluster: kafka.Cluster,
                                                          unique_name: NameFactory) -> None:
    cluster = lagging_cluster
    topic, follower = _topic_followed_by_a_non_controller(cluster, unique_name)
    txn_id, _ = txn_id_coordinated_by(cluster, unique_name("tid"), lambda c: c != follower)
    through = ",".join(n.address for n in cluster.nodes if n.id != follower)  # the nodes that answer

    producer = Producer(cluster.bootstrap_servers, txn_id)
    producer.send(topic, b"committed-0")  # acks=all: the follower has the open transaction's record
    cluster.pause_node(follower)
    try:
        producer.commit()  # the follower leaves the ISR; the marker is on the leader only
        wait_stable(through, topic)  # EndTxn returns before the marker is written: the scan comes after it
        scan = txnguard("hanging", "--bootstrap", through, "--topic", topic, "--broker-id", str(follower),
                        "--max-transaction-timeout", "0", "--timeout", "5", "--json")
        still_stopped = cluster.paused(follower)
    finally:
        cluster.resume_node(follower)

    assert still_stopped  # the scan ran while the follower could not have answered
    assert scan.returncode == 0, scan.stderr
    report = json.loads(scan.stdout)
    assert (report["findings"], report["described_partitions"], report["errors"]) == ([], 1, {})
    assert clients.ConfluentKafkaClient().consume_committed(through, topic) == [b"committed-0"]


def test_each_sidecar_scans_what_its_broker_leads(lagging_cluster: kafka.Cluster, unique_name: NameFactory) -> None:
    """A sidecar's scan learns its broker's id (DescribeConfigs: a broker describes only itself) and covers the
    partitions that broker leads: over the three sidecars, each partition once (a follower's view is no one's)."""
    cluster = lagging_cluster
    topic = fresh_topic(cluster, unique_name("sidecars"), partitions=3, replication_factor=2)

    async def sidecar_scan(node: kafka.Node) -> hanging_io.ScanResult:
        admin = hanging_io.ClusterAdmin([HostPort(node.host, node.port)])  # a sidecar's upstream: its own broker
        try:
            return await hanging_io.scan(admin, hanging_io.Scope(topic=topic, local_broker=True), OwnTimeout())
        finally:
            await admin.close()

    async def own_id(node: kafka.Node) -> int:
        admin = hanging_io.ClusterAdmin([HostPort(node.host, node.port)])
        try:
            return await admin.own_broker_id(await admin.metadata(topic))
        finally:
            await admin.close()

    scans = {n.id: asyncio.run(sidecar_scan(n)) for n in cluster.nodes}
    leads = {n.id: sum(cluster.leader(topic, p) == n.id for p in range(3)) for n in cluster.nodes}
    assert {n: result.partitions for n, result in scans.items()} == leads
    assert all(result.errors == {} and result.findings == () for result in scans.values())
    assert {n.id: asyncio.run(own_id(n)) for n in cluster.nodes} == {n.id: n.id for n in cluster.nodes}


def _topic_followed_by_a_non_controller(cluster: kafka.Cluster, unique_name: NameFactory) -> tuple[str, int]:
    """A fresh replication-factor-2 topic whose follower is not the KRaft quorum's leader: stopping the active
    controller would hold every ISR change (AlterPartition) until a new one is elected and the old one's requests
    time out, and the commit with them (seen once: a 60 s commit timeout)."""
    states = [json.loads((cluster.node_dir(n.id) / "data" / "__cluster_metadata-0" / "quorum-state").read_text())
              for n in cluster.nodes]
    controller = max(states, key=lambda state: int(state["leaderEpoch"]))["leaderId"]
    for _ in range(10):
        topic = fresh_topic(cluster, unique_name("lag"), replication_factor=2)
        _, follower = _replicas(cluster, topic)
        if follower != controller:
            return topic, follower
    raise AssertionError(f"every topic's follower was the active controller ({controller})")


def _replicas(cluster: kafka.Cluster, topic: str) -> tuple[int, int]:
    """(leader, follower) of the topic's partition 0 (replication factor 2)."""
    _, host, port = raw.leader_of(cluster.bootstrap_servers, topic, 0)
    with raw.RawClient(host, port) as client:
        (t,) = client.metadata([topic]).topics
    (p,) = t.partitions
    (follower,) = {int(r) for r in p.replica_nodes} - {int(p.leader_id)}
    return int(p.leader_id), follower

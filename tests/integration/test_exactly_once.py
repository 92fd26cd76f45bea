"""S6: exactly once through the gateway, with a broker SIGKILLed and restarted in the middle of the copy.

Consume-transform-produce applications copy 10,000 records each from an input topic (RF 3,
two partitions) to an output topic (RF 3, two partitions) through a gateway proxy with verification
on (its defaults), on three Kafka 3.5.2 nodes:

* Java 3.5.2 TransactionalMessageCopier: Kafka's own system-test tool, one copier per input partition
  as Kafka's transactions system test runs it (5,000 records each here, 10,000 there), 200 records per transaction, the
  offsets in the transaction, abort and rewind to the committed offsets on any non-fatal error. The
  same cell with the Java 2.8.2 copier runs on three ZooKeeper-mode Kafka 3.0.2 brokers
  (test_zookeeper_matrix.py, `s6_java_copiers_through_a_broker_crash`);
* a confluent-kafka loop written as an application would (clients.confluent_exactly_once_copy):
  subscribe with read_committed, copy_of(value) to the same partition, send_offsets_to_transaction
  with the group metadata, commit every 500 records, abort and rewind on an abortable error. Its
  group is one whose coordinator is not the killed broker: librdkafka 2.16 itself hangs forever in
  send_offsets_to_transaction when the group coordinator leaves the Metadata (#5511/#5456), which
  bench/librdkafka_5511.py reports directly against the brokers (a client race: not a test).

    seed 10,000 ──▶ input (p0, p1)
    copier(s) ──consume──▶ proxy ──▶ brokers        copier ──Produce/TxnOffsetCommit/EndTxn──▶ proxy ──▶ brokers
                         ══ SIGKILL the leader of output partition 0 at ~30 % progress; start it again ══
    copier(s) retry, abort and rewind as they see fit, and finish
    afterwards, from the brokers directly:
      read_committed output == input, partition by partition, in order (no loss, no duplicate)
      the group's committed offsets == the input's end offsets
      kafka-transactions find-hanging --topic output --max-transaction-timeout 0 finds nothing
    printed: records lost, duplicated, hanging (each asserted 0)

Each copy is bounded (240 s) and the file takes about 2 minutes on two cores.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, direct_bootstrap, gateway_for

pytestmark = [pytest.mark.integration]

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]

RECORDS = 10_000
PARTITIONS = 2
COPY_TIMEOUT_S = 240.0
CRASH_AT = 0.3  # fraction of the output written (committed or not) when the broker is killed
DOWN_S = 3.0  # how long the killed broker stays down before it is started again
FAILURE_REASONS = ("not_in_transaction", "late_write", "coordinator_unavailable", "producer_fenced",
                   "producer_id_mapping")


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 3)


@dataclass
class Copy:
    source: str
    sink: str
    group: str
    inputs: dict[int, list[bytes]]  # partition -> values, in offset order


def _prepare(cluster: Cluster, unique_name: NameFactory) -> Copy:
    source = fresh_topic(cluster, unique_name("in"), partitions=PARTITIONS, replication_factor=3)
    sink = fresh_topic(cluster, unique_name("out"), partitions=PARTITIONS, replication_factor=3)
    inputs = {p: [f"{source}-p{p}-{i}".encode() for i in range(RECORDS // PARTITIONS)] for p in range(PARTITIONS)}
    seeder = clients.ConfluentKafkaClient()
    for p, values in inputs.items():
        seeder.produce(direct_bootstrap(cluster), source, values, partition=p)
    assert clients.stable_end_offsets(direct_bootstrap(cluster), source) == {p: len(v) for p, v in inputs.items()}
    return Copy(source, sink, unique_name("group"), inputs)


def _written(cluster: Cluster, topic: str) -> int:
    """Records (and markers) in the topic's logs, committed or not: the copiers' progress."""
    total = 0
    for p in range(PARTITIONS):
        _, host, port = raw.leader_of(direct_bootstrap(cluster, live=True), topic, p)
        with raw.RawClient(host, port, timeout=5) as c:
            total += c.list_offsets(topic, p, read_committed=False)
    return total


@dataclass
class Crash:
    victim: int
    killed_after_s: float  # from the start of the copy
    down_s: float
    ready_after_s: float  # from the kill until the restarted cluster was ready


def _crash_midway(cluster: Cluster, victim: int, progress: Callable[[], int], running: Sequence[
        concurrent.futures.Future[object]], started: float) -> Crash:
    """Kill `victim` with SIGKILL once the copy is CRASH_AT done, start it again DOWN_S later.

    Runs in the test's main thread: nodes are started with a parent-death signal bound to the
    thread that starts them, so a node started from a worker thread would die with that thread.
    """
    deadline = time.monotonic() + COPY_TIMEOUT_S
    while progress() < CRASH_AT * RECORDS:
        assert not any(f.done() for f in running), "a copy ended before the crash"
        assert time.monotonic() < deadline, "no progress towards the crash point"
        time.sleep(0.05)
    assert not any(f.done() for f in running), "a copy ended before the crash"
    cluster.kill_node(victim)
    killed = time.monotonic()
    time.sleep(DOWN_S)
    cluster.start_node(victim)
    cluster.wait_ready()
    return Crash(victim, killed - started, DOWN_S, time.monotonic() - killed)


def _group_not_coordinated_by(cluster: Cluster, node: int, unique_name: NameFactory) -> str:
    for _ in range(50):
        group = unique_name("group")
        if cluster.group_coordinator(group) != node:
            return group
    raise AssertionError(f"no group name found whose coordinator is not node {node}")


@pytest.fixture
def restarts_killed_nodes(cluster: Cluster) -> Iterator[None]:
    """Whatever happens, the shared cluster gets every node back."""
    yield
    for n in cluster.nodes:
        cluster.start_node(n.id)  # a no-op for a node that runs
    cluster.wait_ready()


def _assert_exactly_once(cluster: Cluster, proxy: ProxyThread, copy: Copy,
                         transform: Callable[[bytes], bytes]) -> None:
    bootstrap = direct_bootstrap(cluster)  # the brokers themselves (in the sidecar layout, their own listener)
    # No transaction left open on the output: every commit's and abort's markers are written.
    ends = clients.stable_end_offsets(bootstrap, copy.sink, timeout_s=60)
    reader = clients.ConfluentKafkaClient()
    lost = duplicated = unexpected = 0
    in_order = True
    for p, values in copy.inputs.items():
        expected = [transform(v) for v in values]
        out = reader.consume_committed(bootstrap, copy.sink, [p], timeout_s=60)
        seen = set(out)
        lost += len(set(expected) - seen)
        duplicated += len(out) - len(seen)
        unexpected += len(seen - set(expected))
        in_order = in_order and out == expected
    # find-hanging with a 0-minute threshold: every open transaction on the output is a candidate, and
    # it reports those the coordinator does not know.
    hanging = clients.transactions_find_hanging(bootstrap, topic=copy.sink, max_transaction_timeout_minutes=0)
    failures = {r: proxy.metric("txnguard_verification_failures_total", {"reason": r}) for r in FAILURE_REASONS}
    print(f"{RECORDS} records: {lost} lost, {duplicated} duplicated, {unexpected} unexpected, "
          f"{len(hanging)} hanging (find-hanging --max-transaction-timeout 0), in order: {in_order}; "
          f"output log ends {ends}; proxy verification failures {failures}")
    assert (lost, duplicated, unexpected, len(hanging)) == (0, 0, 0, 0), hanging
    assert in_order, "every output partition holds its input's copies in the input's order"
    # The offsets were committed with the transactions, up to the end of the input.
    assert reader.committed_offsets(bootstrap, copy.group, copy.source) == \
        {p: len(v) for p, v in copy.inputs.items()}
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []


def s6_java_copiers_through_a_broker_crash(cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
                                           java_version: str) -> None:
    """S6 with Kafka's TransactionalMessageCopier of `java_version`, one per input partition, through a gateway
    in front of `cluster`; the output's partition-0 leader SIGKILLed at 30 % and started again. Also the
    ZooKeeper 3.0.2 cell of test_zookeeper_matrix.py."""
    copy = _prepare(cluster, unique_name)
    victim = cluster.leader(copy.sink, 0)
    proxy = gateway_for(cluster, start_proxy)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(PARTITIONS) as pool:
        copiers = [pool.submit(clients.java_transactional_copier, proxy.bootstrap, copy.source, copy.sink,
                               f"{copy.group}-tid-{p}", copy.group, len(values), java_version, input_partition=p,
                               transaction_size=200, timeout_s=COPY_TIMEOUT_S)
                   for p, values in copy.inputs.items()]
        crash = _crash_midway(cluster, victim, lambda: _written(cluster, copy.sink), copiers, started)
        results = [c.result(COPY_TIMEOUT_S + 30) for c in copiers]
    mode = "zookeeper" if cluster.zookeeper else "kraft"
    print(f"\nJava {java_version} on {cluster.version} {mode}: {time.monotonic() - started:.0f}s, {crash}, {results}")

    for p, r in enumerate(results):
        n = len(copy.inputs[p])
        assert r.shutdown_complete and (r.total_processed, r.remaining) == (n, 0), r
    _assert_exactly_once(cluster, proxy, copy, lambda v: v)
    _assert_the_log_followed(proxy, [f"{copy.group}-tid-{p}" for p in copy.inputs])


def _assert_the_log_followed(proxy: ProxyThread, txn_ids: Sequence[str]) -> None:
    """The gateway's follower of __transaction_state through the crash: every partition read from its leader (those
    the killed broker led: from their new leaders) to its end, no problem left, each copier's last transaction read
    as committed (written after the crash), and no write refused on the log."""
    assert proxy.proxy is not None and proxy.proxy.guard.follower is not None
    follower = proxy.proxy.guard.follower
    def states() -> dict[str, str | None]:
        return {t: getattr(follower.view.describe(t), "state", None) for t in txn_ids}

    # The lag is as of the follower's last read, and an idle follower reads every few seconds: the last
    # transactions' records may come with its next read, so the states are waited for too, not read once.
    try:
        proxy.wait_for(lambda: follower.problem is None and proxy.metric("txnguard_transaction_log_lag_records") == 0
                       and all(follower.partition_usable(p) for p in follower.leaders)
                       and set(states().values()) == {"CompleteCommit"}, 60,
                       "the follower at the log's end, every copier's last transaction CompleteCommit")
    except AssertionError as e:
        raise AssertionError(f"{e}: {states()}") from None
    refused_on_the_log = sum(s.value for m in proxy.proxy.metrics.registry.collect() for s in m.samples
                             if s.name == "txnguard_verifications_total" and s.labels.get("evidence") == "log"
                             and s.labels.get("decision") == "rejected")
    assert refused_on_the_log == 0
    by_evidence = {e: proxy.metric("txnguard_verifications_total", {"evidence": e, "outcome": "pass",
                                                                      "decision": "forwarded"})
                   for e in ("local", "log", "leader", "coordinator")}
    print(f"the follower: {proxy.metric('txnguard_transaction_log_records_total', {'outcome': 'state'}):.0f} records "
          f"read, lag 0; writes passed by evidence {by_evidence}")


@pytest.mark.java
def test_s6_java_copier_exactly_once_through_a_broker_crash(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, restarts_killed_nodes: None,
) -> None:
    # Java 2.8.2's cell runs on ZooKeeper-mode 3.0.2 (test_zookeeper_matrix.py), where most of its users are.
    s6_java_copiers_through_a_broker_crash(cluster, start_proxy, unique_name, "3.5.2")


@pytest.mark.timeout(420)
def test_s6_confluent_kafka_loop_exactly_once_through_a_broker_crash(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, restarts_killed_nodes: None,
) -> None:
    copy = _prepare(cluster, unique_name)
    victim = cluster.leader(copy.sink, 0)
    # Not the group's coordinator: librdkafka 2.16 hangs in send_offsets_to_transaction when that broker
    # leaves the Metadata (its bugs #5511/#5456, which bench/librdkafka_5511.py reports directly against the
    # brokers: a client race, not a test).
    copy.group = _group_not_coordinated_by(cluster, victim, unique_name)
    proxy = gateway_for(cluster, start_proxy)
    copied = [0]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loop = pool.submit(clients.confluent_exactly_once_copy, proxy.bootstrap, copy.source, copy.sink,
                           f"{copy.group}-tid", copy.group, RECORDS, commit_every=500, timeout_s=COPY_TIMEOUT_S,
                           progress=lambda n: copied.__setitem__(0, n))
        crash = _crash_midway(cluster, victim, lambda: copied[0], [loop], started)
        result = loop.result(COPY_TIMEOUT_S + 30)
    print(f"\nconfluent-kafka loop: {time.monotonic() - started:.0f}s, {crash}, {result.transactions} "
          f"transactions, {result.aborted} aborted, {result.producers} producer(s), errors {result.errors[:10]}")

    assert result.copied == RECORDS
    _assert_exactly_once(cluster, proxy, copy, clients.copy_of)

"""Every real client runs its suite THROUGH the proxy: the bootstrap address it gets is a proxy's.

Each test reads like a sequence: what the client does through the proxy, what the
real brokers hold afterwards (asked directly where that matters), what the
client reads back, and at the end (f): no byte the proxy wrote to a client ever
carried a real broker address (`wire.leaks`), for every proxy the test used.

Suites: (a) plain produce + consume; (b) a consumer group through a rebalance
(one member, then a second joins, the partitions are split, both consume);
(c) consume-transform-produce with the consumed offsets sent to the transaction
(the first transaction aborted after its offsets were sent, then redone; the
Java side is TransactionalMessageCopier); (d) admin create + describe topics and
describe cluster; (e) a leader change followed by a producer mid-stream.

Covered cells (G = gateway, S = one sidecar per broker, 1n/3n = nodes):

| suite | client | 3.5.2 | 3.9.2 | 4.4.0 |
| --- | --- | --- | --- | --- |
| (a) produce + consume, 2 partitions | kafka-python, confluent-kafka, aiokafka | G 1n | G 1n | G 1n |
| (c) copy with offsets in the transaction | kafka-python, confluent-kafka, aiokafka | G 1n | G 1n | G 1n |
| (b) group of two through a rebalance | kafka-python, confluent-kafka, aiokafka | | G 3n | |
| (d) create + describe topics, describe cluster | kafka-python, confluent-kafka, aiokafka | | G 3n | |
| (a) produce, metadata, read_committed consume | kcat | | G 3n | |
| (e) leader stopped mid-stream, then restarted | confluent-kafka | | G 3n | |
| (a) + (c) | confluent-kafka | S 3n | | |
| (a) VerifiableProducer + (c) TransactionalMessageCopier | Java 3.5.2 | S 3n | | |
| (a) VerifiableProducer + (c) TransactionalMessageCopier | Java 2.8.2 | G 1n | | |
| (f) negative control: a misplaced sidecar leaks, and the check sees it | confluent-kafka | S 1n | | |

Every value of every axis, not the product: sidecars run on 3.5.2 here (the brokers txnguard is for) and
on ZooKeeper 3.0.2 in test_zookeeper_matrix.py; 4.4.0 runs through a gateway here and in test_tv2_clients.py.
A 4.x three-node sidecar cluster cost the gate about a minute and covered no axis value another cell misses.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, gateway_for

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

BROKER_VERSIONS = ("3.5.2", "3.9.2", "4.4.0")
SIDECAR_VERSIONS = ("3.5.2",)
PYTHON_CLIENTS = list(clients.PYTHON_CLIENTS)
NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]
Join = Callable[[clients.GroupMember], clients.GroupMember]


@pytest.fixture(scope="module")
def cluster3(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.9.2", 3)


@pytest.fixture(params=SIDECAR_VERSIONS)
def sidecar_cluster(kafka_pool: ClusterPool, request: pytest.FixtureRequest) -> Cluster:
    """Three nodes that advertise their sidecars' ports to clients."""
    return kafka_pool.get(request.param, 3, sidecars=True)


@pytest.fixture
def group_members() -> Iterator[Join]:
    """`join(member)` starts a group member; every member leaves its group when the test ends."""
    started: list[clients.GroupMember] = []

    def join(member: clients.GroupMember) -> clients.GroupMember:
        started.append(member.start())
        return member

    yield join
    for m in reversed(started):
        m.stop()


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str,
                explain: Callable[[], str] | None = None) -> None:
    """`explain()`, on a timeout, says what the parties saw (in the failure's message)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            said = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{said}")
        time.sleep(0.1)


def _group_as_the_brokers_see_it(cluster: Cluster, group: str) -> str:
    """The group's state and each member's partitions, asked of the brokers directly (librdkafka's admin)."""
    from confluent_kafka.admin import AdminClient

    try:
        (future,) = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).describe_consumer_groups(
            [group], request_timeout=10).values()
        g = future.result(timeout=15)
    except Exception as e:  # noqa: BLE001 - a diagnostic: what went wrong is the answer
        return f"the brokers' view of {group}: not described ({e!r})"
    members = {m.client_id + "/" + m.member_id[-8:]: sorted(tp.partition for tp in m.assignment.topic_partitions)
               for m in g.members}
    return f"the brokers' view of {group}: {g.state}, members {members}"


def _listeners(proxy: ProxyThread, cluster: Cluster) -> dict[int, tuple[str, int]]:
    """Broker id -> the gateway listener standing in for it."""
    assert proxy.proxy is not None
    return {n.id: ("127.0.0.1", proxy.proxy.listeners[n.id].address.port) for n in cluster.nodes}


def _assert_no_leaks(cluster: Cluster, *proxies: ProxyThread) -> None:
    """(f): the clients' responses went through these proxies, and none named a real broker address."""
    assert any(p.wire is not None and p.wire.data() for p in proxies), "no response went through the proxies"
    for proxy in proxies:
        assert proxy.wire is not None
        assert proxy.wire.leaks(broker_addresses(cluster)) == []


def _produce_spread(producer: clients.PlainProducer, bootstrap: str, topic: str, values: Sequence[bytes],
                    partitions: int) -> dict[int, list[bytes]]:
    """Value i goes to partition i % partitions; returns what each partition got."""
    spread = {p: list(values[p::partitions]) for p in range(partitions)}
    for p, vs in spread.items():
        producer.produce(bootstrap, topic, vs, partition=p)
    return spread


def _led_on_every_broker(cluster: Cluster, topic: str, partitions: int) -> bool:
    for n in cluster.nodes:
        with raw.RawClient(n.host, n.port) as c:
            (t,) = c.metadata([topic]).topics
        if t.error_code != ErrorCode.none or len(t.partitions) != partitions or \
                any(int(p.leader_id) < 0 for p in t.partitions):
            return False
    return True


def _sidecars(cluster: Cluster, start_proxy: StartProxy) -> dict[int, ProxyThread]:
    """Broker id -> its sidecar, listening on the port that broker advertises to clients."""
    return {n.id: start_proxy(mode="sidecar", upstream=f"{n.host}:{n.port}", listen=f"{n.host}:{n.sidecar_port}")
            for n in cluster.nodes}


def _assert_copied_exactly_once(reader: clients.PythonClient, bootstrap: str, sink: str,
                                expected: Sequence[bytes]) -> None:
    out = reader.consume_committed(bootstrap, sink)
    assert len(out) == len(expected)
    assert len(set(out)) == len(out), "duplicates in the output"
    assert set(out) == set(expected)


# -- (a) plain produce and consume, gateway, one node, every version x every Python client -----------


@pytest.mark.parametrize("client_name", PYTHON_CLIENTS)
@pytest.mark.parametrize("version", BROKER_VERSIONS)
def test_plain_produce_and_consume_through_the_gateway(
    kafka_pool: ClusterPool, start_proxy: StartProxy, unique_name: NameFactory, version: str, client_name: str,
) -> None:
    cluster = kafka_pool.get(version, 1)
    topic = fresh_topic(cluster, unique_name("plain"), partitions=2)
    proxy = gateway_for(cluster, start_proxy)
    client = clients.PYTHON_CLIENTS[client_name]
    values = _values("plain", 20)

    client.produce(proxy.bootstrap, topic, values[:10], partition=0)
    client.produce(proxy.bootstrap, topic, values[10:], partition=1)

    # The broker, asked directly, holds every record.
    assert clients.stable_end_offsets(cluster.bootstrap_servers, topic) == {0: 10, 1: 10}
    # The same client reads them back through the proxy, partition by partition.
    assert client.consume_committed(proxy.bootstrap, topic) == values
    assert proxy.metric("txnguard_frames_total", {"api": "produce", "direction": "client_to_broker"}) >= 2
    assert proxy.metric("txnguard_frames_total", {"api": "fetch", "direction": "broker_to_client"}) >= 1
    _assert_no_leaks(cluster, proxy)


# -- (c) consume-transform-produce with the offsets in the transaction ------------------------------


@pytest.mark.parametrize("client_name", PYTHON_CLIENTS)
@pytest.mark.parametrize("version", BROKER_VERSIONS)
def test_consume_transform_produce_with_offsets_in_the_transaction(
    kafka_pool: ClusterPool, start_proxy: StartProxy, unique_name: NameFactory, version: str, client_name: str,
) -> None:
    cluster = kafka_pool.get(version, 1)
    source = fresh_topic(cluster, unique_name("in"), partitions=2)
    sink = fresh_topic(cluster, unique_name("out"), partitions=2)
    group = unique_name("group")
    proxy = gateway_for(cluster, start_proxy)
    client = clients.PYTHON_CLIENTS[client_name]
    values = _values("record", 60)
    client.produce(proxy.bootstrap, source, values[:30], partition=0)
    client.produce(proxy.bootstrap, source, values[30:], partition=1)

    result = client.copy_transactionally(proxy.bootstrap, source, sink, unique_name("tid"), group, count=60,
                                         batch_size=20, abort_first=True)

    # The first transaction was aborted after its records were acked and its offsets sent; then redone.
    assert [t.committed for t in result.transactions][:2] == [False, True]
    assert all(t.committed for t in result.transactions[1:])
    assert result.committed_records == 60
    assert result.aborted_records > 0
    # The log, asked directly, holds the aborted copies too, and one marker per partition per transaction ...
    ends = clients.stable_end_offsets(cluster.bootstrap_servers, sink)
    assert sum(ends.values()) == result.committed_records + result.aborted_records + result.markers
    # ... but read_committed sees every input copied exactly once, in order, in its own partition.
    assert client.consume_committed(proxy.bootstrap, sink) == [clients.copy_of(v) for v in values]
    # The copier never commits offsets itself: the transactions committed them for the group.
    assert client.committed_offsets(proxy.bootstrap, group, source) == {0: 30, 1: 30}
    assert proxy.metric("txnguard_frames_total", {"api": "txn_offset_commit", "direction": "client_to_broker"}) >= 2
    _assert_no_leaks(cluster, proxy)


# -- Java 2.8.2 through the gateway on 3.5.2 ------------------------------------------------------------


@pytest.mark.java
def test_java_282_copier_through_the_gateway(
    kafka_pool: ClusterPool, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    source = fresh_topic(cluster, unique_name("in"))
    sink = fresh_topic(cluster, unique_name("out"))
    group = unique_name("group")
    proxy = gateway_for(cluster, start_proxy)

    seeded = clients.java_verifiable_producer(proxy.bootstrap, source, 1000, java_version="2.8.2")
    assert seeded.errors == []
    assert sorted(seeded.acked_values, key=int) == [str(i) for i in range(1000)]

    result = clients.java_transactional_copier(
        proxy.bootstrap, source, sink, unique_name("tid"), group, max_messages=1000, java_version="2.8.2",
        transaction_size=100,
    )

    assert result.shutdown_complete
    assert result.total_processed == 1000
    # The broker, asked directly: no transaction of the copier's is left open on the output.
    clients.stable_end_offsets(cluster.bootstrap_servers, sink)
    reader = clients.ConfluentKafkaClient()
    _assert_copied_exactly_once(reader, proxy.bootstrap, sink, [v.encode() for v in seeded.acked_values])
    assert reader.committed_offsets(proxy.bootstrap, group, source) == {0: 1000}
    _assert_no_leaks(cluster, proxy)


# -- negative control: the leak check sees a real address when one does reach a client ----------------------


def test_negative_control_a_sidecar_before_a_self_advertising_broker_leaks_and_the_check_sees_it(
    kafka_pool: ClusterPool, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    # A sidecar passes addresses through unchanged, so in front of a broker that advertises its own
    # address (not the sidecar's) the client learns the real one: the misconfiguration (f) guards against.
    cluster = kafka_pool.get("3.5.2", 1)
    topic = fresh_topic(cluster, unique_name("leak"))
    (node,) = cluster.nodes
    proxy = start_proxy(mode="sidecar", upstream=node.address)

    clients.ConfluentKafkaClient().produce(proxy.bootstrap, topic, [b"bypass"])

    assert proxy.wire is not None
    assert proxy.wire.leaks(broker_addresses(cluster)) == [(node.host, node.port)]


# -- gateway in front of three 3.9.2 nodes: groups, admin, kcat, a leader change -------------------


@pytest.mark.parametrize("client_name", PYTHON_CLIENTS)
def test_a_consumer_group_rebalances_through_the_gateway(
    cluster3: Cluster, start_proxy: StartProxy, unique_name: NameFactory, group_members: Join, client_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The Python clients' group coordinators log each join and assignment at INFO: shown if the test fails.
    for logger in ("kafka.coordinator", "aiokafka.consumer.group_coordinator"):
        caplog.set_level(logging.INFO, logger=logger)
    topic = fresh_topic(cluster3, unique_name("grp"), partitions=4)
    group = unique_name("group")
    everything = frozenset(range(4))
    proxy = gateway_for(cluster3, start_proxy)
    client = clients.PYTHON_CLIENTS[client_name]
    before = _values("before", 40)
    _produce_spread(client, proxy.bootstrap, topic, before, partitions=4)

    def read(*members: clients.GroupMember) -> set[bytes]:
        return {r.value for m in members for r in m.records()}

    # One member: it gets every partition and reads everything so far.
    first = group_members(client.group_member(proxy.bootstrap, topic, group))
    _wait_until(lambda: first.assignment() == everything and read(first) >= set(before), 45,
                "the first member to own all partitions and read the first records")

    # A second member joins: the group rebalances and the partitions are split between the two.
    second = group_members(client.group_member(proxy.bootstrap, topic, group))

    def split() -> bool:
        a, b = first.assignment(), second.assignment()
        return bool(a) and bool(b) and not a & b and a | b == everything

    # A deadline, not a measure: in one gate run kafka-python's own event loop was starved (its selector warned of
    # 0.2-0.6 s tasks, two test workers and three brokers on two cores) and its members had not settled after
    # 60 s; in another, not after 150 s. Alone the three families split in seconds (kafka-python five runs of
    # five beside a busy core). Since then a member that does not rejoin within 30 s is left out of that round
    # by the coordinator (GroupMember's rebalance timeout, the clients' default being 5 minutes), and a timeout
    # says what each member and the brokers saw. The proxy relays the group's requests as it does any.
    def seen() -> str:
        return (f"the first member's assignments {first.assignments()}, the second's {second.assignments()}; "
                f"{_group_as_the_brokers_see_it(cluster3, group)}")

    _wait_until(split, 150, "the rebalance to split the partitions between the two members", seen)
    owned = [a for a in first.assignments() if a]  # empty while joining and during the rebalance
    assert (owned[0], owned[-1]) == (everything, first.assignment())
    assert first.assignment() < everything

    # New records: each is read by the member that now owns its partition, so both consume.
    after = _produce_spread(client, proxy.bootstrap, topic, _values("after", 40), partitions=4)
    owner = {p: m for m in (first, second) for p in m.assignment()}
    _wait_until(lambda: all(read(owner[p]) >= set(vs) for p, vs in after.items()), 45,
                "every new record to reach the member that owns its partition")
    assert first.assignment() | second.assignment() == everything  # no further rebalance happened meanwhile
    assert read(first, second) >= set(before)  # nothing lost across the rebalance
    _assert_no_leaks(cluster3, proxy)


@pytest.mark.parametrize("client_name", PYTHON_CLIENTS)
def test_admin_creates_and_describes_topics_through_the_gateway(
    cluster3: Cluster, start_proxy: StartProxy, unique_name: NameFactory, client_name: str,
) -> None:
    proxy = gateway_for(cluster3, start_proxy)
    admin = clients.PYTHON_CLIENTS[client_name]
    name = unique_name("admin")

    admin.create_topic(proxy.bootstrap, name, partitions=3, replication_factor=3)

    # Every broker, asked directly, learns of it (the next client may be routed to any of them).
    _wait_until(lambda: _led_on_every_broker(cluster3, name, partitions=3), 30, f"every broker to know {name}")
    described = admin.describe_topic(proxy.bootstrap, name)
    assert sorted(described.partitions) == [0, 1, 2]
    for p, d in described.partitions.items():
        assert sorted(d.replicas) == sorted(n.id for n in cluster3.nodes)
        assert d.leader in d.replicas
        assert d.leader == cluster3.leader(name, p)  # what the brokers say, asked directly
    # The cluster as the client sees it: the real broker ids, each at its proxy listener.
    assert admin.describe_cluster(proxy.bootstrap) == _listeners(proxy, cluster3)
    _assert_no_leaks(cluster3, proxy)


def test_kcat_produces_lists_and_consumes_through_the_gateway(
    cluster3: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    topic = fresh_topic(cluster3, unique_name("kcat"), partitions=3)
    proxy = gateway_for(cluster3, start_proxy)
    kcat = clients.Kcat()

    spread = _produce_spread(kcat, proxy.bootstrap, topic, _values("kcat", 30), partitions=3)

    md = kcat.metadata(proxy.bootstrap, topic=topic)
    assert {b["id"]: b["name"] for b in md["brokers"]} == {
        node_id: f"{host}:{port}" for node_id, (host, port) in _listeners(proxy, cluster3).items()
    }
    assert clients.stable_end_offsets(cluster3.bootstrap_servers, topic) == {0: 10, 1: 10, 2: 10}
    assert kcat.consume_committed(proxy.bootstrap, topic) == [v for p in sorted(spread) for v in spread[p]]
    _assert_no_leaks(cluster3, proxy)


def test_a_producer_follows_a_leader_change_through_the_gateway(
    cluster3: Cluster, start_proxy: StartProxy, unique_name: NameFactory, request: pytest.FixtureRequest,
) -> None:
    topic = fresh_topic(cluster3, unique_name("failover"), partitions=1, replication_factor=3)
    old_leader = cluster3.leader(topic, 0)
    proxy = gateway_for(cluster3, start_proxy)
    client = clients.ConfluentKafkaClient()
    producer = client.background_producer(proxy.bootstrap, topic).start()
    request.addfinalizer(lambda: _restart_and_stop(cluster3, old_leader, producer))

    _wait_until(lambda: len(producer.acked()) >= 200, 30, "200 acks from the first leader")

    # The leader stops (SIGTERM: a controlled shutdown hands leadership to another replica).
    cluster3.stop_node(old_leader)
    _wait_until(lambda: _leader(cluster3, topic) not in (old_leader, -1), 30, "a new leader")
    # The client learns the new leader through the proxy and keeps going through its listener.
    during = len(producer.acked())
    _wait_until(lambda: len(producer.acked()) >= during + 200, 60, "200 acks while the old leader is down")

    # The old leader comes back; production never stopped.
    cluster3.start_node(old_leader)
    cluster3.wait_ready()
    back = len(producer.acked())
    _wait_until(lambda: len(producer.acked()) >= back + 100, 30, "100 acks after the old leader returned")
    producer.stop()

    acked = producer.acked()
    assert producer.errors() == []
    assert len(acked) == producer.sent
    # Idempotent and in order: the partition holds exactly the acknowledged records, once each.
    assert client.consume_committed(proxy.bootstrap, topic) == acked
    # The stopped broker closed the proxy's connection to it; the client's retries went elsewhere.
    assert proxy.metric("txnguard_connection_closes_total", {"reason": "upstream_closed"}) >= 1
    _assert_no_leaks(cluster3, proxy)


def _leader(cluster: Cluster, topic: str) -> int:
    """The partition-0 leader the live brokers name, -1 while there is none."""
    try:
        return cluster.leader(topic, 0)
    except raw.RawProtocolError:
        return -1


def _restart_and_stop(cluster: Cluster, node_id: int, producer: clients.BackgroundProducer) -> None:
    """Teardown: whatever happened, the shared cluster gets its node back and the producer stops."""
    with contextlib.suppress(clients.ClientError):
        producer.stop(timeout_s=10)
    cluster.start_node(node_id)  # no-op when it already runs
    cluster.wait_ready()


# -- sidecars: one txnguard per broker of a cluster that advertises the sidecars' ports --------------------


def test_confluent_kafka_through_sidecars(
    sidecar_cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    cluster = sidecar_cluster
    source = fresh_topic(cluster, unique_name("in"), partitions=3)
    sink = fresh_topic(cluster, unique_name("out"), partitions=3)
    group = unique_name("group")
    sidecars = _sidecars(cluster, start_proxy)
    bootstrap = cluster.sidecar_bootstrap
    client = clients.ConfluentKafkaClient()
    values = _values("record", 90)

    spread = _produce_spread(client, bootstrap, source, values, partitions=3)
    assert client.consume_committed(bootstrap, source) == [v for p in sorted(spread) for v in spread[p]]

    result = client.copy_transactionally(bootstrap, source, sink, unique_name("tid"), group, count=90,
                                         batch_size=30, abort_first=True)

    assert not result.transactions[0].committed
    assert result.committed_records == 90
    ends = clients.stable_end_offsets(bootstrap, sink)
    assert sum(ends.values()) == result.committed_records + result.aborted_records + result.markers
    assert client.consume_committed(bootstrap, sink) == [clients.copy_of(v) for p in sorted(spread)
                                                         for v in spread[p]]
    assert client.committed_offsets(bootstrap, group, source) == {0: 30, 1: 30, 2: 30}
    # Each partition leader's own sidecar carried that partition's writes.
    for p in range(3):
        sidecar = sidecars[cluster.leader(source, p)]
        assert sidecar.metric("txnguard_frames_total", {"api": "produce", "direction": "client_to_broker"}) >= 1
    _assert_no_leaks(cluster, *sidecars.values())


@pytest.mark.java
def test_java_352_copier_through_sidecars(
    sidecar_cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    cluster = sidecar_cluster
    source = fresh_topic(cluster, unique_name("in"))
    sink = fresh_topic(cluster, unique_name("out"))
    group = unique_name("group")
    sidecars = _sidecars(cluster, start_proxy)
    bootstrap = cluster.sidecar_bootstrap

    seeded = clients.java_verifiable_producer(bootstrap, source, 1000, java_version="3.5.2")
    assert seeded.errors == []
    assert sorted(seeded.acked_values, key=int) == [str(i) for i in range(1000)]

    result = clients.java_transactional_copier(
        bootstrap, source, sink, unique_name("tid"), group, max_messages=1000, java_version="3.5.2",
        transaction_size=100,
    )

    assert result.shutdown_complete
    assert (result.total_processed, result.remaining) == (1000, 0)
    reader = clients.ConfluentKafkaClient()
    _assert_copied_exactly_once(reader, bootstrap, sink, [v.encode() for v in seeded.acked_values])
    assert reader.committed_offsets(bootstrap, group, source) == {0: 1000}
    _assert_no_leaks(cluster, *sidecars.values())

"""ZooKeeper-mode Kafka 3.0.2 with three brokers: the matrix's cells on the clusters most users of pre-3.6 brokers run.

One cluster for the whole file (the session's kafka_pool: ZooKeeper and three brokers in the sidecar layout),
so every cell below costs one cluster start. Its brokers advertise the sidecars' ports on their client
listener and their own addresses on the listener they replicate over (BROKER), so both modes meet the same
brokers:

    gateway cells:  client ──▶ gateway ──▶ the BROKER listeners (Metadata there names the brokers themselves)
    sidecar cells:  client ──▶ sidecar N (the port broker N advertises) ──▶ broker N's client listener
    every check of what the brokers hold ("direct"): the BROKER listeners, no proxy in between

Every client family meets 3.0.2 in ZooKeeper mode once, spread so that each mode carries several
(G = gateway, S = one sidecar per broker):

| cell | client | mode |
| --- | --- | --- |
| copy with the offsets in the transaction, the first transaction aborted and redone | kafka-python | G |
| the same | confluent-kafka, aiokafka | S |
| produce to three partitions, metadata, read_committed consume | kcat | G |
| paced transactions, one Produce per record | Sarama | S |
| VerifiableProducer + TransactionalMessageCopier | Java 3.5.2 | S |
| S6: 10,000 records, two copiers, the output leader SIGKILLed at 30 % and restarted | Java 2.8.2 | G |
| S1, S2, S5 refused with the coordinator's answer (DescribeTransactions: KIP-664, from 3.0) | raw actor | S |
| `txnguard hanging` = 3.0.2's own `find-hanging` (topic and broker scopes) | Java 3.0.2 tool | direct, G |

S1, S2 and S5 direct (they hang) vs through a gateway (refused) on 2.8.2, 3.0.2 and 3.4.1 in ZooKeeper mode:
test_kafka_28.py and test_verification.py. `make test` starts this file first on its worker (tests/conftest.py
orders the files longest first, so that no long file runs alone at the end); its cluster is started once for
all the cells, and no other file uses a cluster of its kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from kio.schema.errors import ErrorCode
from test_clients_through_proxy import _produce_spread, _values
from test_exactly_once import restarts_killed_nodes, s6_java_copiers_through_a_broker_crash  # noqa: F401 - a fixture
from test_hanging import hanging_table, make_open_transaction, same

from txnguard.testing import clients
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, direct_bootstrap, gateway_for
from txnguard.testing.scenarios import TxnActor, error_name, offsets, wait_stable

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

VERSION = "3.0.2"
T = TypeVar("T")
NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]
# find-hanging's own threshold (15 minutes), given explicitly: `txnguard hanging` then decides exactly as the tool.
FIND_HANGING_FLAGS = ("--max-transaction-timeout", "15")


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get(VERSION, 3, sidecars=True, zookeeper=True)


@pytest.fixture
def sidecars(cluster: Cluster, start_proxy: StartProxy) -> dict[int, ProxyThread]:
    """Broker id -> its sidecar, listening on the port that broker advertises to clients."""
    return {n.id: start_proxy(mode="sidecar", upstream=f"{n.host}:{n.port}", listen=f"{n.host}:{n.sidecar_port}")
            for n in cluster.nodes}


def _sum(proxies: Sequence[ProxyThread], metric: str, **labels: str) -> float:
    """A counter summed over its series (every label not given) and over the proxies."""
    total = 0.0
    for proxy in proxies:
        assert proxy.proxy is not None
        total += sum(s.value for m in proxy.proxy.metrics.registry.collect() if m.name == metric.removesuffix("_total")
                     for s in m.samples if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()))
    return total


def _verified_and_clean(cluster: Cluster, proxies: Sequence[ProxyThread]) -> float:
    """Every write the proxies verified passed (no false rejection), and no broker address reached a client."""
    assert _sum(proxies, "txnguard_verification_failures_total") == 0
    passed = _sum(proxies, "txnguard_verifications_total", outcome="pass", decision="forwarded")
    assert passed > 0, "no write was verified: did the traffic go through the proxies?"
    for proxy in proxies:
        assert proxy.wire is not None
        assert proxy.wire.leaks(broker_addresses(cluster)) == []
    return passed


# -- the Python families: a copy with the offsets in the transaction -------------------------------------


@pytest.mark.parametrize(("client_name", "mode"), [
    pytest.param("kafka-python", "gateway", id="kafka-python-gateway"),
    pytest.param("confluent-kafka", "sidecars", id="confluent-kafka-sidecars"),
    pytest.param("aiokafka", "sidecars", id="aiokafka-sidecars"),
])
def test_a_python_family_copies_exactly_once_with_its_offsets(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, client_name: str, mode: str,
) -> None:
    direct = direct_bootstrap(cluster)
    source = fresh_topic(cluster, unique_name("in"), partitions=3)
    sink = fresh_topic(cluster, unique_name("out"), partitions=3)
    group = unique_name("group")
    if mode == "gateway":
        proxies = [gateway_for(cluster, start_proxy)]
        bootstrap = proxies[0].bootstrap
    else:
        proxies = [start_proxy(mode="sidecar", upstream=f"{n.host}:{n.port}", listen=f"{n.host}:{n.sidecar_port}")
                   for n in cluster.nodes]
        bootstrap = cluster.sidecar_bootstrap
    client = clients.PYTHON_CLIENTS[client_name]
    spread = _produce_spread(client, bootstrap, source, _values("record", 90), partitions=3)

    result = client.copy_transactionally(bootstrap, source, sink, unique_name("tid"), group, count=90,
                                         batch_size=30, abort_first=True)

    # The first transaction aborted after its records were acked and its offsets sent, the others committed.
    assert [t.committed for t in result.transactions] == [False] + [True] * (len(result.transactions) - 1)
    assert (result.committed_records, result.aborted_records > 0) == (90, True)
    # The brokers, asked directly: the aborted copies and every marker are in the log ...
    ends = clients.stable_end_offsets(direct, sink)
    assert sum(ends.values()) == result.committed_records + result.aborted_records + result.markers
    # ... and read_committed sees every input copied once, in order, in its own partition.
    assert client.consume_committed(bootstrap, sink) == [clients.copy_of(v) for p in sorted(spread) for v in spread[p]]
    assert client.committed_offsets(bootstrap, group, source) == {0: 30, 1: 30, 2: 30}
    passed = _verified_and_clean(cluster, proxies)
    print(f"\n{client_name} through {'a gateway' if mode == 'gateway' else 'sidecars'} on {VERSION} zookeeper: "
          f"{len(result.transactions)} transactions, {passed:.0f} writes verified and passed")


# -- kcat through the gateway ------------------------------------------------------------------------------


def test_kcat_produces_lists_and_consumes_through_the_gateway(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    topic = fresh_topic(cluster, unique_name("kcat"), partitions=3)
    proxy = gateway_for(cluster, start_proxy)
    assert proxy.proxy is not None
    kcat = clients.Kcat()

    spread = _produce_spread(kcat, proxy.bootstrap, topic, _values("kcat", 30), partitions=3)

    # The brokers as kcat sees them: the real ids, each at the gateway's listener standing in for it.
    md = kcat.metadata(proxy.bootstrap, topic=topic)
    assert {b["id"]: b["name"] for b in md["brokers"]} == {
        n.id: f"127.0.0.1:{proxy.proxy.listeners[n.id].address.port}" for n in cluster.nodes}
    assert clients.stable_end_offsets(direct_bootstrap(cluster), topic) == {0: 10, 1: 10, 2: 10}
    assert kcat.consume_committed(proxy.bootstrap, topic) == [v for p in sorted(spread) for v in spread[p]]
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []


# -- Sarama and the Java 3.5.2 tools through sidecars ----------------------------------------------------------


def test_sarama_paced_transactions_through_sidecars(
    cluster: Cluster, sidecars: dict[int, ProxyThread], unique_name: NameFactory,
) -> None:
    """One Produce per record: the leader's sidecar never sees AddPartitionsToTxn; each write passes on the
    coordinator's own log, which its follower read (no question to the coordinator)."""
    direct = direct_bootstrap(cluster)
    topic = fresh_topic(cluster, unique_name("sarama"), replication_factor=3)
    txn_id = unique_name("tid")

    result = clients.paced_transactions("sarama", cluster.sidecar_bootstrap, topic, txn_id, transactions=3,
                                        per_transaction=10, timeout_s=60)

    expected = [v for t in range(3) for v in clients.paced_values(txn_id, t, 10)]
    assert (result.aborted, result.errors) == (0, [])
    assert result.committed == expected
    clients.stable_end_offsets(direct, topic)
    assert clients.ConfluentKafkaClient().consume_committed(direct, topic) == expected
    leader = sidecars[cluster.leader(topic, 0)]
    assert _verified_and_clean(cluster, [leader]) == 30  # every write, each through the leader's sidecar
    assert _sum([leader], "txnguard_verifications_total", evidence="log", outcome="pass", decision="forwarded") >= 3


@pytest.mark.java
def test_java_3_5_2_copier_through_sidecars(
    cluster: Cluster, sidecars: dict[int, ProxyThread], unique_name: NameFactory,
) -> None:
    direct = direct_bootstrap(cluster)
    source = fresh_topic(cluster, unique_name("in"))
    sink = fresh_topic(cluster, unique_name("out"))
    group = unique_name("group")
    bootstrap = cluster.sidecar_bootstrap

    seeded = clients.java_verifiable_producer(bootstrap, source, 1000, java_version="3.5.2")
    assert seeded.errors == []
    assert sorted(seeded.acked_values, key=int) == [str(i) for i in range(1000)]

    result = clients.java_transactional_copier(bootstrap, source, sink, unique_name("tid"), group, max_messages=1000,
                                               java_version="3.5.2", transaction_size=100)

    assert result.shutdown_complete
    assert (result.total_processed, result.remaining) == (1000, 0)
    clients.stable_end_offsets(direct, sink)
    reader = clients.ConfluentKafkaClient()
    out = reader.consume_committed(direct, sink)
    assert sorted(out, key=int) == [v.encode() for v in sorted(seeded.acked_values, key=int)]
    assert reader.committed_offsets(direct, group, source) == {0: 1000}
    _verified_and_clean(cluster, list(sidecars.values()))


# -- S1, S2, S5 through sidecars: the coordinator's log ----------------------------------------------------


def test_s1_s2_s5_are_refused_by_the_sidecars_with_the_coordinators_log(
    cluster: Cluster, sidecars: dict[int, ProxyThread], unique_name: NameFactory,
) -> None:
    """A sidecar sees neither AddPartitionsToTxn nor EndTxn of a write it is asked to forward (they go to the
    coordinator's sidecar): its follower of the coordinator's log has read both, and once it has read the log
    to its end as of the write, it refuses."""
    bootstrap, direct = cluster.sidecar_bootstrap, direct_bootstrap(cluster)
    # Partition 1 carries only the S5 actor's transaction, so partition 0's offsets do not depend on when its
    # abort marker lands (the coordinator writes markers after it has answered EndTxn).
    topic = fresh_topic(cluster, unique_name("s"), partitions=2, replication_factor=3)

    def timed(call: Callable[[], T]) -> tuple[T, float]:
        started = time.monotonic()
        return call(), (time.monotonic() - started) * 1000

    never = TxnActor(bootstrap, unique_name("txn"))
    never.init()
    s1, s1_ms = timed(lambda: never.produce(topic, 0, [b"never-added"]))

    late = TxnActor(bootstrap, unique_name("txn"))
    late.init()
    assert late.add_partitions(topic, 0) == {0: 0}
    assert late.produce(topic, 0, [b"in-txn"]).error_code == ErrorCode.none
    assert late.end(commit=False) == ErrorCode.none
    wait_stable(direct, topic)
    s2, s2_ms = timed(lambda: late.produce(topic, 0, [b"late"], sequence=1))

    offsets_actor = TxnActor(bootstrap, unique_name("txn"))
    offsets_actor.init()
    assert offsets_actor.add_partitions(topic, 1) == {1: 0}
    s5, s5_ms = timed(lambda: offsets_actor.commit_offsets(unique_name("group"), {topic: {0: 1}}))
    assert offsets_actor.end(commit=False) == ErrorCode.none

    assert [error_name(r.error_code) for r in (s1, s2)] == ["INVALID_TXN_STATE"] * 2
    assert [error_name(c) for c in s5] == ["INVALID_TXN_STATE"]
    wait_stable(direct, topic)
    assert offsets(direct, topic, 0) == (2, 2)  # S2's aborted record and its marker: S1 and S5 wrote nothing
    proxies = list(sidecars.values())
    assert _sum(proxies, "txnguard_verification_failures_total") == 3
    assert _sum(proxies, "txnguard_verifications_total", evidence="log", decision="rejected") == 3
    # Whether a write waits a moment (a hold: the transaction in PrepareAbort in the log, or the log not read to
    # its end yet) depends on the machine's load; the refusals above came from the log either way.
    print(f"\nthrough sidecars on {VERSION} zookeeper: S1 INVALID_TXN_STATE after {s1_ms:.0f} ms, "
          f"S2 INVALID_TXN_STATE after {s2_ms:.0f} ms, S5 INVALID_TXN_STATE after {s5_ms:.0f} ms; nothing written")


# -- txnguard hanging == kafka-transactions.sh find-hanging of 3.0.2 -----------------------------------------


@pytest.mark.java
def test_txnguard_hanging_finds_what_kafka_3_0_2_find_hanging_finds(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    """test_hanging.py's equality on ZooKeeper 3.0.2 with its own TransactionsCommand: two hanging transactions
    (a backdated transactional batch on a partition never added), and one as old whose coordinator lists its
    partition (a candidate for both tools, hanging for neither), on three partitions led where Kafka put them."""
    direct = direct_bootstrap(cluster)
    topic = fresh_topic(cluster, unique_name("hang"), partitions=3, replication_factor=3)
    hung = {p: make_open_transaction(direct, topic, unique_name("tid"), partition=p) for p in (0, 2)}
    listed = make_open_transaction(direct, topic, unique_name("tid"), partition=1, added=True)

    theirs = clients.transactions_find_hanging(direct, topic=topic, java_version=VERSION)
    ours = hanging_table("--bootstrap", direct, "--topic", topic, *FIND_HANGING_FLAGS)

    assert {(r.partition, r.producer_id, r.start_offset) for r in theirs} == {
        (p, m.producer_id, m.start_offset) for p, m in hung.items()}
    assert listed.producer_id not in {r.producer_id for r in theirs}
    assert same(ours) == same(theirs)
    # A broker's scope (--broker-id): every replica on it, followers included; rows of this topic compared.
    follower = next(n.id for n in cluster.nodes if n.id != cluster.leader(topic, 0))
    theirs_on_broker = [r for r in clients.transactions_find_hanging(direct, broker_id=follower, java_version=VERSION)
                        if r.topic == topic]
    ours_on_broker = [r for r in hanging_table("--bootstrap", direct, "--broker-id", str(follower),
                                               *FIND_HANGING_FLAGS) if r.topic == topic]
    assert theirs_on_broker and same(ours_on_broker) == same(theirs_on_broker)
    # Through a gateway: the same answer.
    proxy = gateway_for(cluster, start_proxy)
    assert same(hanging_table("--bootstrap", proxy.bootstrap, "--topic", topic, *FIND_HANGING_FLAGS)) == same(theirs)
    print(f"\nfind-hanging {VERSION} (zookeeper, 3 brokers) --topic: {sorted(theirs, key=lambda r: r.partition)}"
          f"\ntxnguard hanging {' '.join(FIND_HANGING_FLAGS)} --topic: {sorted(ours, key=lambda r: r.partition)}"
          f"\n--broker-id {follower}: find-hanging {len(theirs_on_broker)} rows, txnguard {len(ours_on_broker)} rows")


# -- S6: the Java 2.8.2 copier through a gateway, a broker SIGKILLed ---------------------------------------


@pytest.mark.java
@pytest.mark.usefixtures("restarts_killed_nodes")  # test_exactly_once's, imported above
def test_s6_java_2_8_2_copier_exactly_once_through_a_broker_sigkill(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory,
) -> None:
    """test_exactly_once.py's S6 cell on ZooKeeper 3.0.2: the killed broker's ZooKeeper session expires before
    the controller moves its leaderships, and the restarted broker waits for that too (harness). Last in the
    file: the restarted broker leads nothing until Kafka rebalances leaders, which the cells above don't wait for."""
    s6_java_copiers_through_a_broker_crash(cluster, start_proxy, unique_name, "2.8.2")

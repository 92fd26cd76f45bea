"""The support table's KRaft cells that no other file covers: the core guarantee, per broker version and mode.

KIP-890 part 1 for an old client (the raw actor: Produce v9, AddPartitionsToTxn, EndTxn, the way clients
before Kafka 4.0 speak), one node in KRaft mode per cell:

| cell | brokers | mode |
| --- | --- | --- |
| kafka-3.3.2-kraft-gateway | 3.3.2 KRaft (the first production KRaft release), 1n | G |
| kafka-3.4.1-kraft-sidecar | 3.4.1 KRaft, 1n | S |
| kafka-3.9.2-kraft-sidecar | 3.9.2 KRaft (native verification on, the default), 1n | S |
| kafka-4.4.0-kraft-sidecar | 4.4.0 KRaft (native verification on, the default), 1n | S |

    client ──InitProducerId, Produce(p0, never added)──▶ proxy ──▶ broker
        refused: INVALID_TXN_STATE "Partition was not added to the transaction", nothing written
        (direct on 3.3.2 and 3.4.1, the control: written, and the partition's last stable offset stops)
    client ──AddPartitionsToTxn(p0, p1), Produce p0, p1, EndTxn(commit)──▶ proxy ──▶ broker
        committed: each partition holds its record and the commit marker, stable

G = a gateway in front of the broker; S = a sidecar on the port the broker advertises to clients, in front of
its client listener. On 3.9.2 and 4.4.0 the broker would refuse the write too; the proxy refuses it first
(its own metric counts it). Other versions and modes: test_verification.py (3.5.2, 3.9.2, ZooKeeper 3.0.2 and 3.4.1),
test_sidecar_verification.py, test_zookeeper_matrix.py and test_kafka_28.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, direct_bootstrap, gateway_for
from txnguard.testing.scenarios import TxnActor, error_name, offsets, wait_stable

pytestmark = pytest.mark.integration

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]

CELLS = [
    pytest.param(("3.3.2", "gateway"), id="kafka-3.3.2-kraft-gateway"),
    pytest.param(("3.4.1", "sidecar"), id="kafka-3.4.1-kraft-sidecar"),
    pytest.param(("3.9.2", "sidecar"), id="kafka-3.9.2-kraft-sidecar"),
    pytest.param(("4.4.0", "sidecar"), id="kafka-4.4.0-kraft-sidecar"),
]


def _verifies_natively(version: str) -> bool:
    """Kafka 3.6 and later verify transactional writes themselves (transaction.partition.verification.enable)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (3, 6)


# Module-scoped: every test on one broker before the next (one cluster start per cell).
@pytest.fixture(scope="module", params=CELLS)
def cell(request: pytest.FixtureRequest, kafka_pool: ClusterPool) -> tuple[Cluster, str]:
    version, mode = request.param
    cluster = kafka_pool.get(version, 1, sidecars=mode == "sidecar")
    assert not cluster.zookeeper
    return cluster, mode


@pytest.fixture
def proxied(cell: tuple[Cluster, str], start_proxy: StartProxy) -> Iterator[tuple[Cluster, ProxyThread, str]]:
    """(the cluster, the proxy, where a client bootstraps) for the cell's mode."""
    cluster, mode = cell
    if mode == "gateway":
        proxy = gateway_for(cluster, start_proxy)
        yield cluster, proxy, proxy.bootstrap
    else:
        node = cluster.nodes[0]
        proxy = start_proxy(mode="sidecar", upstream=f"{node.host}:{node.port}",
                            listen=f"{node.host}:{node.sidecar_port}")
        yield cluster, proxy, cluster.sidecar_bootstrap
    assert proxy.wire is not None
    assert proxy.wire.leaks(broker_addresses(cluster)) == []


def _total(proxy: ProxyThread, sample: str, **labels: str) -> float:
    """A counter summed over every label set that matches `labels`."""
    assert proxy.proxy is not None
    return float(sum(s.value for family in proxy.proxy.metrics.registry.collect() for s in family.samples
                     if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())))


def _label(cluster: Cluster, mode: str) -> str:
    return f"{cluster.version} kraft {mode}"


def test_a_write_to_a_partition_never_added_is_refused(
    cell: tuple[Cluster, str], proxied: tuple[Cluster, ProxyThread, str], unique_name: NameFactory,
) -> None:
    cluster, proxy, bootstrap = proxied
    direct = direct_bootstrap(cluster)
    control = "direct not run (the broker verifies itself)"
    if not _verifies_natively(cluster.version):
        # The control: direct, the broker writes the batch and the partition's last stable offset stops.
        hanging = fresh_topic(cluster, unique_name("s1d"))
        actor = TxnActor(direct, unique_name("txn"))
        actor.init()
        assert actor.produce(hanging, 0, [b"never-added"]).error_code == ErrorCode.none
        assert offsets(direct, hanging, 0) == (1, 0), "direct: the unadded write should leave the LSO stuck"
        control = "direct: appended, hangs (HW 1, LSO 0)"

    topic = fresh_topic(cluster, unique_name("s1"))
    actor = TxnActor(bootstrap, unique_name("txn"))
    actor.init()
    r = actor.produce(topic, 0, [b"never-added"])
    assert (error_name(r.error_code), r.error_message) == ("INVALID_TXN_STATE",
                                                            "Partition was not added to the transaction")
    assert offsets(direct, topic, 0) == (0, 0)
    assert _total(proxy, "txnguard_verification_failures_total", reason="not_in_transaction") == 1
    print(f"\nS1 {_label(*cell)}: {control}; the proxy refused INVALID_TXN_STATE, nothing written")


def test_a_valid_transaction_commits_through_the_proxy(
    cell: tuple[Cluster, str], proxied: tuple[Cluster, ProxyThread, str], unique_name: NameFactory,
) -> None:
    cluster, proxy, bootstrap = proxied
    direct = direct_bootstrap(cluster)
    topic = fresh_topic(cluster, unique_name("ok"), partitions=2)
    actor = TxnActor(bootstrap, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0, 1) == {0: 0, 1: 0}
    assert actor.produce(topic, 0, [b"a"]).error_code == ErrorCode.none
    assert actor.produce(topic, 1, [b"b"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    # Both writes were verified by the proxy and passed (none refused).
    assert _total(proxy, "txnguard_verifications_total", outcome="pass", decision="forwarded") == 2
    assert _total(proxy, "txnguard_verification_failures_total") == 0
    # EndTxn answers before the commit markers land: wait for them, then each partition holds record + marker.
    for partition in (0, 1):
        wait_stable(direct, topic, partition)
        assert offsets(direct, topic, partition) == (2, 2)
    print(f"\nvalid transaction {_label(*cell)}: committed through the proxy, 2 writes verified")

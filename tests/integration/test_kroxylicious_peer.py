"""The benchmark's peer proxy still starts and carries a transaction, so its arm cannot rot silently.

bench/proxy_overhead.py and bench/short_transactions.py measure txnguard beside Kroxylicious 0.12.0
(pass-through, no filters), started by txnguard.testing.kroxylicious exactly as here: the launcher in
testing/java/ over the kroxylicious-runtime jars from the cache, a YAML of one virtual cluster with a
`portIdentifiesNode` gateway, a JVM of its own.

    client -> Kroxylicious bootstrap -> broker (Metadata: the leader is Kroxylicious's node port)
    client -> Kroxylicious node port -> broker (InitProducerId .. Produce .. EndTxn, then Fetch)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kroxylicious import KroxyliciousProcess

pytestmark = pytest.mark.integration


def test_kroxylicious_carries_a_committed_transaction(
    kafka_pool: ClusterPool, unique_name: Callable[[str], str], tmp_path: Path,
) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    topic = fresh_topic(cluster, unique_name("peer"))
    (node,) = cluster.nodes
    with KroxyliciousProcess(cluster.bootstrap_servers, [node.id], tmp_path) as peer:
        # Its Metadata names its own node port for the broker, so whatever a client sends after
        # the bootstrap goes through it, not around it.
        assert raw.leader_of(peer.bootstrap, topic, 0) == (node.id, peer.host, peer.node_port(node.id))

        client = clients.ConfluentKafkaClient()
        values = [f"through-the-peer-{i}".encode() for i in range(5)]
        client.run_transaction(peer.bootstrap, topic, unique_name("txn"), values, commit=True, partition=0)

        assert client.consume_committed(peer.bootstrap, topic, [0]) == values
        assert peer.proc is not None and peer.proc.poll() is None, peer.log_tail()
    # On the broker: the 5 records, then the commit marker's offset.
    with raw.RawClient(node.host, node.port) as direct:
        assert direct.list_offsets(topic, 0, read_committed=True) == len(values) + 1

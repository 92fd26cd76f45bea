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
proxy has absorbed at least one refusal (bounded), so a pass means the condition happened
and the client still never saw the error. The control turns absorption off and shows the
tap does see the error the client receives: the test can fail.

Cells: Java 3.5.2 (the client that suffers most), confluent-kafka, kafka-python; control with Java.
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
        assert absorbed(proxy, "absorbed") > 0, f"no CONCURRENT_TRANSACTIONS in {loops * LOOP} transactions"
        assert tap.count == 0
    assert absorbed(proxy, "budget_spent") == 0


@pytest.mark.java
def test_control_with_absorption_off_the_client_receives_concurrent_transactions(
        one_node_sidecar: Cluster, start_proxy, unique_name) -> None:  # type: ignore[no-untyped-def]
    node = one_node_sidecar.nodes[0]
    topic = unique_name("short")
    raw.create_topic(one_node_sidecar.live_bootstrap(), topic, 1, -1, None)
    proxy = start_proxy(mode="sidecar", upstream=f"{node.host}:{node.port}",
                        health={"concurrent_transactions_budget_ms": 0})
    host, port = proxy.bootstrap.split(":")
    with ConcurrentTap((host, int(port)), node.sidecar_port) as tap:
        loops = 0
        while tap.count == 0 and loops < MAX_LOOPS:
            run_loop("java-3.5.2", f"{node.host}:{node.sidecar_port}", topic, unique_name("txn"), LOOP)
            loops += 1
        assert tap.count > 0
    assert absorbed(proxy, "absorbed") == 0

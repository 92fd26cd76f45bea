"""The proxy itself fails (issue 10, deliverable 3): SIGKILL of the gateway, or of one sidecar, in the middle
of exactly-once copies.

    Java 3.5.2 TransactionalMessageCopier ──▶ gateway (a process) ──▶ Kafka 3.5.2, 3 nodes
                                       SIGKILL ─▶ gateway gone: connections reset, its registry (every
                                                  transaction's local evidence) gone with it
                                       restart on the same ports ─▶ the copier reconnects, its open
                                                  transaction is verified with the coordinator
    afterwards: every input record once in the output at read_committed, in order; find-hanging empty;
                the new proxy refused nothing (no false rejection) and let nothing through unverified; it read the
                coordinator's log, __transaction_state, again from its start and is at its end (its /metrics)

    sidecar layout: copier ──▶ sidecar 1, 2, 3 ──▶ their brokers; SIGKILL the sidecar in front of the
                    copier's transaction coordinator (not the output's leader: that sidecar lives on and
                    must reach the coordinator through the killed one), restart it on the same port

The restarted proxy's audit records (every sidecar's, from the kill on) say how each write was judged.
bench/proxy_bounce.py runs every copier in both modes, three times each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnguard.testing import clients
from txnguard.testing.bounce import follower_figures, free_port, gateway, kill, listener_ports, run_bounce
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyProcess

pytestmark = [pytest.mark.integration, pytest.mark.java]


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 3)


@pytest.fixture(scope="module")
def sidecar_cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 3, sidecars=True)


def test_the_gateway_killed_and_restarted_mid_copy_loses_nothing_doubles_nothing_hangs_nothing(
    cluster: Cluster, tmp_path: Path,
) -> None:
    # The Java 3.5.2 copier here, 3,000 records killed at 1,000; bench/proxy_bounce.py runs 6,000 with Java 2.8.2
    # and confluent-kafka too, several times.
    result = run_bounce(cluster, "java-3.5.2", tmp_path, records=3000, kill_at=1000)
    print(f"\n{result}")
    assert result.copied_exactly_once and result.hanging == 0, result
    # No false rejection: every write the restarted proxy judged passed. (The Java copier aborts the
    # transaction the reset cut and starts the next one with AddPartitionsToTxn through the new proxy,
    # so its evidence is local again; the case below continues a transaction across the restart.)
    assert result.decisions_after > 0 and result.refused_after == 0, result
    # The restarted gateway read the coordinator's log again, from its start, and is at its end.
    assert result.log_records_after > 0 and result.log_lag_after == 0, result
    assert result.passed, result


def test_a_transaction_open_across_the_restart_is_verified_with_the_coordinator_and_commits(
    cluster: Cluster, tmp_path: Path, unique_name,
) -> None:
    """    client ─Init, AddPartitions, Produce "before"─▶ gateway 1 ✓ (local evidence)
                            SIGKILL gateway 1; gateway 2 on the same ports (empty registry)
           client ─Produce "after" (same transaction)─▶ gateway 2: the coordinator's log, read again ✓ Ongoing
           client ─EndTxn(commit)─▶ exactly both records"""
    from txnguard.testing.scenarios import TxnActor

    topic = fresh_topic(cluster, unique_name("open"), replication_factor=3)
    port, admin, brokers = free_port(), free_port(), listener_ports(cluster)
    audit = tmp_path / "after.jsonl"
    first = gateway(cluster, port, admin, tmp_path / "before.jsonl", tmp_path / "before.log", brokers)
    second: ProxyProcess | None = None
    try:
        actor = TxnActor(f"127.0.0.1:{port}", unique_name("tid"))
        actor.init()
        assert actor.add_partitions(topic, 0) == {0: 0}
        assert actor.produce(topic, 0, [b"before"]).error_code == 0
        kill(first)
        second = gateway(cluster, port, admin, audit, tmp_path / "after.log", brokers)
        assert actor.produce(topic, 0, [b"after"]).error_code == 0
        assert actor.end(commit=True) == 0
        read, lag = follower_figures(admin)
    finally:
        for p in (first, second):
            if p is not None and p.proc is not None and p.proc.poll() is None:
                p.terminate()
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"before", b"after"]
    [decision] = [r for r in map(json.loads, audit.read_text().splitlines()) if r.get("kind") == "decision"]
    # gateway 2 read the coordinator's log again before it was ready (its /readyz waits for that): the log, where
    # the transaction is Ongoing with the partition, passed the write; and it follows the log to its end.
    assert (decision["outcome"], decision["evidence"]) == ("pass", "log"), decision
    assert read > 0 and lag == 0, (read, lag)


@pytest.mark.parametrize("copier", ["java-2.8.2", "confluent-kafka"])
def test_the_coordinators_sidecar_killed_and_restarted_mid_copy_loses_nothing_doubles_nothing_hangs_nothing(
    sidecar_cluster: Cluster, tmp_path: Path, copier: str,
) -> None:
    """    copier ─AddPartitions/EndTxn─▶ sidecar C ✗ SIGKILL (its local evidence gone) … restarted on its port
           copier ─Produce──────────────▶ sidecar L ─DescribeTransactions─▶ (through sidecar C) the coordinator
    One cell per client family, small (2,000 records, killed at 500); the bench runs 6,000, three times."""
    result = run_bounce(sidecar_cluster, copier, tmp_path, mode="sidecar", records=2000, kill_at=500, timeout_s=120)
    print(f"\n{result.row()}")
    assert (result.lost, result.duplicated, result.hanging) == (0, 0, 0), result
    assert result.copied_exactly_once, result
    # Every refusal from the kill on says why and is retriable or rests on Kafka's own answer.
    assert result.decisions_after > 0 and result.unjustified == 0, result
    # The restarted sidecar read the coordinator's log again (through the other sidecars too) and is at its end.
    assert result.log_records_after > 0 and result.log_lag_after == 0, result
    assert result.passed, result

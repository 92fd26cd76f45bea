"""TV2 clients (KIP-890 part 2) through the proxy on Kafka 4.4.0: passed through, or made to fall back.

The Java 4.4.0 client (TransactionalMessageCopier of kafka-tools 4.4.0: consume a partition,
produce + send offsets in transactions of 200) copies a few thousand records through a
gateway, once with the default (TV2 passes through untouched: Produce v12+ and TxnOffsetCommit
v5+ on the wire, no AddPartitionsToTxn, nothing verified by the proxy; the broker adds the
partitions itself) and once with `hide_transaction_version_2` (ApiVersions shows
`transaction.version` 1: the client falls back to Produce <= v11, AddPartitionsToTxn and
TxnOffsetCommit <= v4, and the proxy verifies every transactional write). Both times the
read_committed output holds every input record exactly once and the group's offset is at the end.
What the client sent is read from the proxy's audit connection records and traffic counters.

Negative control: capping the versions alone (`api_max_versions`, the feature still at 2) breaks the
client: it stays on TV2 (no AddPartitionsToTxn) while its Produce v11 is judged as TV1, so the proxy
refuses the write (not_in_transaction) and the copier fails. The feature is what the client reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import clients
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, gateway_for

pytestmark = pytest.mark.integration

RECORDS = 2000


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("4.4.0", 1)


def _total(proxy: ProxyThread, sample: str, **labels: str) -> float:
    """A counter summed over every label set that matches `labels`."""
    assert proxy.proxy is not None
    return sum(s.value for family in proxy.proxy.metrics.registry.collect() for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def _by_labels(proxy: ProxyThread, sample: str) -> dict[str, float]:
    """For the printed figures: a counter's non-zero samples, keyed by their labels."""
    assert proxy.proxy is not None
    return {",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for family in proxy.proxy.metrics.registry.collect() for s in family.samples
            if s.name == sample and s.value}


def _client_connections(audit: Path, wanted: Callable[[dict[str, Any]], bool], timeout_s: float = 15.0,
                        ) -> list[dict[str, Any]]:
    """The audit's connection records that match (written when each connection closes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = audit.read_text().splitlines() if audit.exists() else []
        found = [r for r in map(json.loads, lines) if r.get("kind") == "connection" and wanted(r)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _copy(cluster: Cluster, proxy: ProxyThread, audit: Path, name: Callable[[str], str],
          ) -> tuple[list[dict[str, Any]], float]:
    source, sink = fresh_topic(cluster, name("src")), fresh_topic(cluster, name("sink"))
    group = name("group")
    values = [f"tv2-{i}".encode() for i in range(RECORDS)]
    clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, values)   # seeded directly

    started = time.monotonic()
    result = clients.java_transactional_copier(
        proxy.bootstrap, source, sink, name("tid"), group, max_messages=RECORDS, java_version="4.4.0",
        transaction_size=200, timeout_s=240)
    took = time.monotonic() - started
    assert result.shutdown_complete
    assert (result.total_processed, result.remaining) == (RECORDS, 0)

    # 0 loss, 0 duplicates at read_committed (read through the proxy), and the offsets went with them.
    reader = clients.ConfluentKafkaClient()
    out = reader.consume_committed(proxy.bootstrap, sink)
    assert len(out) == len(set(out)) == RECORDS, f"{len(out)} records, {len(set(out))} distinct"
    assert set(out) == set(values)
    assert reader.committed_offsets(proxy.bootstrap, group, source) == {0: RECORDS}
    # The copier's transactional producer: the connections that sent a transactional Produce.
    producers = _client_connections(audit, lambda r: r["used_transactions"] and r["produce_versions"])
    assert producers, "no transactional producer connection in the audit"
    return producers, took


def test_tv2_java_client_passes_through_untouched(
    cluster: Cluster, start_proxy: Callable[..., ProxyThread], unique_name: Callable[[str], str], tmp_path: Path,
) -> None:
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit))

    producers, took = _copy(cluster, proxy, audit, unique_name)

    produce_versions = {v for r in producers for v in r["produce_versions"]}
    commit_versions = {v for r in producers for v in r["txn_offset_commit_versions"]}
    print(f"passthrough: {RECORDS} records copied in {took:.1f}s; Produce {sorted(produce_versions)}, "
          f"TxnOffsetCommit {sorted(commit_versions)}; "
          f"rewrites {_by_labels(proxy, 'txnguard_response_rewrites_total')}")
    assert min(produce_versions) >= 12                      # TV2 on the wire
    assert commit_versions and min(commit_versions) >= 5
    assert _total(proxy, "txnguard_frames_total", api="add_partitions_to_txn", direction="client_to_broker") == 0
    # The proxy verified nothing: the broker adds (and so verifies) TV2 partitions itself.
    assert _total(proxy, "txnguard_verifications_total") == 0
    assert _total(proxy, "txnguard_response_rewrites_total", kind="hide_transaction_version_2") == 0


def test_hide_transaction_version_2_makes_the_java_client_fall_back_and_the_proxy_verifies(
    cluster: Cluster, start_proxy: Callable[..., ProxyThread], unique_name: Callable[[str], str], tmp_path: Path,
) -> None:
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit), hide_transaction_version_2=True)

    producers, took = _copy(cluster, proxy, audit, unique_name)

    produce_versions = {v for r in producers for v in r["produce_versions"]}
    commit_versions = {v for r in producers for v in r["txn_offset_commit_versions"]}
    verified = _total(proxy, "txnguard_verifications_total")
    adds = _total(proxy, "txnguard_frames_total", api="add_partitions_to_txn", direction="client_to_broker")
    print(f"hidden: {RECORDS} records copied in {took:.1f}s; Produce {sorted(produce_versions)}, "
          f"TxnOffsetCommit {sorted(commit_versions)}, AddPartitionsToTxn requests {adds:.0f}, "
          f"verifications {verified:.0f}, hide rewrites "
          f"{_total(proxy, 'txnguard_response_rewrites_total', kind='hide_transaction_version_2'):.0f}; "
          f"verifications {_by_labels(proxy, 'txnguard_verifications_total')}; "
          f"rewrites {_by_labels(proxy, 'txnguard_response_rewrites_total')}")
    assert max(produce_versions) <= 11                      # TV1 on the wire
    assert commit_versions and max(commit_versions) <= 4
    assert adds >= 1
    assert _total(proxy, "txnguard_response_rewrites_total", api="api_versions",
                  kind="hide_transaction_version_2") >= 1
    # Every transactional write was verified by the proxy, and none was refused.
    assert verified >= RECORDS // 200
    assert _total(proxy, "txnguard_verification_failures_total") == 0


def test_negative_control_capping_versions_without_hiding_the_feature_breaks_a_tv2_client(
    cluster: Cluster, start_proxy: Callable[..., ProxyThread], unique_name: Callable[[str], str], tmp_path: Path,
) -> None:
    # api_max_versions alone: the client still reads transaction.version 2, adds no partition, and its
    # Produce (now v11) is judged as TV1: the proxy finds the partition not in the transaction.
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit), api_max_versions={
        ApiKey.PRODUCE: 11, ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4})
    source, sink = fresh_topic(cluster, unique_name("src")), fresh_topic(cluster, unique_name("sink"))
    clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, [b"x"] * 200)

    with pytest.raises(clients.ClientError) as failed:
        clients.java_transactional_copier(
            proxy.bootstrap, source, sink, unique_name("tid"), unique_name("group"), max_messages=200,
            java_version="4.4.0", transaction_size=200, timeout_s=60)
    print(f"capped only: {str(failed.value).splitlines()[0]}; "
          f"AddPartitionsToTxn {_total(proxy, 'txnguard_frames_total', api='add_partitions_to_txn'):.0f}; "
          f"failures {_by_labels(proxy, 'txnguard_verification_failures_total')}")
    assert _total(proxy, "txnguard_frames_total", api="add_partitions_to_txn", direction="client_to_broker") == 0
    assert _total(proxy, "txnguard_verification_failures_total") >= 1
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, sink) == []

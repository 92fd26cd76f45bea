"""Clients that bypass the proxy, on a real Kafka 3.5.2: the gateway's gauge counts them and the fleet report lists
them, from what the coordinator's own log says and what came through the gateway.

    proxied client ─InitProducerId, AddPartitionsToTxn, Produce, EndTxn─▶ gateway ─▶ broker
    direct client  ─InitProducerId, AddPartitionsToTxn, Produce, EndTxn──────────────▶ broker
    gateway's follower ─Fetch __transaction_state─▶ both ids, CompleteCommit
    /metrics ─▶ txnguard_transaction_log_unseen_transactional_ids: the direct one (and the harness's probe, which
                reached the broker directly before the test began), never the proxied one
    audit file ─every round─▶ transaction_log_id: direct (seen_by_proxy false), proxied (true)
    the report's ingest + unproxied_transactional_ids ─▶ [direct, the probe]
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kio.schema.errors import ErrorCode
from prometheus_client.parser import text_string_to_metric_families

from txnguard.pipeline import arrow_tables, unproxied
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.proxy import ProxyThread, gateway_for
from txnguard.testing.scenarios import TxnActor

pytestmark = pytest.mark.integration

UNSEEN = "txnguard_transaction_log_unseen_transactional_ids"


def scraped(proxy: ProxyThread, name: str) -> float:
    """The gauge as Prometheus reads it: /metrics, served on the proxy's event loop."""
    with urllib.request.urlopen(f"{proxy.admin_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def one_transaction(actor: TxnActor, topic: str) -> None:
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"x"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none


def in_the_log(proxy: ProxyThread, txn_id: str) -> Any:
    assert proxy.proxy is not None and proxy.proxy.guard.follower is not None
    logged = proxy.proxy.guard.follower.view.describe(txn_id)
    return logged is not None and logged.state == "CompleteCommit"


def log_records(audit: Path) -> list[dict[str, Any]]:
    lines = audit.read_text().splitlines() if audit.exists() else []
    return [r for r in map(json.loads, lines) if r.get("kind") == "transaction_log_id"]


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def test_the_gateway_counts_and_the_report_lists_the_client_that_bypasses_it(
        kafka_pool: ClusterPool, start_proxy: Any, unique_name: Any, tmp_path: Path) -> None:
    # A cluster of its own (its key differs from the shared 3.5.2's): its log holds this test's ids only.
    cluster = kafka_pool.get("3.5.2", 1, {"transaction.state.log.num.partitions": "3"})
    topic = fresh_topic(cluster, unique_name("t"))
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit={"path": str(audit), "transaction_log_ids_interval_s": 1})
    proxy.wait_for(lambda: proxy.metric("txnguard_ready") == 1, 30, "ready")  # the follower has read the log once
    guard = proxy.proxy.guard if proxy.proxy is not None else None
    assert guard is not None and guard.follower is not None
    # What the log held before: the harness's own probe (it checks the cluster takes transactions, straight to the
    # broker): a client that bypassed the gateway too, and counted as one.
    before = {txn_id for txn_id, _ in guard.follower.view.items()}
    assert all(txn_id.startswith("txnguard-harness") for txn_id in before)

    proxied = TxnActor(proxy.bootstrap, unique_name("proxied"))          # client ─▶ gateway ─▶ broker
    one_transaction(proxied, topic)
    direct = TxnActor(cluster.bootstrap_servers, unique_name("direct"))  # client ─▶ broker
    one_transaction(direct, topic)
    for actor in (proxied, direct):
        proxy.wait_for(lambda a=actor: in_the_log(proxy, a.transactional_id), 30, f"{actor.transactional_id} logged")
    bypassing = before | {direct.transactional_id}

    # The gauge: the direct client, and nothing the gateway saw (counted again at most every 10 s).
    wait_until(lambda: scraped(proxy, UNSEEN) == len(bypassing), 30, f"{len(bypassing)} unseen ids on /metrics")

    # A round of records after both are complete in the log: the direct id unseen, the proxied one seen. Each id's
    # latest record, so that a round written while the direct transaction was still PrepareCommit (it lists every
    # id too) does not count: the report reads each id's latest state.
    def listed_with_the_direct_one_complete() -> bool:
        latest = {r["transactional_id"]: r for r in log_records(audit)}  # one read of the file per try
        return ({txn_id: r["seen_by_proxy"] for txn_id, r in latest.items()}
                == {**dict.fromkeys(bypassing, False), proxied.transactional_id: True}
                and latest[direct.transactional_id]["coordinator_state"] == "CompleteCommit")
    wait_until(listed_with_the_direct_one_complete, 30, "a round listing every id, the direct one complete")

    # The report's ingest of the audit file, then the table: the direct client, and not the proxied one.
    proxy.stop()
    lines = audit.read_text().splitlines()
    batch = pa.RecordBatch.from_arrays([pa.array(lines, pa.string()), pa.array(["audit"] * len(lines), pa.string())],
                                       names=["value", "source"])
    next(arrow_tables.write_raw(str(tmp_path / "tables"), [batch]))
    table = unproxied.from_tables(str(tmp_path / "tables"))
    assert set(table["transactional_id"].to_pylist()) == bypassing
    assert table["transactional_id"].to_pylist()[0] == direct.transactional_id  # the most recently active first
    assert table["coordinator_state"].to_pylist()[0] == "CompleteCommit"
    print(f"\n{len(lines)} audit records; unseen on /metrics: {len(bypassing)}; unproxied_transactional_ids: "
          f"{table['transactional_id'].to_pylist()}")

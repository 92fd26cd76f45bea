"""The guard's knobs, end to end: monitor mode, per-family errors, the audit record."""

from __future__ import annotations

import json

import pytest

from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import gateway_for
from txnguard.testing.scenarios import TxnActor, error_name, offsets

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kafka_pool):
    return kafka_pool.get("3.5.2", 1)


def test_monitor_mode_decides_counts_and_audits_but_forwards(cluster, start_proxy, unique_name, tmp_path):
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, policy={"mode": "monitor"}, audit_path=str(audit))
    topic = fresh_topic(cluster, unique_name("mon"))
    actor = TxnActor(proxy.bootstrap, unique_name("txn"))
    actor.init()
    assert actor.produce(topic, 0, [b"x"]).error_code == 0
    assert offsets(cluster.bootstrap_servers, topic, 0)[0] == 1  # written: monitor does not protect
    # Decided by the coordinator's own log (its follower read the InitProducerId: no partition added).
    assert proxy.metric("txnguard_verifications_total", {"evidence": "log", "outcome": "not_in_transaction",
                                                         "decision": "forwarded_unenforced"}) == 1
    record = [r for r in map(json.loads, audit.read_text().splitlines()) if r["kind"] == "decision"][-1]
    assert (record["decision"], record["error_sent"], record["mode"]) == ("forwarded_unenforced", None, "monitor")


def test_a_client_with_kafka_pythons_client_id_gets_transaction_abortable_not_invalid_txn_state(
        cluster, start_proxy, unique_name):
    # A raw actor that names itself as kafka-python does (its default client id, kafka-python-producer-N):
    # what is tested is the per-family error rule the proxy picks from that name. kafka-python itself
    # cannot be made to send this write: it adds every partition before writing to it.
    proxy = gateway_for(cluster, start_proxy)
    topic = fresh_topic(cluster, unique_name("kp"))
    actor = TxnActor(proxy.bootstrap, unique_name("txn"), client_id="kafka-python-producer-1")
    actor.init()
    r = actor.produce(topic, 0, [b"x"])
    assert error_name(r.error_code) == "TRANSACTION_ABORTABLE"
    assert proxy.metric("txnguard_error_rewrites_total", {"api": "produce", "from_error": "not_in_transaction",
                                                          "to_error": "TRANSACTION_ABORTABLE",
                                                          "client_family": "kafka-python"}) == 1


def test_every_decision_leaves_one_audit_record(cluster, start_proxy, unique_name, tmp_path):
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit))
    topic = fresh_topic(cluster, unique_name("aud"), partitions=2)
    txn_id = unique_name("txn")
    actor = TxnActor(proxy.bootstrap, txn_id)
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"ok"]).error_code == 0
    assert error_name(actor.produce(topic, 1, [b"not-added"]).error_code) == "INVALID_TXN_STATE"
    records = [r for r in map(json.loads, audit.read_text().splitlines()) if r["kind"] == "decision"]
    assert [(r["target"], r["outcome"], r["decision"], r["evidence"], r["error_name"]) for r in records] == [
        (f"{topic}-0", "pass", "forwarded", "local", None),
        (f"{topic}-1", "not_in_transaction", "rejected", "log", "INVALID_TXN_STATE"),  # the coordinator's log
    ]
    r = records[1]
    assert r["schema_version"] == 2 and r["transactional_id"] == txn_id
    assert (r["producer_id"], r["producer_epoch"]) == (actor.producer.producer_id, actor.producer.producer_epoch)
    assert r["api"] == "produce" and r["api_version"] == 9 and r["client_id"] == "txnguard-scenario"
    assert r["latency_ms"] >= 0 and r["mode"] == "enforce"
    # The local decision was taken without waiting: its CPU time is known; the log's (read to its end first) was not.
    assert records[0]["cpu_ms"] is not None and records[0]["cpu_ms"] >= 0 and r["cpu_ms"] is None

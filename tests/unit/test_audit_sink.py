"""The audit publisher: its producer settings, its name for the proxy, and its bound, without a broker.

    AuditLog.write ──produce()──▶ librdkafka queue (queue_max_records) ──▶ audit topic
                        └─ queue full: BufferError ──▶ dropped{outcome}, one log line, never a wait
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from txnguard.proxy import logs
from txnguard.proxy.audit_sink import AuditPublisher, producer_config, proxy_id
from txnguard.proxy.config import ConfigError, load


def _config(**settings):
    return load(None, {"upstream": "10.1.1.1:9092,10.1.1.2:9092", **settings}, environ={})


def test_producer_is_idempotent_bounded_batched_and_goes_straight_to_the_brokers():
    conf = producer_config(_config(audit={"topic": "t", "queue_max_records": 1000, "linger_ms": 50,
                                          "producer": {"security.protocol": "SASL_SSL"}}))
    assert conf["bootstrap.servers"] == "10.1.1.1:9092,10.1.1.2:9092"  # default: the upstream, not a listener
    assert (conf["enable.idempotence"], conf["acks"], conf["linger.ms"], conf["queue.buffering.max.messages"]) == \
        (True, "all", 50, 1000)
    assert conf["security.protocol"] == "SASL_SSL"
    with pytest.raises(ConfigError, match="this proxy's own listener"):
        producer_config(_config(listen="127.0.0.1:9192", audit={"topic": "t", "bootstrap": "127.0.0.1:9192"}))


def test_proxy_id_defaults_to_mode_advertised_host_and_bound_port():
    assert proxy_id(_config(listen="0.0.0.0:0", advertised_host="gw.example"), 40123) == "gateway@gw.example:40123"
    assert proxy_id(_config(audit={"proxy_id": "edge-7"}), 1) == "edge-7"


class _Metrics:
    """The publisher's two metrics on a registry of their own (ProxyMetrics defines the same two)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.audit_records = Counter("txnguard_audit_records", "", ["outcome"], registry=self.registry)
        self.audit_queue_depth = Gauge("txnguard_audit_queue_depth", "", registry=self.registry)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_full_queue_drops_counts_and_logs_once_without_waiting(capsys):
    logs.configure("info")  # bind the loggers to this test's captured stderr
    metrics = _Metrics()
    cfg = _config(audit={"topic": "t", "bootstrap": f"127.0.0.1:{_closed_port()}", "queue_max_records": 5,
                         "flush_timeout_s": 0.2})
    publisher = AuditPublisher(cfg, metrics)
    publisher.start()
    for i in range(20):  # nobody listens: five wait in librdkafka's queue, the rest are refused at once
        publisher.publish(f"txn-{i}", b"{}")

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels)

    assert sample("txnguard_audit_records_total", outcome="dropped") == 15
    asyncio.run(publisher.close(0.2))
    # The five queued were never delivered: counted when the bounded flush gave up.
    assert sample("txnguard_audit_records_total", outcome="dropped") == 20
    assert sample("txnguard_audit_records_total", outcome="published") == 0
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    drops = [x for x in lines if x["event"] == "audit_records_dropped"]
    assert [(d["reason"], d["records"]) for d in drops] == [("queue_full", 1), ("unsent_at_stop", 5)]
    publisher.publish("late", b"{}")  # after stop: dropped and counted, not an error
    assert sample("txnguard_audit_records_total", outcome="dropped") == 21

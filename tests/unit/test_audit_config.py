"""The `audit:` settings: a file, a topic, where the topic's cluster is, and the publisher's bound."""

from __future__ import annotations

import pytest

from txnguard.proxy.config import ConfigError, HostPort, load


def _config(**settings):
    return load(None, {"upstream": "10.1.1.1:9092,10.1.1.2:9092", **settings}, environ={})


def test_top_level_audit_path_is_an_alias_of_audit_path():
    assert _config(audit_path="/tmp/a.jsonl").audit.path == "/tmp/a.jsonl"
    cfg = _config(audit={"path": "/tmp/b.jsonl"})
    assert (cfg.audit.path, cfg.audit_path) == ("/tmp/b.jsonl", "/tmp/b.jsonl")
    with pytest.raises(ConfigError, match=r"audit_path: '/tmp/a' differs from audit\.path '/tmp/b'"):
        _config(audit_path="/tmp/a", audit={"path": "/tmp/b"})


def test_audit_section_parses_and_refuses_what_it_cannot_use():
    cfg = load(None, {"upstream": "10.1.1.1:9092", "audit": {"topic": "txnguard-audit", "bootstrap": "k1:9092,k2:9092",
                                                             "queue_max_records": 500}},
               environ={"TXNGUARD_AUDIT__LINGER_MS": "20", "TXNGUARD_AUDIT__PROXY_ID": "gw-a"})
    a = cfg.audit
    assert (a.topic, a.bootstrap, a.queue_max_records, a.linger_ms, a.proxy_id) == \
        ("txnguard-audit", (HostPort("k1", 9092), HostPort("k2", 9092)), 500, 20, "gw-a")
    with pytest.raises(ConfigError, match=r"audit.queue_max_records: 0 is not a positive integer"):
        _config(audit={"topic": "t", "queue_max_records": 0})
    with pytest.raises(ConfigError, match=r"audit.topics: unknown setting"):
        _config(audit={"topics": "t"})
    with pytest.raises(ConfigError, match=r"audit.bootstrap: 'nowhere' is not host:port"):
        _config(audit={"topic": "t", "bootstrap": "nowhere"})
    with pytest.raises(ConfigError, match=r"audit.topic: '' is not a non-empty string"):
        _config(audit={"topic": ""})

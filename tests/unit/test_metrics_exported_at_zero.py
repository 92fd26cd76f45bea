"""Counters whose labels are a fixed set exist at 0 from the start.

A series born at 1 (at its first event) is invisible to rate() and increase(): a dashboard or alert
would miss the first rejection of each reason. These are read through prometheus_client's own
exposition, as Prometheus scrapes them.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txnguard.policies.outcomes import Outcome
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.access import known_rights, missing_acl


def scraped(metrics: ProxyMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_every_verification_failure_reason_is_scraped_at_zero_before_any_rejection():
    failures = scraped(ProxyMetrics(), "txnguard_verification_failures_total")
    assert failures == {(("reason", o.value),): 0.0 for o in Outcome if o is not Outcome.PASS}


def test_every_right_the_proxy_can_lack_is_scraped_at_zero_and_names_what_a_refusal_names():
    refused = scraped(ProxyMetrics(), "txnguard_verification_authorization_failures_total")
    assert set(refused.values()) == {0.0} and len(refused) == len(known_rights()) == 8
    # The series a real refusal increments is one of them (not a new series born at 1).
    missing = missing_acl("describe_transactions", 53, "txn-1")  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert missing is not None
    key = (("api", missing.api), ("operation", missing.operation), ("resource_type", missing.resource_type))
    assert key in refused


def test_readiness_is_a_gauge_at_zero_until_a_proxy_binds_it():
    assert scraped(ProxyMetrics(), "txnguard_ready") == {(): 0.0}

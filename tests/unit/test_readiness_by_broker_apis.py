"""Which APIs each mode's evidence needs, and what follows for /readyz (verification/capabilities.readiness).

    enforcing sidecar, its broker 2.8 (no DescribeTransactions) ─▶ not ready: every first write would be refused
    monitoring sidecar, the same broker                          ─▶ ready, the body says what it cannot verify
    gateway (enforcing or not), the same broker                  ─▶ ready: it verifies what it forwarded
    any proxy whose own brokers' ApiVersions are all unread      ─▶ not ready until one is read
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from txnguard.codecs.api_keys import ApiKey
from txnguard.policies.enforcement import Enforcement, EnforcementRules, ModeRule
from txnguard.proxy.capability_report import BrokerCapabilities
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.capabilities import LACKS_API, UNREAD, BrokerApis, lacking, readiness

KAFKA_2_8 = {ApiKey.PRODUCE: (0, 9), ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3), ApiKey.DESCRIBE_PRODUCERS: (0, 0)}
KAFKA_3_0 = {**KAFKA_2_8, ApiKey.DESCRIBE_TRANSACTIONS: (0, 0), ApiKey.LIST_TRANSACTIONS: (0, 0)}
OLD, NEW = lacking(KAFKA_2_8), lacking(KAFKA_3_0)


def test_an_enforcing_sidecar_whose_broker_lacks_describe_transactions_is_not_ready_and_names_both() -> None:
    r = readiness([BrokerApis("b1:9092", OLD, own=True)], sidecar=True, enforcing=True)
    assert not r.ready
    (why,) = r.blocked
    assert (why.reason, why.broker, why.api) == (LACKS_API, "b1:9092", "DescribeTransactions")
    assert why.text.startswith("broker b1:9092 lacks DescribeTransactions (Kafka before 3.0): ")
    assert "every transaction's first write is refused; nor can it confirm a coordinator's" in why.text
    # What else it lacks is said too, without making it less ready.
    assert [n.split(" (")[0] for n in r.notes] == ["broker b1:9092 lacks ListTransactions"]


def test_a_monitoring_sidecar_on_the_same_broker_stays_ready_and_says_the_same() -> None:
    r = readiness([BrokerApis("b1:9092", OLD, own=True)], sidecar=True, enforcing=False)
    assert r.ready
    (note,) = r.notes
    assert note.startswith("broker b1:9092 lacks DescribeTransactions") and "ListTransactions" in note
    assert "every transaction's first write is forwarded and recorded as not added (monitor); nor " in note


@pytest.mark.parametrize("enforcing", [True, False], ids=["enforce", "monitor"])
def test_a_gateway_on_2_8_stays_ready_and_says_which_writes_it_cannot_verify(enforcing: bool) -> None:
    r = readiness([BrokerApis("b1:9092", OLD, own=True), BrokerApis("b2:9092", OLD, own=False)],
                  sidecar=False, enforcing=enforcing)
    assert r.ready
    assert len(r.notes) == 2 and all("a write whose AddPartitionsToTxn it did not forward" in n for n in r.notes)
    assert all(("another gateway replica) cannot be verified: " + ("refused;" if enforcing else
                                                                   "forwarded and recorded as not added (monitor);"))
               in n for n in r.notes)


def test_a_sidecar_is_judged_by_its_own_broker_not_by_another_coordinator() -> None:
    """A rolling upgrade from 2.8: an upgraded broker's sidecar is ready while an old one remains (it says
    which transactions it cannot verify); otherwise every upgraded sidecar would wait for the last broker."""
    r = readiness([BrokerApis("b1:9092", NEW, own=True), BrokerApis("sc2:19092", OLD, own=False)],
                  sidecar=True, enforcing=True)
    assert r.ready
    (note,) = r.notes
    assert note.startswith("broker sc2:19092 lacks DescribeTransactions") and "this broker coordinates" in note


def test_nothing_lacked_nothing_said() -> None:
    assert readiness([BrokerApis("b1:9092", NEW, own=True)], sidecar=True, enforcing=True) == \
        readiness([], sidecar=False, enforcing=True)


@pytest.mark.parametrize(("sidecar", "enforcing"), [(True, True), (True, False), (False, True), (False, False)])
def test_no_own_broker_read_yet_is_not_ready_in_every_mode(sidecar: bool, enforcing: bool) -> None:
    r = readiness([BrokerApis("b1:9092", None, own=True, error="connection refused")], sidecar=sidecar,
                  enforcing=enforcing)
    (why,) = r.blocked
    assert (why.reason, why.broker) == (UNREAD, "b1:9092")
    assert why.text == ("broker b1:9092's ApiVersions not read yet (connection refused): what it lacks is unknown; "
                        "retrying")


def test_a_gateway_with_one_bootstrap_broker_read_is_ready_and_names_the_unread_one() -> None:
    r = readiness([BrokerApis("b1:9092", NEW, own=True), BrokerApis("b2:9092", None, own=True, error="timeout")],
                  sidecar=False, enforcing=True)
    assert r.ready and r.notes == ("broker b2:9092's ApiVersions not read yet (timeout)",)


@pytest.mark.parametrize(("enforcement", "may"), [
    (EnforcementRules(), True),
    (EnforcementRules(Enforcement.MONITOR), False),
    (EnforcementRules(Enforcement.MONITOR, (ModeRule(Enforcement.ENFORCE, transactional_id="payments-*"),)), True),
    (EnforcementRules(Enforcement.OFF, (ModeRule(Enforcement.MONITOR, topic="orders"),)), False),
])
def test_a_policy_may_enforce_when_its_default_or_any_rule_enforces(enforcement: EnforcementRules, may: bool) -> None:
    assert enforcement.may_enforce is may


def test_the_shell_says_not_ready_when_it_learns_it_and_ready_again_when_the_policy_turns_to_monitor(
        log_lines: Callable[[], list[dict[str, Any]]]) -> None:
    enforcing = [True]
    caps = BrokerCapabilities(ProxyMetrics())
    caps.watch(["b1:9092"], sidecar=True, enforcing=lambda: enforcing[0])
    assert [n.reason for n in caps.readiness().blocked] == [UNREAD]   # not read yet: nothing said yet
    caps.unread("b1:9092", "connection refused")
    caps.unread("b1:9092", "connection refused")                   # retried: said once
    caps.learned("b1:9092", KAFKA_2_8)
    caps.learned("b1:9092", KAFKA_2_8)                             # a new connection reads the same
    enforcing[0] = False                                           # SIGHUP: policy mode monitor
    caps.reconsider()
    said = [(line["event"], line.get("not_ready") or line.get("was")) for line in log_lines()
            if line["event"] in ("broker_api_versions_unread", "proxy_not_ready", "proxy_ready_again")]
    assert said == [("broker_api_versions_unread", None), ("proxy_not_ready", UNREAD),
                    ("proxy_not_ready", LACKS_API), ("proxy_ready_again", [LACKS_API])]
    assert caps.readiness().ready

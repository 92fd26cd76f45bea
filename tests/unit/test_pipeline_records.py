"""The pipeline's plain-Python parts: which fields a record needs, what each rejection prevented, the options."""

from __future__ import annotations

import argparse
import json

import pytest

from txnguard.pipeline import incidents, options, records
from txnguard.pipeline.synthetic import Generator
from txnguard.policies.outcomes import Outcome
from txnguard.verification.audit import ClientInfo, audit_record, hanging_record
from txnguard.verification.hanging import Finding
from txnguard.verification.verdicts import Evidence, Verdict


def test_a_real_v1_audit_record_has_every_required_decision_field():
    record = audit_record(
        time_ms=1, transactional_id="t", producer_id=2, producer_epoch=0, api="produce", api_version=9,
        target="orders-0", verdict=Verdict(Outcome.LATE_WRITE, Evidence.LOCAL, "after EndTxn"),
        decision="rejected", error_sent=48, error_name="INVALID_TXN_STATE", latency_ms=0.1,
        client=ClientInfo(None, None, None, "java", "bootstrap", 3), mode="enforce")
    present = {k for k, v in record.items() if v is not None}
    assert set(records.required(1, "decision")) <= present
    # Every field the proxy writes is one the pipeline declares (no silent drop of a column).
    declared = {name for name, _ in records.union_fields()}
    assert set(record) - declared == set()


def test_v2_adds_kind_and_proxy_id_to_decisions_and_connections_have_their_own_fields():
    assert set(records.required(2, "decision")) - set(records.required(1, "decision")) == {"kind", "proxy_id"}
    connection = set(records.required(2, "connection"))
    assert {"connected_ms", "client_address", "used_transactions", "produce_versions", "close_reason"} <= connection
    assert "first_transactional_id" not in connection  # nullable: a connection that never used transactions


def test_a_real_hanging_record_is_a_supported_kind_with_every_required_field_declared():
    finding = Finding(topic="orders", partition=3, producer_id=7, producer_epoch=1, coordinator_epoch=-1,
                      start_offset=42, last_timestamp_ms=1_000, reason="no_transaction")
    record = hanging_record(time_ms=901_000, proxy_id="sidecar@b-0", finding=finding,
                            max_transaction_timeout_ms=900_000)
    assert record["kind"] in records.KINDS
    present = {k for k, v in record.items() if v is not None}
    assert set(records.required(2, "hanging")) <= present
    assert "transactional_id" not in records.required(2, "hanging")  # None: ListTransactions named no id
    declared = {name for name, _ in records.union_fields()}
    assert set(record) - declared == set()


@pytest.mark.parametrize("outcome", [o for o in Outcome if o.failed])
def test_every_failing_outcome_has_an_incident_class(outcome):
    for api in ("produce", "txn_offset_commit"):
        assert incidents.classify(outcome.value, api) is not incidents.UNCLASSIFIED


def test_the_same_outcome_means_a_different_incident_for_produce_and_offsets():
    assert incidents.classify("not_in_transaction", "produce").name == "hanging_transaction"
    assert incidents.classify("not_in_transaction", "txn_offset_commit").name == "hanging_offset_commit"
    assert incidents.classify("late_write", "produce").name == "late_write"
    assert incidents.classify("producer_fenced", "txn_offset_commit").name == "zombie_write"
    assert incidents.classify("something_new", "produce") is incidents.UNCLASSIFIED


def test_synthetic_records_are_reproducible_and_complete():
    a, b = list(Generator(seed=3).lines(500)), list(Generator(seed=3).lines(500))
    assert a == b
    parsed = [json.loads(line) for line in a]
    kinds = {(r["schema_version"], r.get("kind", "decision")) for r in parsed}
    assert kinds == {(1, "decision"), (2, "decision"), (2, "connection")}
    for r in parsed:
        required = records.required(r["schema_version"], r.get("kind", "decision"))
        assert all(r.get(name) is not None for name in required), r


def test_report_arguments_parse_times_as_utc():
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    args = p.parse_args(["--source", "jsonl:/x", "--out", "/o", "--since", "2026-01-01T00:00:00",
                         "--until", "2026-01-01T01:00:00+01:00"])
    assert args.since == 1_767_225_600_000
    assert args.until == args.since  # 01:00 at +01:00 is midnight UTC
    assert args.master == "local[*]" and not args.follow

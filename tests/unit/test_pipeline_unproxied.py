"""The fleet report's table of clients that bypass txnguard, without Spark: the proxies' records go through the
ingest's own parse and Parquet writer (`arrow_tables.write_raw`), the table is made from what it wrote.

    gateway gw-1's follower ─round─▶ transaction_log_id: direct (unseen), proxied (seen), via-sidecar (unseen),
                                                        via-write (unseen), via-connection (unseen)
    sidecar sc-2's follower ─round─▶ transaction_log_id: direct (unseen, a later state), via-sidecar (seen)
    gw-1  ─decision─▶ via-write went through it      gw-1 ─connection─▶ via-connection's first transactional id
    report ─▶ unproxied_transactional_ids = {direct}: its latest state, listed by both proxies
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from txnguard.pipeline import arrow_tables, records, report, unproxied
from txnguard.policies.outcomes import Outcome
from txnguard.verification.audit import (
    ClientInfo,
    audit_record,
    connection_record,
    transaction_log_id_record,
)
from txnguard.verification.bypass import LogId
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.verdicts import Evidence, Verdict

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
CLIENT = ClientInfo("app", "apache-kafka-java", "2.8.2", "java", "bootstrap", 1)


def logged(proxy: str, at: int, txn_id: str, state: str, updated: int, *, seen: bool = False,
           omitted: int = 0) -> dict:
    return transaction_log_id_record(time_ms=at, proxy_id=proxy, log_id=LogId(txn_id, state, updated, 9, 1, seen),
                                     active_ids=5, omitted_ids=omitted)


def decision(txn_id: str, at: int) -> dict:
    return audit_record(time_ms=at, transactional_id=txn_id, producer_id=3, producer_epoch=0, api="produce",
                        api_version=9, target="orders-0", verdict=Verdict(Outcome.PASS, Evidence.LOCAL, "added"),
                        decision="forwarded", error_sent=None, error_name=None, latency_ms=0.01, client=CLIENT,
                        mode="enforce", proxy_id="gw-1")


def connection(txn_id: str, at: int) -> dict:
    inventory = ConnectionInventory("10.0.0.7:51000", at - MIN)
    inventory.first_transactional_id, inventory.used_transactions = txn_id, True
    return connection_record(time_ms=at, proxy_id="gw-1", client=CLIENT, inventory=inventory,
                             close_reason="client_closed")


FLEET = [
    logged("gw-1", T0 + 10 * MIN, "direct", "Ongoing", T0 + 9 * MIN),
    logged("gw-1", T0 + 10 * MIN, "proxied", "CompleteCommit", T0 + 8 * MIN, seen=True),
    logged("gw-1", T0 + 10 * MIN, "via-sidecar", "Empty", T0 + 7 * MIN),
    logged("gw-1", T0 + 10 * MIN, "via-write", "CompleteAbort", T0 + 6 * MIN),
    logged("gw-1", T0 + 10 * MIN, "via-connection", "CompleteCommit", T0 + 5 * MIN),
    logged("sc-2", T0 + 20 * MIN, "direct", "CompleteCommit", T0 + 19 * MIN, omitted=3),
    logged("sc-2", T0 + 20 * MIN, "via-sidecar", "Empty", T0 + 7 * MIN, seen=True),
    decision("via-write", T0 + 6 * MIN),
    connection("via-connection", T0 + 30 * MIN),
]


def ingest(lines: list[dict], staging: Path) -> None:
    """The batch job's ingest of these records, as one task: parse, route, write each raw table's Parquet."""
    text = pa.array([json.dumps(r) for r in lines], pa.string())
    batch = pa.RecordBatch.from_arrays([text, pa.array(["f"] * len(lines), pa.string())], names=["value", "source"])
    manifest = next(arrow_tables.write_raw(str(staging), [batch]))
    assert "quarantine" not in manifest["table"].to_pylist()  # every record is a supported kind


def test_the_log_records_are_a_supported_kind_and_every_field_is_declared():
    record = FLEET[0]
    assert record["kind"] in records.KINDS
    assert set(records.required(2, record["kind"])) <= {k for k, v in record.items() if v is not None}
    assert set(record) - {name for name, _ in records.union_fields()} == set()


def test_only_the_id_no_proxy_saw_is_listed_with_its_latest_state_and_every_proxy_that_listed_it(tmp_path):
    ingest(FLEET, tmp_path)
    table = unproxied.from_tables(str(tmp_path))
    assert table.schema == unproxied.SCHEMA
    [row] = table.to_pylist()
    assert row["transactional_id"] == "direct"
    assert row["coordinator_state"] == "CompleteCommit"  # sc-2's later round: the log's latest state
    assert row["last_update_ms"] == T0 + 19 * MIN
    assert int(row["last_activity"].timestamp() * 1000) == T0 + 19 * MIN
    assert row["reported_by"] == ["gw-1", "sc-2"]
    assert int(row["last_reported"].timestamp() * 1000) == T0 + 20 * MIN
    assert row["omitted_ids"] == 3  # the round that gave its latest state left 3 ids out past its cap


def test_a_window_keeps_the_records_of_its_period_only(tmp_path):
    ingest(FLEET, tmp_path)
    # Before sc-2's round: gw-1's alone, in which via-sidecar is unseen too (sc-2 saw it later).
    early = unproxied.from_tables(str(tmp_path), until_ms=T0 + 15 * MIN)
    assert early["transactional_id"].to_pylist() == ["direct", "via-sidecar", "via-connection"]
    assert early["coordinator_state"].to_pylist()[0] == "Ongoing"
    # The connection that named via-connection closed at T0+30min: outside this window, so not seen in it.


def test_no_round_of_log_records_gives_an_empty_table(tmp_path):
    ingest([decision("via-write", T0)], tmp_path)
    assert unproxied.from_tables(str(tmp_path)).num_rows == 0
    assert unproxied.from_tables(str(tmp_path / "nothing-here")).num_rows == 0


def test_the_report_lists_the_ids_that_bypass_txnguard(tmp_path):
    ingest(FLEET, tmp_path)
    table = unproxied.from_tables(str(tmp_path))
    rows = [(r["transactional_id"], r["coordinator_state"], r["last_activity"], r["producer_id"], r["reported_by"])
            for r in table.to_pylist()]
    data = report.ReportData(title="t", totals={"decisions": 1}, rejections_by_hour=[], latency_by_evidence=[],
                             inventory=[], top_transactional_ids=[], incidents=[], quarantine=[], unproxied=rows,
                             unproxied_total=table.num_rows)
    page = report.write(data, tmp_path / "out").read_text()
    assert "Clients that bypass txnguard" in page and "<td>direct</td>" in page and "via-sidecar" not in page
    empty = report.render_html(report.ReportData(title="t", totals={}, rejections_by_hour=[], latency_by_evidence=[],
                                                 inventory=[], top_transactional_ids=[], incidents=[], quarantine=[],
                                                 plots=data.plots))
    assert "No transactional id active in the cluster's log went around the proxies" in empty

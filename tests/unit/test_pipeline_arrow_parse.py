"""The Arrow parse alone (no Spark): a batch of lines in, one routed row per line out, bad lines quarantined
with the reason the old `from_json` route gave them, wherever they sit in the batch."""

from __future__ import annotations

import json

import pyarrow as pa

from txnguard.pipeline import arrow_parse, records
from txnguard.pipeline.synthetic import Generator

GOOD = [json.dumps(r) for r in Generator(seed=3).records(40)]
BAD = {
    '{"schema_version": 1, "time_ms": 1767225600000, "transactional_id": "tru': "malformed_json",
    "this is not json": "malformed_json",
    "[1, 2]": "malformed_json",
    '{"schema_version": "2", "kind": "decision"}': "malformed_json",  # a field of the wrong type
    "": "empty",
    "   ": "empty",
    '{"schema_version": 99, "kind": "decision", "time_ms": 1767225600000}': "unsupported_schema_version:99",
    '{"schema_version": 2, "kind": "audit", "proxy_id": "p"}': "unknown_kind:audit",
    '{"schema_version": 2, "kind": "x' + "k" * 100 + '", "proxy_id": "p"}': "unknown_kind:x" + "k" * 63,
    '{"time_ms": 1}': "missing_fields:schema_version",
    '{"schema_version": 2, "proxy_id": "p"}': "missing_fields:kind",
    '{"schema_version": 1, "pad": "' + "x" * (records.MAX_RECORD_CHARS + 1) + '"}': "too_large",
}


def _route(lines: list[str | None]) -> list[dict]:
    batch = arrow_parse.route_batch(pa.array(lines, pa.string()), pa.array(["f"] * len(lines), pa.string()))
    assert batch.schema == arrow_parse.ROUTED_SCHEMA
    return batch.to_pylist()


def test_a_batch_of_good_records_is_routed_by_kind_with_every_field_typed():
    rows = _route(GOOD)
    want = [json.loads(line) for line in GOOD]
    assert [r["route"] for r in rows] == [w.get("kind", "decision") for w in want]
    assert all(r["quarantine_reason"] is None and r["value"] is None for r in rows)  # text kept only if quarantined
    for row, record in zip(rows, want, strict=True):
        assert {k: row[k] for k in record} == record


def test_each_bad_line_in_the_middle_of_good_ones_gets_its_reason_and_the_good_ones_stay_parsed():
    lines: list[str | None] = []
    for i, bad in enumerate(BAD):
        lines += [*GOOD[i * 3:i * 3 + 3], bad]
    lines.append(None)  # a Kafka tombstone
    rows = _route(lines)
    assert len(rows) == len(lines)
    got = {line: r["quarantine_reason"] for line, r in zip(lines, rows, strict=True) if r["route"] == "quarantine"}
    assert got == {**BAD, None: "empty"}
    assert all(r["value"] == line for line, r in zip(lines, rows, strict=True) if line in BAD)
    assert sum(r["route"] != "quarantine" for r in rows) == 3 * len(BAD)
    line, huge = next((line, r) for line, r in zip(lines, rows, strict=True) if BAD.get(line) == "too_large")
    assert huge["chars"] == len(line) > records.MAX_RECORD_CHARS and huge["schema_version"] is None  # not parsed


def test_a_connection_missing_required_fields_names_them_in_the_declared_order():
    line = '{"schema_version": 2, "kind": "connection", "proxy_id": "p", "time_ms": 1}'
    (row,) = _route([line])
    assert row["quarantine_reason"] == "missing_fields:" + ",".join(
        n for n in records.required(2, "connection") if n not in ("schema_version", "kind", "proxy_id", "time_ms"))


def test_a_line_that_is_not_utf8_is_quarantined_as_malformed_and_kept_readable():
    # Spark's text source hands over any bytes; the JSON reader would copy a bad string field as it is.
    raw = [b'{"schema_version": 2, "kind": "connection", "client_id": "\xff"}', b"\xfe\xff not json", GOOD[0].encode()]
    value = pa.array(raw, pa.binary()).view(pa.string())
    rows = arrow_parse.route_batch(value, pa.array(["f"] * 3, pa.string())).to_pylist()
    assert [(r["route"], r["quarantine_reason"]) for r in rows[:2]] == [("quarantine", "malformed_json")] * 2
    assert rows[2]["route"] == json.loads(GOOD[0]).get("kind", "decision") and rows[2]["quarantine_reason"] is None
    assert rows[1]["value"] == "\ufffd\ufffd not json" and rows[1]["chars"] == 11  # its length as it came


def test_decisions_are_read_with_a_decisions_fields_and_every_other_kind_with_all_of_them():
    """Lines are parsed as decisions first (26 of the 44 fields: cheaper); the other kinds are parsed again whole.
    A field only other kinds have is unknown to a decision (ignored whatever its value, like any unknown field); to
    a connection record it is its own, and a wrong type there is still malformed."""
    decision = json.loads(next(line for line in GOOD if json.loads(line).get("kind", "decision") == "decision"))
    connection = json.loads(next(line for line in GOOD if json.loads(line).get("kind") == "connection"))
    odd_decision = json.dumps({**decision, "used_transactions": "not a boolean"})
    odd_connection = json.dumps({**connection, "used_transactions": "not a boolean"})
    lines = [*GOOD[:5], odd_decision, json.dumps(connection), odd_connection, *GOOD[5:10]]
    rows = _route(lines)
    assert [r["route"] for r in rows] == [
        *(json.loads(line).get("kind", "decision") for line in GOOD[:5]), "decision", "connection", "quarantine",
        *(json.loads(line).get("kind", "decision") for line in GOOD[5:10])]
    assert rows[5]["used_transactions"] is None and rows[5]["transactional_id"] == decision["transactional_id"]
    assert {k: rows[6][k] for k in connection} == connection  # every field of the other kind, typed, in its place
    assert rows[7]["quarantine_reason"] == "malformed_json"


def test_a_line_that_is_a_bare_null_is_malformed_even_first_in_its_batch():
    """pyarrow's JSON reader dies (SIGSEGV) on a block that starts with a bare null and reads one after an object
    as a row of nulls; such a line never reaches a reader. Found by tests/property/test_pipeline_fast_parse.py."""
    nulls = ["null", " null", "null}", "nullx", "\ufeffnull"]
    for first in nulls:
        rows = _route([first, *GOOD[:3], "null"])
        assert [r["quarantine_reason"] for r in rows] == ["malformed_json", None, None, None, "malformed_json"]
        assert rows[0]["value"] == first and rows[0]["schema_version"] is None


def test_polars_reads_with_one_thread_in_a_fresh_worker_process():
    """A Spark task is one core's work: polars' own thread pool (one thread a core by default) would compete with
    the other tasks. The parse sets POLARS_MAX_THREADS before polars is first imported (a fresh process here,
    as a Python worker is)."""
    import os
    import subprocess
    import sys

    code = ("import pyarrow as pa; from txnguard.pipeline import arrow_parse as P; import sys; "
            "assert 'polars' not in sys.modules; "
            "P.route_batch(pa.array(sys.argv[1:], pa.string()), pa.array(['f'] * (len(sys.argv) - 1))); "
            "import polars; print(polars.thread_pool_size())")
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    out = subprocess.run([sys.executable, "-c", code, *GOOD[:3]], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "1"

"""polars reads the decision lines first (`arrow_parse._read_fast`); pyarrow's reading stays the reference.

For batches of generated audit lines, good and damaged in every way the two readers were seen to differ (a value
of another type where a string is declared, surrogate escapes, NaN, a byte-order mark, truncation, blank lines,
unknown fields, other kinds of record), the parse with polars first gives the same table, row for row, and the
same parsed/not-parsed flags as the parse by pyarrow alone. Not generated: a repeated key, the one difference
left on purpose (its own test below).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnguard.pipeline import arrow_parse
from txnguard.pipeline.synthetic import Generator

RECORDS = list(Generator(seed=11).records(300))  # decisions with a few connection records, as the proxy writes them
DECISIONS = [r for r in RECORDS if r.get("kind", "decision") == "decision"]
OTHERS = [r for r in RECORDS if r.get("kind", "decision") != "decision"]
STRING_FIELDS = ["transactional_id", "api", "target", "client_id", "client_software_version", "outcome", "mode"]
INT_FIELDS = ["producer_id", "producer_epoch", "api_version", "time_ms"]

# A JSON value of another type, written where a string is declared.
NOT_A_STRING = st.sampled_from(["5", "-0", "1.5", "1e3", "12345678901234567890", "true", "false", '{"a": [1]}',
                                "[1, 2]", "[]", "{}", "0.1000000000000000055511151231257827", "-7E-2"])
# A real string that looks like one of them (must stay a string, whichever reader reads it).
LOOKS_LIKE_ONE = st.sampled_from(["5", "1.9", "true", "false", "{x", "[x", "-", "t", "f", "2.8.2", "1e3", "tru"])
ESCAPES = st.sampled_from(["\\ud83d\\ude00", "\\ud800", "\\uD800x", "\\udc00", "\\ud800\\u0041", "\\u00e9",
                           "\\\\ud800", "\\\"", "\\n", "\\/", "\\u0000"])


def _set_raw(line: str, field: str, raw_value: str) -> str:
    record = json.loads(line)
    record[field] = "__RAW__"
    return json.dumps(record).replace('"__RAW__"', raw_value)


@st.composite
def damaged(draw: st.DrawFn, line: str) -> str:
    how = draw(st.sampled_from(["none", "not_a_string", "looks_like_one", "escape", "int_as_other", "nan",
                                "bom", "truncated", "blank", "not_json", "unknown_field", "null_field"]))
    if how == "not_a_string":
        return _set_raw(line, draw(st.sampled_from(STRING_FIELDS)), draw(NOT_A_STRING))
    if how == "looks_like_one":
        return _set_raw(line, draw(st.sampled_from(STRING_FIELDS)), json.dumps(draw(LOOKS_LIKE_ONE)))
    if how == "escape":
        return _set_raw(line, draw(st.sampled_from(STRING_FIELDS)), '"a' + draw(ESCAPES) + 'b"')
    if how == "int_as_other":
        return _set_raw(line, draw(st.sampled_from(INT_FIELDS)),
                        draw(st.sampled_from(['"1"', "1.5", "1.0", "true", "99999999999999999999", "null"])))
    if how == "nan":
        return _set_raw(line, "latency_ms", draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "3"])))
    if how == "bom":
        return "\ufeff" + line
    if how == "truncated":
        return line[:draw(st.integers(1, len(line) - 1))]
    if how == "blank":
        return draw(st.sampled_from(["", "   ", "\t"]))
    if how == "not_json":
        return draw(st.sampled_from(["not json", "[1, 2]", "5", "null", '{"a":1}{"b":2}', '{"a":1,}']))
    if how == "unknown_field":
        return _set_raw(line, "x_new_field", draw(st.sampled_from(['{"n": [1, {"m": null}]}', '"s"', "1", "[]"])))
    if how == "null_field":
        return _set_raw(line, draw(st.sampled_from(STRING_FIELDS + INT_FIELDS)), "null")
    return line


@st.composite
def batches(draw: st.DrawFn) -> list[str]:
    size = draw(st.integers(1, 12))
    lines = []
    for _ in range(size):
        record: dict[str, Any] = draw(st.sampled_from(DECISIONS if draw(st.integers(0, 5)) else OTHERS))
        line = json.dumps(record)
        lines.append(draw(damaged(line)) if draw(st.booleans()) else line)
    return lines


def _parse(lines: list[str], fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[bool]]:
    """The rows as JSON text (NaN is NaN there; in a list of floats NaN != NaN) and the parsed flags."""
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(arrow_parse, "_read_fast", lambda text, terminated: None)
        text = pa.array([line + "\n" for line in lines], pa.string())
        table, parsed = arrow_parse.parse_lines(text, np.ones(len(lines), dtype=bool), terminated=True)
    return json.dumps(table.to_pylist()), parsed.tolist()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=batches())
def test_polars_first_reads_every_batch_as_pyarrow_alone_does(lines: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse(lines, True, monkeypatch) == _parse(lines, False, monkeypatch)


def test_the_fast_reader_is_the_one_that_read_a_clean_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without this, the property above would also hold if polars never read anything.
    lines = [json.dumps(r) for r in RECORDS[:50]]
    text = pa.array([line + "\n" for line in lines], pa.string())
    fast = arrow_parse._read_fast(text, terminated=True)
    assert fast is not None
    table, again = fast
    assert table.num_rows == 50 and not again.any()
    assert table["transactional_id"].to_pylist() == [r.get("transactional_id") for r in RECORDS[:50]]


def test_a_string_field_holding_another_json_type_is_read_again_by_pyarrow_and_quarantined() -> None:
    good = json.dumps(DECISIONS[0])
    bad = _set_raw(good, "api", "5")
    text = pa.array([good + "\n", bad + "\n"], pa.string())
    fast = arrow_parse._read_fast(text, terminated=True)
    assert fast is not None and fast[0]["api"].to_pylist()[1] == "5"  # what polars made of it
    assert fast[1].tolist() == [False, True]  # ... found by its shape
    rows = arrow_parse.route_batch(text, pa.array(["f", "f"]), terminated=True).to_pylist()
    assert [r["quarantine_reason"] for r in rows] == [None, "malformed_json"]


def test_a_repeated_key_keeps_its_first_value_where_pyarrow_alone_refused_the_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The one difference left on purpose (arrow_parse's docstring): json.dumps cannot write such a line.
    line = json.dumps(DECISIONS[0]).replace('"api": "', '"api": "first", "api": "', 1)
    fast_rows, fast_parsed = _parse([line], True, monkeypatch)
    _, alone_parsed = _parse([line], False, monkeypatch)
    assert fast_parsed == [True] and json.loads(fast_rows)[0]["api"] == "first"
    assert alone_parsed == [False]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["schema_version", "kind", "api", "time_ms", "x", "produce_versions", "end_txns_in_doubt"]),
        inner, max_size=4),
    max_leaves=8)
ANY_LINE = st.one_of(JSON_VALUES.map(json.dumps), JSON_VALUES.map(lambda v: json.dumps(v)[:7]), st.text(max_size=30))


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(ANY_LINE, min_size=1, max_size=6))
def test_any_lines_are_each_routed_somewhere_and_never_crash_the_worker(lines: list[str]) -> None:
    # A crash here is a dead Python worker and the Spark job with it (a bare null did that: test_pipeline_arrow_parse).
    rows = arrow_parse.route_batch(pa.array(lines, pa.string()), pa.array(["f"] * len(lines))).to_pylist()
    assert len(rows) == len(lines)
    assert all((r["route"] == "quarantine") == (r["quarantine_reason"] is not None) for r in rows)

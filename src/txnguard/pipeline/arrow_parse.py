"""Raw lines into typed, routed records with Arrow: the parse that runs in Spark's Python workers (`mapInArrow`).

Spark's `from_json` cost 10-19 us of CPU per 570-byte record, more than the whole budget of a 200k events/s job
on two cores; `pyarrow.json.read_json` with the declared schema parses a batch of lines in vectorised C++ (~4.5 us
a record). Nothing here imports pyspark: each function takes and returns Arrow arrays, so it is tested alone and
shipped to the executors by value (`parse.route`), which then need pyarrow (what PySpark's Arrow support needs)
and not txnguard.

Every line ends up in exactly one place, with the same reasons, in the same order of precedence, as before:
* a batch is parsed whole; when the parser refuses it (a truncated line, a non-JSON line, a value of the wrong
  type...) or gives back another number of rows than lines (a blank line gives none), it is split in two and each
  half parsed again, down to single lines: a bad line costs ~2 parses of its batch, never a crash, and only it is
  marked unparsed;
* a line longer than `records.MAX_RECORD_CHARS` (or a null Kafka value) is never handed to the parser;
* the quarantine reason is worked out in plain Python, row by row, only for the rows a vectorised check did not
  find complete (`records.quarantine_reason`): a few per batch.

polars' NDJSON reader (simd-json) reads a batch as decisions first: 2.3 us a line, +0.4-0.5 to hand it to Arrow, against
pyarrow's 3.7-4.1 (one 16 MiB batch of the benchmark's records). pyarrow stays the reference: wherever the two can
disagree, pyarrow's answer is the one kept (`_read_fast`), so which lines parse and why a line is quarantined are
what they were. One difference is left on purpose: a line that repeats a declared key (the proxy's writer,
`json.dumps` of a dict, cannot write one) is a decision with the key's first value where pyarrow refused it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from txnguard.pipeline import records as R

# The routed frame's own columns, beside one column per record field (`records.union_fields`).
ROUTE, REASON, VALUE, SOURCE, CHARS = "route", "quarantine_reason", "value", "source", "chars"

_TYPES: dict[R.FieldType, pa.DataType] = {
    "long": pa.int64(), "int": pa.int32(), "string": pa.string(), "double": pa.float64(), "boolean": pa.bool_(),
    "int_array": pa.list_(pa.int32()),
    "in_doubt_array": pa.list_(pa.struct([("committed", pa.bool_()), ("connection_id", pa.int64()),
                                          ("sent_ms", pa.int64()), ("orphaned", pa.bool_())])),
}
RECORD_SCHEMA = pa.schema([pa.field(name, _TYPES[kind]) for name, kind in R.union_fields()])
ROUTED_SCHEMA = pa.schema([*RECORD_SCHEMA, pa.field(ROUTE, pa.string()), pa.field(REASON, pa.string()),
                           pa.field(SOURCE, pa.string()), pa.field(CHARS, pa.int32()), pa.field(VALUE, pa.string())])
# Unknown fields are ignored, as from_json ignored them: a newer proxy may add one.
_PARSE = pj.ParseOptions(explicit_schema=RECORD_SCHEMA, unexpected_field_behavior="ignore")
# Nearly every line is a decision. Parsed with a decision's fields only (26 of the 44), the reader costs 17% less a
# line (3.7 against 4.5 us); the few lines of other kinds are parsed again with every field. A decision's line is
# read as a decision: a field only other kinds have is an unknown field to it, ignored whatever its value.
_DECISION_NAMES = {name for name, _, _ in R.DECISION_V1} | {name for name, _, _ in R.V2_COMMON}
DECISION_SCHEMA = pa.schema([f for f in RECORD_SCHEMA if f.name in _DECISION_NAMES])
_PARSE_DECISION = pj.ParseOptions(explicit_schema=DECISION_SCHEMA, unexpected_field_behavior="ignore")


# -- the fast reader: polars, checked against what pyarrow would say -------------------------------------------------

_POLARS_TYPES = {pa.int32(): "Int32", pa.int64(): "Int64", pa.float64(): "Float64", pa.bool_(): "Boolean",
                 pa.string(): "String"}
_STRING_FIELDS = [f.name for f in DECISION_SCHEMA if f.type == pa.string()]
# polars keeps a number, boolean, object or array found where a string is declared as its JSON text (pyarrow refuses
# the line). Such a text has one of these shapes; a real string of that shape ("1.9" as a client version) only costs
# its line a second parse by pyarrow. Numbers are as polars prints them (integers, Rust's shortest float form).
_AS_TEXT = r"^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|[\[{].*)$"
_FIRST_BYTES = np.zeros(256, dtype=bool)
_FIRST_BYTES[list(b"-0123456789[{tf")] = True


def _polars() -> tuple[Any, Any]:
    """polars, imported here and not at the top: this module travels to Spark's workers by value, and polars must
    see POLARS_MAX_THREADS before its import. One thread: a Spark task is one core's work, and polars' own pool
    would compete with the other tasks. Nothing is kept in a module global (it would travel with the module)."""
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    import polars as pl

    return pl, pl.Schema({f.name: getattr(pl, _POLARS_TYPES[f.type]) for f in DECISION_SCHEMA})


def _offsets(column: pa.Array) -> np.ndarray:
    """A string array's n + 1 offsets into its data buffer, as numpy sees them (no copy)."""
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    return np.frombuffer(column.buffers()[1], dtype=width, count=len(column) + 1,
                         offset=column.offset * width(0).nbytes)


def _first_bytes(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each value's first byte and its length in bytes (0 for a null or empty value), read from the string
    array's buffers with numpy: no copy, no call per row."""
    n = len(column)
    values = column.buffers()[2]
    if column.null_count == n or values is None or values.size == 0:  # every value null or empty
        return np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.int64)
    offsets = _offsets(column)
    data = np.frombuffer(values, dtype=np.uint8)
    lengths = np.diff(offsets).astype(np.int64)
    first = data[np.minimum(offsets[:-1], len(data) - 1)]
    if column.null_count:
        lengths[~pc.is_valid(column).to_numpy(zero_copy_only=False)] = 0
    return np.where(lengths > 0, first, 0).astype(np.uint8), lengths


# A line whose first value is a bare null ("null", " null", "null}"...): pyarrow's reader dies on it (SIGSEGV in
# pyarrow 22 and 26 when the block starts with it; after an object it reads it as a row of nulls). Such a line is
# not an object, so not a record: it is never handed to a reader (malformed_json, as "5" or "[1]" are).
_NULL_FIRST_BYTES = np.zeros(256, dtype=bool)
_NULL_FIRST_BYTES[list(b"n \t\r\xef")] = True  # n, JSON whitespace, a UTF-8 byte-order mark's first byte


def _bare_nulls(text: pa.Array) -> np.ndarray:
    first, lengths = _first_bytes(text)
    found = np.zeros(len(text), dtype=bool)
    for i in np.flatnonzero(_NULL_FIRST_BYTES[first] & (lengths > 0)):  # a record line starts with "{": none
        line = text[int(i)].as_py()
        found[i] = line.lstrip("\ufeff \t\r\n").startswith("n")
    return found


def _maybe_text(column: pa.Array) -> np.ndarray:
    """The rows of a string column whose value may be another JSON type kept as its text (see `_AS_TEXT`): the
    first byte is looked at for every row (numpy, no copy), the regex runs only where it could match."""
    n = len(column)
    first, lengths = _first_bytes(column)
    candidates = (lengths > 0) & _FIRST_BYTES[first]
    # "t..."/"f..." is only "true"/"false": 4 and 5 bytes (transactional ids often start with a t).
    candidates &= ~(((first == ord("t")) & (lengths != 4)) | ((first == ord("f")) & (lengths != 5)))
    found = np.zeros(n, dtype=bool)
    if candidates.any():
        index = np.flatnonzero(candidates)
        match = pc.match_substring_regex(column.take(pa.array(index)), _AS_TEXT)
        found[index] = pc.fill_null(match, False).to_numpy(zero_copy_only=False)
    return found


def _read_fast(text: pa.Array, terminated: bool) -> tuple[pa.Table, np.ndarray] | None:
    """The lines read as decisions by polars, and the rows whose values pyarrow might not have given (to be parsed
    again by pyarrow); None when polars refuses the batch or returns another number of rows (pyarrow reads it).

    Measured against pyarrow on hand-made lines of every kind of damage (`tests/property/test_pipeline_fast_parse.py`
    compares the two on generated ones), polars differs in three ways besides refusing more (NaN, Infinity, a
    byte-order mark: the batch goes to pyarrow):
    * a number, boolean, object or array where a string is declared is kept as its JSON text: such rows are found
      by their shape (`_maybe_text`);
    * a lone UTF-16 surrogate escape ("\\ud800") becomes U+0000: a line with any "\\ud" escape is parsed again;
    * a repeated key keeps its first value (left as it is: see the module's docstring).
    """
    pl, schema = _polars()
    raw = _joined(text, terminated).to_pybytes()
    try:
        frame = pl.read_ndjson(raw, schema=schema)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException):  # a line it refuses (or a panic in its
        return None  # Rust code, a BaseException): pyarrow reads the batch, as if polars had not been there
    if frame.height != len(text):
        return None
    table = frame.to_arrow().cast(DECISION_SCHEMA)
    again = np.zeros(len(text), dtype=bool)
    for name in _STRING_FIELDS:
        again |= _maybe_text(_chunk(table[name]))
    if _surrogate_escape(raw):
        again |= pc.match_substring(text, "\\ud", ignore_case=True).to_numpy(zero_copy_only=False)
    return table, again


def _surrogate_escape(raw: bytes) -> bool:
    """Whether `raw` has a "\\ud"/"\\uD" escape (a UTF-16 surrogate). A backslash is looked for first (memchr):
    `b"\\ud" in raw` costs 0.4 us a line, more than the rest of the check."""
    if raw.find(b"\\") < 0:
        return False
    u = np.frombuffer(raw, dtype=np.uint8)
    at = np.flatnonzero(u[:-2] == ord("\\"))
    return bool(((u[at + 1] == ord("u")) & ((u[at + 2] | 0x20) == ord("d"))).any())


def _joined(text: pa.Array, terminated: bool) -> pa.Buffer:
    """The lines as one newline-separated buffer (what the JSON reader takes), without a Python string each.
    Lines that already end with their newline (`terminated`: read from the file as they are) are that buffer."""
    ended = text if terminated else pc.binary_join_element_wise(text, "", "\n")  # each line + "\n"
    offsets = _offsets(ended)
    return ended.buffers()[2][int(offsets[0]):int(offsets[-1])]


def _read(text: pa.Array, terminated: bool, options: pj.ParseOptions = _PARSE) -> pa.Table | None:
    """The lines parsed, one row each; None when the reader refuses them or returns another number of rows."""
    data = _joined(text, terminated)
    try:
        table = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False,
                                                                                block_size=max(len(data), 1) + 1),
                             parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return table if table.num_rows == len(text) else None


def _parse(text: pa.Array, terminated: bool) -> list[tuple[pa.Table | None, int]]:
    """(table, rows) pieces in order; a None table is one line that does not parse on its own."""
    table = _read(text, terminated)
    if table is not None:
        return [(table, len(text))]
    if len(text) == 1:
        return [(None, 1)]
    half = len(text) // 2
    return _parse(text.slice(0, half), terminated) + _parse(text.slice(half), terminated)


_NULL_ROW = pa.table({f.name: pa.nulls(1, f.type) for f in RECORD_SCHEMA}, schema=RECORD_SCHEMA)


def parse_lines(text: pa.Array, parseable: np.ndarray, terminated: bool = False) -> tuple[pa.Table, np.ndarray]:
    """Parse the lines where `parseable`; returns one row per line (all null where not parsed) and `parsed`.
    `terminated`: each line still ends with its newline (read from a file as it is)."""
    n = len(text)
    parseable = parseable & ~_bare_nulls(text)
    if not parseable.all():
        index = np.flatnonzero(parseable)
        table, parsed_sub = parse_lines(text.take(pa.array(index)), np.ones(len(index), dtype=bool), terminated)
        positions = np.cumsum(parseable) - 1
        scatter = pa.array(positions, mask=~parseable)  # a null index gives a null row
        parsed = np.zeros(n, dtype=bool)
        parsed[index] = parsed_sub
        return table.take(scatter), parsed
    fast = _read_fast(text, terminated) if n else None
    if fast is not None:
        return _decisions_first(text, fast[0], terminated, again=fast[1])
    return _parse_pyarrow(text, terminated)


def _parse_pyarrow(text: pa.Array, terminated: bool) -> tuple[pa.Table, np.ndarray]:
    """pyarrow alone: the lines as decisions first, then as before."""
    decisions = _read(text, terminated, _PARSE_DECISION) if len(text) else None
    if decisions is not None:
        return _decisions_first(text, decisions, terminated)
    return _parse_all_fields(text, terminated)


def _decisions_first(text: pa.Array, decisions: pa.Table, terminated: bool,
                     again: np.ndarray | None = None) -> tuple[pa.Table, np.ndarray]:
    """Every line parsed as a decision: the rows that are one keep that parse (widened to every field, null); the
    others (other kinds, unsupported versions, and the rows in `again`) are parsed again by pyarrow with every
    field, as they were before."""
    n = len(text)
    is_decision = _equals(decisions["schema_version"], 1) | (
        _equals(decisions["schema_version"], 2) & _equals(decisions["kind"], R.DECISION))
    if again is not None:
        is_decision &= ~again
    recheck = again is not None and bool(again.any())  # lines polars may have read otherwise than pyarrow
    if is_decision.all():
        widened = pa.table([decisions[f.name] if f.name in _DECISION_NAMES else pa.nulls(n, f.type)
                            for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)
        return widened, np.ones(n, dtype=bool)
    others = np.flatnonzero(~is_decision)
    # Lines polars may have read otherwise than pyarrow are read by pyarrow exactly as if polars had not been there.
    reparse = _parse_pyarrow if recheck else _parse_all_fields
    full, parsed_others = reparse(text.take(pa.array(others)), terminated)
    scatter = pa.array(np.cumsum(~is_decision) - 1, mask=is_decision)  # row k of `full` where the k-th other line is
    parsed = np.ones(n, dtype=bool)
    parsed[others] = parsed_others
    if parsed_others.all() and not recheck:
        # The first parse read the other lines' decision fields as the second did (same text, same types; for
        # polars, `_read_fast` found nothing pyarrow would read otherwise): only the fields decisions do not have
        # come from the second (0.2 us a line less than putting every column's few rows in place).
        columns = [_chunk(decisions[f.name]) if f.name in _DECISION_NAMES else _chunk(full[f.name]).take(scatter)
                   for f in RECORD_SCHEMA]
        return pa.table(columns, schema=RECORD_SCHEMA), parsed
    mask = pa.array(~is_decision)
    # Each column with the other lines' rows put in place: a decision's column keeps its values and gets the few
    # others' (no copy of the whole table through a take); a column decisions do not have is the others' only.
    columns = [pc.replace_with_mask(_chunk(decisions[f.name]), mask, _chunk(full[f.name]))
               if f.name in _DECISION_NAMES
               else _chunk(full[f.name]).take(scatter) for f in RECORD_SCHEMA]
    return pa.table(columns, schema=RECORD_SCHEMA), parsed


def _parse_all_fields(text: pa.Array, terminated: bool) -> tuple[pa.Table, np.ndarray]:
    n = len(text)
    pieces = _parse(text, terminated) if n else []
    if len(pieces) == 1 and pieces[0][0] is not None:
        return pieces[0][0], np.ones(n, dtype=bool)
    tables = [t if t is not None else _NULL_ROW for t, _ in pieces]
    parsed = np.concatenate([np.full(rows, t is not None) for t, rows in pieces]) if pieces else np.zeros(0, bool)
    return (pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()), parsed


def _all_valid(table: pa.Table, names: list[str]) -> np.ndarray:
    ok = np.ones(table.num_rows, dtype=bool)
    for name in names:
        if table[name].null_count:  # a required field is seldom missing: no pass over a column without nulls
            ok &= pc.is_valid(table[name]).to_numpy(zero_copy_only=False)
    return ok


def _equals(column: pa.ChunkedArray, value: object) -> np.ndarray:
    return pc.fill_null(pc.equal(column, value), False).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def complete(table: pa.Table, parsed: np.ndarray) -> np.ndarray:
    """Rows that are a supported record with every required field: no quarantine reason (vectorised)."""
    v1, v2 = _equals(table["schema_version"], 1), _equals(table["schema_version"], 2)
    ok = v1 & _all_valid(table, R.required(1, R.DECISION)) if v1.any() else v1
    for kind in R.KINDS:
        of_kind = v2 & _equals(table["kind"], kind)
        if of_kind.any():  # most batches have no line of most kinds
            ok |= of_kind & _all_valid(table, R.required(2, kind))
    found: np.ndarray = parsed & ok
    return found


def _utf8(value: pa.Array) -> np.ndarray:
    """Which lines are valid UTF-8. Spark's text source passes any bytes, the JSON reader does not check the
    strings it copies, and a field that is not UTF-8 would stop the job where Python reads it: such a line is not
    parsed (malformed_json). The whole batch is checked at once (vectorised); line by line only if it fails."""
    ok = np.ones(len(value), dtype=bool)
    try:
        value.validate(full=True)
    except pa.ArrowInvalid:
        for i, line in enumerate(value.view(pa.binary()).to_pylist()):
            if line is not None:
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    ok[i] = False
    return ok


def _ascii_only(value: pa.Array) -> bool:
    """Whether every line is ASCII: one numpy pass over the lines' bytes (0.05 us a line), where counting the
    characters and checking the UTF-8 cost 0.18."""
    data = value.buffers()[2]
    if data is None or len(value) == 0:
        return True
    offsets = _offsets(value)
    text = np.frombuffer(data, dtype=np.uint8)[int(offsets[0]):int(offsets[-1])]
    return bool(text.size == 0 or text.max() < 0x80)


def _byte_lengths(value: pa.Array) -> pa.Array:
    """Each line's length in bytes as int32 (null where the line is null), from the offsets."""
    lengths = np.diff(_offsets(value)).astype(np.int32)
    return pa.array(lengths, pa.int32(), mask=None if value.null_count == 0
                    else ~pc.is_valid(value).to_numpy(zero_copy_only=False))


def route_batch(value: pa.Array, source: pa.Array, terminated: bool = False) -> pa.RecordBatch:
    """One batch of lines (`value`, `source`) -> the routed frame's batch (`ROUTED_SCHEMA`).

    `terminated`: each line still ends with its newline (`ranges` reads them from the file as they are: the parse
    takes the file's bytes with no copy); the tables see them without it, as if Spark's text source had read them.
    """
    n = len(value)
    ascii_only = _ascii_only(value)
    # A line's length in characters: in ASCII its length in bytes (the offsets' differences, no pass over the text).
    chars = _byte_lengths(value) if ascii_only else pc.cast(pc.utf8_length(value), pa.int32())
    if terminated:
        chars = pc.subtract(chars, pa.scalar(1, pa.int32()))
    fits = pc.fill_null(pc.less_equal(chars, R.MAX_RECORD_CHARS), False).to_numpy(zero_copy_only=False)
    utf8 = np.ones(n, dtype=bool) if ascii_only else _utf8(value)  # ASCII is UTF-8
    if not utf8.all():  # the quarantine keeps such a line with U+FFFD where its bytes were not UTF-8
        value = pa.array([None if t is None else t.decode("utf-8", "replace")
                          for t in value.view(pa.binary()).to_pylist()], pa.string())
    fits &= utf8
    table, parsed = parse_lines(value, fits, terminated)
    good = complete(table, parsed)
    routes = pc.if_else(pa.array(_equals(table["schema_version"], 1)), R.DECISION, table["kind"])
    reasons: pa.Array = pa.nulls(n, pa.string())
    if not good.all():
        bad = np.flatnonzero(~good)
        rows = table.take(pa.array(bad)).to_pylist()
        texts = [t[:-1] if terminated and t else t for t in value.take(pa.array(bad)).to_pylist()]
        sizes = chars.take(pa.array(bad)).to_pylist()
        found = [R.quarantine_reason(row if parsed[i] else None, text, size)
                 for i, row, text, size in zip(bad, rows, texts, sizes, strict=True)]
        reason_list: list[str | None] = [None] * n
        for i, reason in zip(bad, found, strict=True):
            reason_list[i] = reason
        reasons = pa.array(reason_list, pa.string())
    quarantined = pc.is_valid(reasons)
    routes = pc.if_else(quarantined, R.QUARANTINE, routes)
    # Only a quarantined line keeps its text (most of a record's size): the table keeps its first characters.
    if terminated and pc.any(quarantined).as_py():
        value = pc.utf8_slice_codeunits(value, 0, -1)  # rare: only a batch with a bad line pays this copy
    kept = pc.if_else(quarantined, value, pa.scalar(None, pa.string()))
    columns = [_chunk(c) for c in table.columns]
    return pa.RecordBatch.from_arrays([*columns, _chunk(routes), reasons, _chunk(source), chars, _chunk(kept)],
                                      schema=ROUTED_SCHEMA)


def _chunk(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One array; a single chunk as it is (`combine_chunks` copies even that one)."""
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    return a


def route_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: batches of (`value`, `source`) -> routed batches."""
    for batch in batches:
        value, source = batch.column(VALUE), batch.column(SOURCE)
        if value.type != pa.string():
            value = value.cast(pa.string())
        if source.type != pa.string():
            source = source.cast(pa.string())
        yield route_batch(value, source)

"""The raw tables' columns, computed with Arrow beside the parse (in the same Python worker, same batch).

Each raw table (decisions, connections, quarantine, hanging_transactions, end_txn_holds, transaction_log_ids) is a
route of the
routed batch (`arrow_parse`) and a set of columns; `raw_batch` gives every table's rows of one batch in one
frame: a `table` column and the union of the tables' columns (null where a row's table has no such column).
The batch job writes that frame partitioned by table and day; a --follow stream filters its own table out of it.

Before, these were Spark expressions over the routed rows: one CASE per column of the union, which cost the
JVM ~10 us of CPU per record, more than the parse. Here each table's columns are computed vectorised on its own
rows only. Times are UTC; `day` is the UTC date of the record's time (the quarantine's: of the ingest).
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
import zipimport
from collections.abc import Callable, Iterable, Iterator
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txnguard.pipeline import arrow_aggregates as A
from txnguard.pipeline import arrow_parse as P
from txnguard.pipeline import ranges
from txnguard.pipeline import records as R

TABLE = "table"
QUARANTINE_PREFIX_CHARS = 1024
_DAY_MS = 86_400_000
_TS = pa.timestamp("us", tz="UTC")  # Spark's TimestampType as Arrow carries it (session time zone UTC)

Columns = dict[str, pa.Array]


def _fields(kind_fields: tuple[tuple[str, R.FieldType, bool], ...]) -> list[str]:
    return [name for name, _, _ in kind_fields if name not in ("schema_version", "kind", "proxy_id")]


DECISION_FIELDS = [name for name, _, _ in R.DECISION_V1 if name != "schema_version"]
CONNECTION_FIELDS = _fields(R.CONNECTION_V2)
HANGING_FIELDS = _fields(R.HANGING_V2)
END_TXN_HOLD_FIELDS = _fields(R.END_TXN_HOLD_V2)
TRANSACTION_LOG_ID_FIELDS = _fields(R.TRANSACTION_LOG_ID_V2)


def _time(ms: pa.Array) -> pa.Array:
    return pc.cast(pc.multiply(ms, 1000), _TS)


def _day(ms: pa.Array) -> pa.Array:
    return pc.cast(pc.cast(pc.divide(ms, _DAY_MS), pa.int32()), pa.date32())


def _head(b: pa.RecordBatch) -> Columns:
    return {"day": _day(b["time_ms"]), "event_time": _time(b["time_ms"])}


_NO_SPLIT = pa.scalar(["", ""], pa.list_(pa.string()))


def _topic_partition(target: pa.Array) -> tuple[pa.Array, pa.Array]:
    """"TOPIC-PARTITION" split at its last '-' when what follows is ASCII digits (what the regex
    ^(.*)-(\\d+)$ matched, at a fifth of its cost); both null otherwise."""
    parts = pc.split_pattern(target, "-", max_splits=1, reverse=True)
    two = pc.fill_null(pc.equal(pc.list_value_length(parts), 2), False)
    parts = pc.if_else(two, parts, _NO_SPLIT)
    partition = pc.list_element(parts, 1)
    ok = pc.and_(two, pc.fill_null(pc.ascii_is_decimal(partition), False))
    no = pa.scalar(None, pa.string())
    return pc.if_else(ok, pc.list_element(parts, 0), no), pc.if_else(ok, partition, no)


def _decision_columns(b: pa.RecordBatch) -> Columns:
    target = b["target"]
    is_group = pc.fill_null(pc.starts_with(target, "group:"), False)
    # topic-partition; a group: or txn: target (TxnOffsetCommit, a KIP-588 EndTxn) has neither.
    topic, partition = _topic_partition(target)
    no = pa.scalar(None, pa.string())
    return {
        **_head(b), "schema_version": b["schema_version"], "proxy_id": b["proxy_id"],
        **{n: b[n] for n in DECISION_FIELDS},
        "topic": pc.if_else(is_group, no, topic),
        "partition": pc.cast(pc.if_else(is_group, no, partition), pa.int32()),
        "group_id": pc.if_else(is_group, pc.utf8_slice_codeunits(target, 6), no),
        "source": b[P.SOURCE],
    }


def _connection_columns(b: pa.RecordBatch) -> Columns:
    return {**_head(b), "connected_time": _time(b["connected_ms"]), "proxy_id": b["proxy_id"],
            **{n: b[n] for n in CONNECTION_FIELDS}, "source": b[P.SOURCE]}


def _quarantine_columns(b: pa.RecordBatch) -> Columns:
    now = dt.datetime.now(dt.UTC)
    n = b.num_rows
    reason = b[P.REASON]
    return {
        "day": pa.array([now.date()] * n, pa.date32()),
        "ingested_at": pa.array([now] * n, _TS),
        "source": b[P.SOURCE],
        "reason": reason,
        "reason_kind": pc.struct_field(pc.extract_regex(reason, r"^(?P<kind>[a-z_]+)"), [0]),
        "chars": b[P.CHARS],
        "line_prefix": pc.utf8_slice_codeunits(b[P.VALUE], 0, QUARANTINE_PREFIX_CHARS),
    }


def _hanging_columns(b: pa.RecordBatch) -> Columns:
    return {**_head(b), "proxy_id": b["proxy_id"], **{n: b[n] for n in HANGING_FIELDS},
            "last_write_time": _time(b["last_timestamp_ms"]), "source": b[P.SOURCE]}


def _end_txn_hold_columns(b: pa.RecordBatch) -> Columns:
    return {**_head(b), "proxy_id": b["proxy_id"], **{n: b[n] for n in END_TXN_HOLD_FIELDS},
            "in_doubt_count": pc.cast(pc.list_value_length(b["end_txns_in_doubt"]), pa.int32()),
            "source": b[P.SOURCE]}


def _transaction_log_id_columns(b: pa.RecordBatch) -> Columns:
    return {**_head(b), "proxy_id": b["proxy_id"], **{n: b[n] for n in TRANSACTION_LOG_ID_FIELDS},
            "last_update_time": _time(b["last_update_ms"]), "source": b[P.SOURCE]}


# Each raw table: the route its rows come from and its columns.
RAW: dict[str, tuple[str, Callable[[pa.RecordBatch], Columns]]] = {
    "decisions": (R.DECISION, _decision_columns),
    "connections": (R.CONNECTION, _connection_columns),
    "quarantine": (R.QUARANTINE, _quarantine_columns),
    "hanging_transactions": (R.HANGING, _hanging_columns),
    "end_txn_holds": (R.END_TXN_HOLD, _end_txn_hold_columns),
    "transaction_log_ids": (R.TRANSACTION_LOG_ID, _transaction_log_id_columns),
}


def _schema(name: str) -> pa.Schema:
    """A table's columns and their types, from its function applied to an empty routed batch."""
    columns = RAW[name][1](pa.RecordBatch.from_pylist([], schema=P.ROUTED_SCHEMA))
    return pa.schema([pa.field(n, c.type) for n, c in columns.items()])


SCHEMAS: dict[str, pa.Schema] = {name: _schema(name) for name in RAW}


class _Reads:
    """A routed batch that notes which columns a table's function reads."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> pa.Array:
        self.names.add(name)
        return self.batch[name]

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)


def _inputs(name: str) -> list[str]:
    """The routed columns a table's columns come from: a table's rows are filtered out of these only (the routed
    batch has every kind's fields; copying all of them for the decisions' 98% of rows cost twice the time)."""
    reads = _Reads(pa.RecordBatch.from_pylist([], schema=P.ROUTED_SCHEMA))
    RAW[name][1](cast(pa.RecordBatch, reads))
    return [n for n in P.ROUTED_SCHEMA.names if n in reads.names]


INPUTS: dict[str, list[str]] = {name: _inputs(name) for name in RAW}


def _rows_of(routed: pa.RecordBatch, routes: pa.Array, name: str, route: str) -> pa.RecordBatch:
    """A raw table's rows of a routed batch, with only the routed columns its function reads."""
    mask = pc.equal(routes, route)
    inputs = routed.select(INPUTS[name])
    return inputs if pc.all(mask).as_py() else inputs.filter(mask)


def _union() -> pa.Schema:
    fields: dict[str, pa.Field] = {TABLE: pa.field(TABLE, pa.string())}
    for schema in SCHEMAS.values():
        for f in schema:
            if f.name in fields and fields[f.name].type != f.type:
                raise TypeError(f"column {f.name} has two types: {fields[f.name].type} and {f.type}")
            fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()))


ALL_RAW_SCHEMA = _union()


def raw_batches(routed: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """One routed batch -> a batch per raw table that has rows in it, each in `ALL_RAW_SCHEMA`."""
    routes = routed[P.ROUTE]
    for name, (route, columns_of) in RAW.items():
        rows = _rows_of(routed, routes, name, route)
        if rows.num_rows == 0:
            continue
        columns = columns_of(rows)
        n = rows.num_rows
        arrays = [pa.array([name] * n, pa.string()) if f.name == TABLE else
                  _chunk(columns[f.name]) if f.name in columns else pa.nulls(n, f.type) for f in ALL_RAW_SCHEMA]
        yield pa.RecordBatch.from_arrays(arrays, schema=ALL_RAW_SCHEMA)


_chunk = P._chunk


def all_raw_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: batches of lines (`value`, `source`) -> every raw table's rows."""
    for routed in P.route_batches(batches):
        yield from raw_batches(routed)


# -- the batch job's write: each task writes its raw tables' Parquet files itself ----------------------------------

MANIFEST_SCHEMA = pa.schema([pa.field(TABLE, pa.string()), pa.field("day", pa.string()),
                             pa.field("file", pa.string()), pa.field("rows", pa.int64())])
FLUSH_ROWS = 65_536  # rows of one table and day buffered before they become a row group


# Min/max statistics only for the time columns: a reader skips row groups outside --since/--until with them (Spark's
# Parquet filter push-down); on every column they cost 16% of the write's CPU (0.16 us a decision row).
_STATISTICS = ("event_time", "time_ms", "connected_time", "ingested_at")


def _statistics(schema: pa.Schema) -> list[str]:
    return [name for name in _STATISTICS if name in schema.names]


def _dictionary(schema: pa.Schema) -> list[str]:
    """Dictionary encoding for the columns with few distinct values (strings, small ints, flags), not for the
    64-bit numbers and times (ids, offsets, milliseconds, latencies: nearly one value a row). Measured on a 35 MB
    range's decisions: 0.74 -> 0.62 us a row to write, and 42 -> 38 bytes a row on disk."""
    wide = (pa.types.is_int64, pa.types.is_floating, pa.types.is_timestamp)
    return [f.name for f in schema if not any(is_(f.type) for is_ in wide)]


class _Files:
    """One task's open Parquet files, one per table and day, named for this attempt only."""

    def __init__(self, staging: str) -> None:
        self.staging = staging
        self.attempt = uuid.uuid4().hex
        self.writers: dict[tuple[str, str], pq.ParquetWriter] = {}
        self.pending: dict[tuple[str, str], list[pa.RecordBatch]] = {}
        self.rows: dict[tuple[str, str], int] = {}
        self.paths: dict[tuple[str, str], str] = {}
        self.done: list[tuple[str, str]] = []  # files written whole (`add_whole`)

    def add(self, name: str, batch: pa.RecordBatch) -> None:
        days = batch["day"]
        for day in pc.unique(days).to_pylist():
            rows = batch.filter(pc.equal(days, day)) if day is not None else batch.filter(pc.is_null(days))
            key = (name, "__HIVE_DEFAULT_PARTITION__" if day is None else day.isoformat())
            self.pending.setdefault(key, []).append(rows.drop_columns(["day"]))
            self.rows[key] = self.rows.get(key, 0) + rows.num_rows
            if sum(b.num_rows for b in self.pending[key]) >= FLUSH_ROWS:
                self._flush(key)

    def add_whole(self, name: str, table: pa.Table) -> None:
        """A table with no day partition (a partial aggregate): one file, written now."""
        key = (name, "")
        folder = os.path.join(self.staging, name)
        os.makedirs(folder, exist_ok=True)
        self.paths[key] = os.path.join(folder, f"part-{self.attempt}.snappy.parquet")
        pq.write_table(table, self.paths[key], compression="snappy", write_statistics=_statistics(table.schema),
                       use_dictionary=_dictionary(table.schema))
        self.rows[key] = table.num_rows
        self.done.append(key)

    def _flush(self, key: tuple[str, str]) -> None:
        batches = self.pending.pop(key, [])
        if not batches:
            return
        if key not in self.writers:
            name, day = key
            folder = os.path.join(self.staging, name, f"day={day}")
            os.makedirs(folder, exist_ok=True)
            self.paths[key] = os.path.join(folder, f"part-{self.attempt}.snappy.parquet")
            schema = batches[0].schema
            self.writers[key] = pq.ParquetWriter(self.paths[key], schema, compression="snappy",
                                                 write_statistics=_statistics(schema),
                                                 use_dictionary=_dictionary(schema))
        self.writers[key].write_table(pa.Table.from_batches(batches))

    def close(self) -> pa.RecordBatch:
        for key in list(self.pending):
            self._flush(key)
        for w in self.writers.values():
            w.close()
        keys = [*self.writers, *self.done]
        return pa.RecordBatch.from_arrays(
            [pa.array([k[0] for k in keys], pa.string()), pa.array([k[1] for k in keys], pa.string()),
             pa.array([self.paths[k] for k in keys], pa.string()),
             pa.array([self.rows[k] for k in keys], pa.int64())], schema=MANIFEST_SCHEMA)


def _is_spark_archive(path: str) -> bool:
    name = os.path.basename(path)
    return name == "pyspark.zip" or name.endswith(".jar") or (name.startswith("py4j-") and name.endswith(".zip"))


def _spare_the_import_caches() -> None:
    """Keep a Python worker from re-reading Spark's own archives before every task.

    Before each task a worker calls `importlib.invalidate_caches()` (pyspark `setup_spark_files`). On Python 3.10+
    every zip importer then reads its archive's whole directory again: one importer per pyspark package imported
    from pyspark.zip (11 ms each) and the spark-core jar Spark also puts on the path (41 ms). Measured on a
    10M-record ingest of 85 tasks: the workers' CPU outside the tasks' own code went from 16.2 s (117.4 against
    101.2) to 5.4 s (111.0 against 105.6) with this. Those archives are
    the installation and never change while a worker lives, so their importers keep what they read; any other
    archive (a --py-files zip) is re-read as before. Once per worker process.
    """
    if getattr(zipimport.zipimporter, "_txnguard_spared", False):
        return
    reread = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: zipimport.zipimporter) -> None:
        if not _is_spark_archive(self.archive):
            reread(self)

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    zipimport.zipimporter._txnguard_spared = True  # type: ignore[attr-defined]


PARTIAL_PREFIX = "_partial_"  # a manifest row of a task's partial aggregate file: "_partial_" + its kind


def _write_routed(staging: str, routed_batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Routed batches -> every raw table and `incidents_prevented` written under `staging/NAME/day=DAY/` (Parquet,
    only that table's columns), the task's partial aggregates under `staging/_partial_KIND/`, and out one row per
    file written: table, day, file, rows.

    Writing here, not through Spark's writer, skips turning ~60 Arrow columns into Spark rows, the sort by table and
    day that a partitioned write plans, and the union's all-null columns (measured: the partitioned write was ~2/3
    of the ingest's CPU). A file is named for its task attempt; the driver keeps only the files the job's result
    lists (`job.ingest`), so a failed or speculative attempt's files are dropped, as Spark's own commit does.
    """
    _spare_the_import_caches()
    files = _Files(staging)
    partials = A.Partials()
    for routed in routed_batches:
        routes = routed[P.ROUTE]
        for name, (route, columns_of) in RAW.items():
            rows = _rows_of(routed, routes, name, route)
            if rows.num_rows:
                columns = columns_of(rows)
                batch = pa.RecordBatch.from_arrays([_chunk(columns[f.name]) for f in SCHEMAS[name]],
                                                   schema=SCHEMAS[name])
                files.add(name, batch)
                if name == "decisions":
                    table = pa.Table.from_batches([batch])
                    partials.add_decisions(table)
                    found = A.incidents(table).combine_chunks()
                    if found.num_rows:
                        files.add("incidents_prevented", found.to_batches()[0])
                elif name == "connections":
                    partials.add_connections(pa.Table.from_batches([batch]))
    for kind, table in partials.tables().items():
        files.add_whole(PARTIAL_PREFIX + kind, table)
    yield files.close()


def write_raw(staging: str, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batch job's `mapInArrow` function over lines from Spark (`value`, `source`): see `_write_routed`."""
    yield from _write_routed(staging, P.route_batches(batches))


def writer(staging: str) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """`write_raw` bound to a staging folder, as a plain function (what `mapInArrow` takes)."""
    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return write_raw(staging, batches)
    return write


def _routed_ranges(todo: list[tuple[str, int, int, str]],
                   batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for i in batch.column(0).to_pylist():
            path, start, end, source = todo[i]
            for lines in ranges.range_batches(path, start, end):
                yield P.route_batch(lines, pa.repeat(pa.scalar(source, pa.string()), len(lines)), terminated=True)


def range_writer(staging: str, todo: list[tuple[str, int, int, str]]
                 ) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The batch job's `mapInArrow` function over ids into `todo` (byte ranges of local files: path, start, end,
    source): each task reads its ranges itself (`ranges`), then as `_write_routed`."""
    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _write_routed(staging, _routed_ranges(todo, batches))
    return write

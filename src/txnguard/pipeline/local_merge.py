"""The tasks' partial aggregates merged in the driver with Arrow, when they are small: no Spark job per table.

The ingest's tasks leave a few percent of the input as partial rows (`arrow_aggregates`). Merging them with Spark
cost ~5 s of wall time and ~10 CPU seconds per table at 10M records here, nearly all of it fixed: planning, code
generation and the JIT of a fresh JVM, for tables of a few thousand rows. Below `job.LOCAL_MERGE_MAX_BYTES` of
partial files the driver merges them itself; above it (a fleet's month) Spark does (`tables.rejections_from`,
`tables.latency_buckets`, `tables.verification_latency`, `tables.inventory_from`). Each function here gives the
rows its Spark twin gives, column for column (a test compares them on one input); Spark reads the files written
here with the tables' declared schemas like any other.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from txnguard.pipeline import arrow_aggregates as A


def read(folder: str, kind: str) -> pa.Table:
    schema = A.PARTIAL_SCHEMAS[kind]
    if not os.path.isdir(folder):
        return schema.empty_table()
    return ds.dataset(folder, format="parquet", schema=schema).to_table()


def rejections(partials: pa.Table) -> pa.Table:
    """`tables.rejections_from`."""
    keys = list(A.REJECTION_SCHEMA.names[:8])
    g = partials.group_by(keys).aggregate([("count", "sum"), ("first_time", "min"), ("last_time", "max")])
    return g.rename_columns([*keys, "count", "first_time", "last_time"])


def latency_buckets(partials: pa.Table) -> pa.Table:
    """`tables.latency_buckets`."""
    keys = list(A.LATENCY_SCHEMA.names[:4])
    g = partials.group_by(keys).aggregate([("count", "sum"), ("sum_ms", "sum"), ("max_ms", "max")])
    return g.rename_columns([*keys, "count", "sum_ms", "max_ms"])


def bucket_value(bucket: np.ndarray) -> np.ndarray:
    """`tables.bucket_value`: a bucket's middle."""
    values = np.power(A.LATENCY_GAMMA, bucket.astype(np.float64)) * (2 / (A.LATENCY_GAMMA + 1))
    return np.where(bucket == A.ZERO_BUCKET, 0.0, values)


def _percentile(values: np.ndarray, counts: np.ndarray, p: float) -> float | None:
    """Spark's `percentile(value, p, frequency)` (Percentile.getPercentile): linear between the two ranks around
    (n - 1) * p, over the values sorted, each repeated by its count."""
    if not len(values):
        return None
    accumulated = np.cumsum(counts)
    position = (int(accumulated[-1]) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    lower_value = float(values[int(np.searchsorted(accumulated, lower + 1))])
    if higher == lower:
        return lower_value
    higher_value = float(values[int(np.searchsorted(accumulated, higher + 1))])
    if higher_value == lower_value:
        return lower_value
    return (higher - position) * lower_value + (position - lower) * higher_value


def latency_summary(buckets: pa.Table, keys: list[str]) -> pa.Table:
    """`tables.latency_summary`: count, p50/p95/p99, max and mean per key, from the buckets."""
    order = buckets.sort_by([(k, "ascending") for k in keys] + [("bucket", "ascending")])
    columns: dict[str, list[Any]] = {k: [] for k in [*keys, "count", "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"]}
    key_rows = order.select(keys).to_pylist()
    bucket = order["bucket"].to_numpy(zero_copy_only=False)
    count = order["count"].to_numpy(zero_copy_only=False)
    sum_ms = order["sum_ms"].to_numpy(zero_copy_only=False)
    max_ms = order["max_ms"].to_numpy(zero_copy_only=False)
    start = 0
    while start < len(key_rows):
        end = start + 1
        while end < len(key_rows) and key_rows[end] == key_rows[start]:
            end += 1
        timed = ~np.isnan(bucket[start:end].astype(np.float64))  # a null bucket: a decision with no latency
        b, c = bucket[start:end][timed].astype(np.int64), count[start:end][timed]
        values = bucket_value(b)
        for k in keys:
            columns[k].append(key_rows[start][k])
        columns["count"].append(int(count[start:end].sum()))
        for name, p in zip(("p50_ms", "p95_ms", "p99_ms"), A.PERCENTILES, strict=True):
            columns[name].append(_percentile(values, c, p))
        maxima = max_ms[start:end][~np.isnan(max_ms[start:end].astype(np.float64))]
        columns["max_ms"].append(float(maxima.max()) if len(maxima) else None)
        columns["mean_ms"].append(float(np.nansum(sum_ms[start:end][timed])) / int(c.sum()) if c.sum() else None)
        start = end
    types = {**{k: buckets.schema.field(k).type for k in keys}, "count": pa.int64()}
    return pa.table({name: pa.array(v, types.get(name, pa.float64())) for name, v in columns.items()})


_SETS = ("client_ids", "transactional_ids", "listeners", "proxy_ids", "produce_versions", "txn_offset_commit_versions")


def client_inventory(partials: pa.Table) -> pa.Table:
    """`tables.inventory_from`: the partial rows of each client and day merged (sets unioned, sorted, the first 100
    of each id list kept, `transactional_id_count` the size of the whole set). Vectorised: the id lists hold
    thousands of strings per client and task."""
    keys = list(A.INVENTORY_KEYS)
    n = partials.num_rows
    indexed = partials.append_column("row", pa.array(np.arange(n, dtype=np.int64)))
    groups = indexed.group_by(keys, use_threads=False).aggregate([("row", "list")])
    group_of = np.empty(n, dtype=np.int64)
    for g, rows in enumerate(groups["row_list"].to_pylist()):
        group_of[rows] = g
    gid = pa.array(group_of)
    scalars = pa.table({"g": gid, **{c: partials[c] for c in ("first_seen", "last_seen", "connections", "decisions",
                                                               "rejections", "unenforced_rejections",
                                                               "used_transactions", "pre_tv2")}})
    any_valid = pc.ScalarAggregateOptions(skip_nulls=True, min_count=1)  # bool_or: null only when all are null
    agg = scalars.group_by("g", use_threads=False).aggregate([
        ("first_seen", "min"), ("last_seen", "max"), ("connections", "sum"), ("decisions", "sum"),
        ("rejections", "sum"), ("unenforced_rejections", "sum"), ("used_transactions", "any", any_valid),
        ("pre_tv2", "any", any_valid)]).sort_by("g")
    sets: dict[str, list[list[Any]]] = {}
    for column in _SETS:
        values = partials[column].combine_chunks()
        flat = pa.table({"g": pc.take(gid, pc.list_parent_indices(values)), "v": pc.list_flatten(values)})
        distinct = flat.group_by("g", use_threads=False).aggregate([("v", "distinct")])
        found: list[list[Any]] = [[] for _ in range(groups.num_rows)]
        for g, vs in zip(distinct["g"].to_pylist(), distinct["v_distinct"].to_pylist(), strict=True):
            found[g] = sorted(v for v in vs if v is not None)  # collect_set leaves nulls out
        sets[column] = found
    first = {c: [v[:A.INVENTORY_FIRST] for v in sets[c]] for c in ("client_ids", "transactional_ids", "listeners",
                                                                   "proxy_ids")}
    strings, ints32 = pa.list_(pa.string()), pa.list_(pa.int32())
    return pa.table({
        **{k: groups[k] for k in keys},
        "client_ids": pa.array(first["client_ids"], strings),
        "transactional_ids": pa.array(first["transactional_ids"], strings),
        "transactional_id_count": pa.array([len(v) for v in sets["transactional_ids"]], pa.int64()),
        "listeners": pa.array(first["listeners"], strings), "proxy_ids": pa.array(first["proxy_ids"], strings),
        "first_seen": agg["first_seen_min"], "last_seen": agg["last_seen_max"],
        "connections": agg["connections_sum"], "decisions": agg["decisions_sum"], "rejections": agg["rejections_sum"],
        "unenforced_rejections": agg["unenforced_rejections_sum"], "used_transactions": agg["used_transactions_any"],
        "pre_tv2": agg["pre_tv2_any"], "produce_versions": pa.array(sets["produce_versions"], ints32),
        "txn_offset_commit_versions": pa.array(sets["txn_offset_commit_versions"], ints32)})


def _bool_or(a: bool | None, b: bool | None) -> bool | None:
    """SQL's bool_or: null only when every value is null."""
    return b if a is None else a if b is None else a or b


def write(table: pa.Table, folder: str) -> None:
    """As Spark's `partitionBy("day")` overwrite: `folder/day=YYYY-MM-DD/part-*.parquet`, no `day` column inside."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if table.num_rows:
        ds.write_dataset(table, folder, format="parquet", partitioning=["day"], partitioning_flavor="hive",
                         basename_template=f"part-{uuid.uuid4().hex}-{{i}}.snappy.parquet",
                         existing_data_behavior="overwrite_or_ignore")
    open(os.path.join(folder, "_SUCCESS"), "w").close()


# -- the report's figures from the same tables, when the aggregates were merged here ---------------------------------

def _naive(table: pa.Table) -> pa.Table:
    """Timestamps as naive UTC, as Spark's `collect` hands them to Python (the session's time zone is UTC)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            table = table.set_column(i, f.name, pc.cast(table[f.name], pa.timestamp("us")))
    return table


def read_table(folder: str) -> pa.Table | None:
    """A table written by the ingest or here (hive `day=` folders), or None if it has no file."""
    if not os.path.isdir(folder) or not any(p.endswith(".parquet") for _, _, files in os.walk(folder) for p in files):
        return None
    return _naive(ds.dataset(folder, format="parquet", partitioning="hive").to_table())


def _sum_by(table: pa.Table, keys: list[str], column: str = "count") -> list[dict[str, Any]]:
    if not table.num_rows:
        return []
    rows: list[dict[str, Any]] = _naive(table.group_by(keys).aggregate([(column, "sum")])).to_pylist()
    return rows


def _key(value: Any) -> tuple[bool, Any]:
    """Spark's ascending order: nulls first."""
    return (value is not None, value)


def report_queries(rej: pa.Table, buckets: pa.Table, inv: pa.Table, incidents: pa.Table | None,
                   quarantine: pa.Table | None, holds: pa.Table | None, top_ids: int) -> dict[str, Any]:
    """`job.collect_report`'s queries, on the merged tables in memory and the small raw tables."""
    got: dict[str, Any] = {}
    got["failed"] = {r["decision"]: int(r["count_sum"]) for r in _sum_by(rej, ["decision"])}
    got["by_hour"] = sorted(((r["hour"], r["reason"], int(r["count_sum"])) for r in _sum_by(rej, ["hour", "reason"])),
                            key=lambda t: (_key(t[0]), _key(t[1])))
    latency = _naive(latency_summary(buckets, ["evidence"])).to_pylist() if buckets.num_rows else []
    got["latency"] = [(r["evidence"], int(r["count"]), float(r["p50_ms"]), float(r["p95_ms"]), float(r["p99_ms"]),
                       float(r["max_ms"])) for r in sorted(latency, key=lambda r: _key(r["evidence"]))]
    inventory: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in _naive(inv).to_pylist():
        key = (r["client_family"], r["client_software_name"], r["client_software_version"])
        m = inventory.setdefault(key, {"client_family": key[0], "client_software_name": key[1],
                                       "client_software_version": key[2], "connections": 0, "decisions": 0,
                                       "rejections": 0, "unenforced_rejections": 0, "pre_tv2": None,
                                       "client_ids": set(), "first_seen": None, "last_seen": None})
        for k in ("connections", "decisions", "rejections", "unenforced_rejections"):
            m[k] += r[k] or 0
        m["pre_tv2"] = _bool_or(m["pre_tv2"], r["pre_tv2"])
        m["client_ids"].update(r["client_ids"] or ())
        m["first_seen"] = r["first_seen"] if m["first_seen"] is None else min(m["first_seen"], r["first_seen"])
        m["last_seen"] = r["last_seen"] if m["last_seen"] is None else max(m["last_seen"], r["last_seen"])
    got["inventory"] = [{**m, "client_ids": sorted(m["client_ids"])}
                        for _, m in sorted(inventory.items(), key=lambda kv: tuple(_key(v) for v in kv[0]))]
    top = sorted(((r["transactional_id"], int(r["count_sum"])) for r in _sum_by(rej, ["transactional_id"])),
                 key=lambda t: (-t[1], _key(t[0])))
    got["top"] = top[:top_ids]
    found: list[tuple[str, bool, int, str]] = []
    if incidents is not None and incidents.num_rows:
        g = incidents.group_by(["incident", "prevented"], use_threads=False).aggregate(
            [([], "count_all"), ("consequence", "first")])
        found = [(r["incident"], bool(r["prevented"]), int(r["count_all"]), r["consequence_first"])
                 for r in g.to_pylist()]
    got["incidents"] = sorted(found, key=lambda t: -t[2])
    kinds: list[tuple[str, int]] = []
    if quarantine is not None and quarantine.num_rows:
        kinds = [(r["reason_kind"], int(r["count_all"]))
                 for r in quarantine.group_by(["reason_kind"]).aggregate([([], "count_all")]).to_pylist()]
    got["quarantine"] = sorted(kinds, key=lambda t: -t[1])
    held: list[tuple[str, str, int, float, float]] = []
    if holds is not None and holds.num_rows:
        for (ending, decision), values in _groups(holds, ["ending", "decision"], "held_ms").items():
            v = np.sort(np.asarray([x for x in values if x is not None], dtype=np.float64))
            median = _percentile(v, np.ones(len(v), dtype=np.int64), 0.5)
            held.append((ending, decision, len(values), float("nan") if median is None else median,
                         float(v.max()) if len(v) else float("nan")))
    got["end_txn_holds"] = sorted(held, key=lambda t: (_key(t[0]), _key(t[1])))
    return got


def _groups(table: pa.Table, keys: list[str], column: str) -> dict[tuple[Any, ...], list[Any]]:
    out: dict[tuple[Any, ...], list[Any]] = {}
    for r in table.select([*keys, column]).to_pylist():
        out.setdefault(tuple(r[k] for k in keys), []).append(r[column])
    return out

"""The aggregate tables' partial rows, made with Arrow by the ingest's tasks from the rows they just parsed.

A task that has a batch of decisions in memory counts it there (a combiner): rejections per key, latencies per
bucket, clients per day, and the failed decisions classified for `incidents_prevented`. Spark then merges the
tasks' small partial tables (`tables.rejections_from`, `tables.latency_buckets`, `tables.inventory_from`) instead
of reading every decision again. Before, the four aggregates re-read the 10M decisions and cost more CPU than the
parse (73 s of the job's 201 at 10M); the merge reads a few percent of that.

Every function here makes exactly the rows its Spark twin in `tables` makes from the written tables (the windowed
and --follow runs use those); `tests/integration/test_pipeline.py` compares the two on the same input. Nothing
here imports pyspark (shipped to the executors by value, like `arrow_tables`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txnguard.pipeline import records as R
from txnguard.pipeline.incidents import ACTED, classify

# The latency histogram (`tables` explains it) and the report's percentiles, for this module, its Spark twins in
# `tables` and the driver's merge in `local_merge` alike.
LATENCY_GAMMA = 1.01
ZERO_BUCKET = -(2**31)  # a latency of 0 (or less: a clock step) has no logarithm
PERCENTILES = (0.5, 0.95, 0.99)
INVENTORY_FIRST = 100  # the client inventory keeps the first 100 sorted ids of each list

_TS = pa.timestamp("us", tz="UTC")
_STRINGS = pa.list_(pa.string())
_INTS = pa.list_(pa.int32())

REJECTION_SCHEMA = pa.schema([
    ("day", pa.date32()), ("hour", _TS), ("reason", pa.string()), ("decision", pa.string()),
    ("client_family", pa.string()), ("api", pa.string()), ("topic", pa.string()), ("transactional_id", pa.string()),
    ("count", pa.int64()), ("first_time", _TS), ("last_time", _TS)])
LATENCY_SCHEMA = pa.schema([
    ("day", pa.date32()), ("hour", _TS), ("evidence", pa.string()), ("bucket", pa.int32()), ("count", pa.int64()),
    ("sum_ms", pa.float64()), ("max_ms", pa.float64())])
INVENTORY_KEYS = ("day", "client_family", "client_software_name", "client_software_version")
INVENTORY_SCHEMA = pa.schema([
    ("day", pa.date32()), ("client_family", pa.string()), ("client_software_name", pa.string()),
    ("client_software_version", pa.string()), ("client_ids", _STRINGS), ("transactional_ids", _STRINGS),
    ("listeners", _STRINGS), ("proxy_ids", _STRINGS), ("first_seen", _TS), ("last_seen", _TS),
    ("connections", pa.int64()), ("decisions", pa.int64()), ("rejections", pa.int64()),
    ("unenforced_rejections", pa.int64()), ("used_transactions", pa.bool_()), ("pre_tv2", pa.bool_()),
    ("produce_versions", _INTS), ("txn_offset_commit_versions", _INTS)])
# `tables.incidents_prevented`'s columns, in its order.
INCIDENT_COLUMNS = ["day", "event_time", "proxy_id", "transactional_id", "producer_id", "producer_epoch", "api",
                    "api_version", "target", "topic", "group_id", "client_family", "client_software_name",
                    "client_software_version", "outcome", "evidence", "reason", "decision", "error_name"]

PARTIAL_SCHEMAS = {"rejections": REJECTION_SCHEMA, "latency": LATENCY_SCHEMA, "inventory": INVENTORY_SCHEMA}


_HOUR_MS = 3_600_000


def _hour(time_ms: pa.Array) -> pa.Array:
    """date_trunc('hour', event_time) in UTC, from the integer milliseconds: `floor_temporal` on a zoned timestamp
    cost 0.43 us a row, this 0.01."""
    q = pc.divide(time_ms, _HOUR_MS)  # integer division truncates toward zero: one less below the epoch
    q = pc.if_else(pc.and_(pc.less(time_ms, 0), pc.not_equal(pc.multiply(q, _HOUR_MS), time_ms)),
                   pc.subtract(q, 1), q)
    return pc.cast(pc.multiply(q, _HOUR_MS * 1000), _TS)


def _failed(d: pa.Table) -> pa.Table:
    return d.filter(pc.fill_null(pc.not_equal(d["outcome"], "pass"), False))


def _ordered(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.table([table[f.name].cast(f.type) for f in schema], schema=schema)


def rejection_partials(d: pa.Table) -> pa.Table:
    """`tables.rejection_partials`: failed decisions counted per day, hour, reason, decision, family, api,
    topic (or group:ID), transactional id."""
    failed = _failed(d)
    keyed = pa.table({
        "day": failed["day"], "hour": _hour(failed["time_ms"]), "reason": failed["outcome"],
        "decision": failed["decision"], "client_family": failed["client_family"], "api": failed["api"],
        "topic": pc.coalesce(failed["topic"], pc.binary_join_element_wise("group:", failed["group_id"], "")),
        "transactional_id": failed["transactional_id"], "event_time": failed["event_time"]})
    grouped = keyed.group_by(list(REJECTION_SCHEMA.names[:8]), use_threads=False).aggregate(
        [([], "count_all"), ("event_time", "min"), ("event_time", "max")])
    return _ordered(grouped.rename_columns([*REJECTION_SCHEMA.names[:8], "count", "first_time", "last_time"]),
                    REJECTION_SCHEMA)


def latency_bucket(latency: pa.Array) -> pa.Array:
    """`tables.latency_bucket`: ceil(log(v) / log(GAMMA)); ZERO_BUCKET for v <= 0; null for null."""
    positive = pc.greater(latency, 0)
    index = pc.cast(pc.ceil(pc.divide(pc.ln(pc.if_else(positive, latency, 1.0)), math.log(LATENCY_GAMMA))),
                    pa.int32())
    return pc.if_else(positive, index, pa.scalar(ZERO_BUCKET, pa.int32()))


def latency_partials(d: pa.Table) -> pa.Table:
    """`tables.latency_partials`: decisions per day, hour, evidence path and latency bucket."""
    keyed = pa.table({"day": d["day"], "hour": _hour(d["time_ms"]), "evidence": d["evidence"],
                      "bucket": latency_bucket(d["latency_ms"]), "latency_ms": d["latency_ms"]})
    grouped = keyed.group_by(["day", "hour", "evidence", "bucket"], use_threads=False).aggregate(
        [([], "count_all"), ("latency_ms", "sum"), ("latency_ms", "max")])
    return _ordered(grouped.rename_columns(list(LATENCY_SCHEMA.names)), LATENCY_SCHEMA)


def _pre_tv2(api: pa.Array, version: pa.Array) -> pa.Array:
    return pc.or_(pc.and_(pc.equal(api, "produce"), pc.less_equal(version, R.LAST_PRE_TV2_VERSION["produce"])),
                  pc.and_(pc.equal(api, "txn_offset_commit"),
                          pc.less_equal(version, R.LAST_PRE_TV2_VERSION["txn_offset_commit"])))


def _distinct(column: str) -> tuple[str, str, pc.CountOptions]:
    return (column, "distinct", pc.CountOptions(mode="only_valid"))  # collect_set: nulls left out


def inventory_from_decisions(d: pa.Table) -> pa.Table:
    """`tables.inventory_partials`' rows from decisions: one per client (family, name, version) and day."""
    api, version, decision = d["api"], d["api_version"], d["decision"]
    no_int = pa.scalar(None, pa.int32())
    keyed = pa.table({
        **{k: d[k] for k in INVENTORY_KEYS}, "client_id": d["client_id"], "transactional_id": d["transactional_id"],
        "listener": d["listener"], "proxy_id": d["proxy_id"], "event_time": d["event_time"],
        "rejected": pc.cast(pc.equal(decision, "rejected"), pa.int64()),
        "unenforced": pc.cast(pc.equal(decision, "forwarded_unenforced"), pa.int64()),
        "pre_tv2": _pre_tv2(api, version),
        "produce_version": pc.if_else(pc.equal(api, "produce"), pc.cast(version, pa.int32()), no_int),
        "commit_version": pc.if_else(pc.equal(api, "txn_offset_commit"), pc.cast(version, pa.int32()), no_int)})
    g = keyed.group_by(list(INVENTORY_KEYS), use_threads=False).aggregate([
        _distinct("client_id"), _distinct("transactional_id"), _distinct("listener"), _distinct("proxy_id"),
        ("event_time", "min"), ("event_time", "max"), ([], "count_all"), ("rejected", "sum"), ("unenforced", "sum"),
        ("pre_tv2", "any"), _distinct("produce_version"), _distinct("commit_version")])
    n = g.num_rows
    return pa.table({
        **{k: g[k] for k in INVENTORY_KEYS}, "client_ids": g["client_id_distinct"],
        "transactional_ids": g["transactional_id_distinct"], "listeners": g["listener_distinct"],
        "proxy_ids": g["proxy_id_distinct"], "first_seen": g["event_time_min"], "last_seen": g["event_time_max"],
        "connections": pa.array([0] * n, pa.int64()), "decisions": g["count_all"],
        "rejections": pc.fill_null(g["rejected_sum"], 0), "unenforced_rejections": pc.fill_null(g["unenforced_sum"], 0),
        "used_transactions": pa.array([True] * n), "pre_tv2": g["pre_tv2_any"],
        "produce_versions": g["produce_version_distinct"], "txn_offset_commit_versions": g["commit_version_distinct"],
    }).cast(INVENTORY_SCHEMA)


@dataclass
class _Client:
    """One client's connections of one day, as `tables.inventory_partials` aggregates them."""

    client_ids: set[str] = field(default_factory=set)
    transactional_ids: set[str] = field(default_factory=set)
    listeners: set[str] = field(default_factory=set)
    proxy_ids: set[str] = field(default_factory=set)
    first_seen: int | None = None  # microseconds
    last_seen: int | None = None
    connections: int = 0
    used_transactions: bool | None = None  # bool_or: null only when every value is null
    pre_tv2: bool | None = None
    produce_versions: set[int] = field(default_factory=set)
    txn_offset_commit_versions: set[int] = field(default_factory=set)

    def add(self, row: dict[str, Any]) -> None:
        for target, value in ((self.client_ids, row["client_id"]), (self.transactional_ids,
                              row["first_transactional_id"]), (self.listeners, row["listener"]),
                              (self.proxy_ids, row["proxy_id"])):
            if value is not None:
                target.add(value)
        connected, closed = row["connected_time"], row["event_time"]
        if connected is not None and (self.first_seen is None or connected < self.first_seen):
            self.first_seen = connected
        if closed is not None and (self.last_seen is None or closed > self.last_seen):
            self.last_seen = closed
        self.connections += 1
        produce = [v for v in row["produce_versions"] or [] if v is not None]
        commit = [v for v in row["txn_offset_commit_versions"] or [] if v is not None]
        self.produce_versions.update(produce)
        self.txn_offset_commit_versions.update(commit)
        used = row["used_transactions"]
        if used is not None:
            old = used and (any(v <= R.LAST_PRE_TV2_VERSION["produce"] for v in produce)
                            or any(v <= R.LAST_PRE_TV2_VERSION["txn_offset_commit"] for v in commit))
            self.used_transactions = bool(self.used_transactions) or used
            self.pre_tv2 = bool(self.pre_tv2) or old

    def row(self, key: tuple[Any, ...]) -> dict[str, Any]:
        return {**dict(zip(INVENTORY_KEYS, key, strict=True)),
                "client_ids": sorted(self.client_ids), "transactional_ids": sorted(self.transactional_ids),
                "listeners": sorted(self.listeners), "proxy_ids": sorted(self.proxy_ids),
                "first_seen": self.first_seen, "last_seen": self.last_seen, "connections": self.connections,
                "decisions": 0, "rejections": 0, "unenforced_rejections": 0,
                "used_transactions": self.used_transactions, "pre_tv2": self.pre_tv2,
                "produce_versions": sorted(self.produce_versions),
                "txn_offset_commit_versions": sorted(self.txn_offset_commit_versions)}


# INVENTORY_SCHEMA with days and times as the integers `_Client` keeps (cast to dates and timestamps at the end).
_INVENTORY_AS_INTS = pa.schema([pa.field(f.name, pa.int32() if f.name == "day" else pa.int64() if f.type == _TS
                                         else f.type) for f in INVENTORY_SCHEMA])


def inventory_from_connections(c: pa.Table) -> pa.Table:
    """The same from connection records: a few percent of the lines, so plain Python per row. Days and times go
    through as integers: a datetime per row, with its time zone, cost more than all the rest."""
    columns = c.select([*INVENTORY_KEYS, "client_id", "first_transactional_id", "listener", "proxy_id",
                        "connected_time", "event_time", "used_transactions", "produce_versions",
                        "txn_offset_commit_versions"])
    for name, to in (("day", pa.int32()), ("connected_time", pa.int64()), ("event_time", pa.int64())):
        columns = columns.set_column(columns.schema.get_field_index(name), name, pc.cast(columns[name], to))
    clients: dict[tuple[Any, ...], _Client] = {}
    for row in columns.to_pylist():
        key = tuple(row[k] for k in INVENTORY_KEYS)
        client = clients.get(key)
        if client is None:
            client = clients[key] = _Client()
        client.add(row)
    rows = [client.row(key) for key, client in clients.items()]
    return pa.Table.from_pylist(rows, schema=_INVENTORY_AS_INTS).cast(INVENTORY_SCHEMA)


def incidents(d: pa.Table) -> pa.Table:
    """`tables.incidents_prevented`'s rows: each failed decision with what it would have done."""
    failed = _failed(d)
    # Classified once per distinct (outcome, api, decision), not once per row: a few kinds, many rows.
    keys = pa.table({"outcome": failed["outcome"], "api": failed["api"], "decision": failed["decision"]})
    distinct = keys.group_by(["outcome", "api", "decision"], use_threads=False).aggregate([])
    found = [classify(o, a, dec) for o, a, dec in zip(distinct["outcome"].to_pylist(), distinct["api"].to_pylist(),
                                                       distinct["decision"].to_pylist(), strict=True)]
    incident = pa.array([i.name for i in found], pa.string())
    consequence = pa.array([i.consequence for i in found], pa.string())
    # Each row's class, in the rows' order (a join does not keep it): its row number joined, then sorted back. The
    # keys are never null (a decision has its api and decision; a failed one its outcome), so every row matches.
    kind = distinct.append_column("_kind", pa.array(range(len(found)), pa.int32()))
    numbered = keys.append_column("_row", pa.array(range(keys.num_rows), pa.int64()))
    which = numbered.join(kind, ["outcome", "api", "decision"], use_threads=False).sort_by("_row")["_kind"]
    return pa.table({**{c: failed[c] for c in INCIDENT_COLUMNS},
                     "incident": incident.take(which), "consequence": consequence.take(which),
                     "prevented": pc.is_in(failed["decision"], pa.array(list(ACTED)))})


# The decision columns the partials read: a task keeps only these of its rows until its end.
_DECISION_COLUMNS = sorted({"day", "event_time", "time_ms", "outcome", "decision", "client_family", "api", "topic",
                            "group_id", "transactional_id", "evidence", "latency_ms", "client_software_name",
                            "client_software_version", "client_id", "listener", "proxy_id", "api_version"})


# Decision rows a task keeps before it counts them: a bounded share of its memory whatever its input's size (a Kafka
# partition read whole is one task: 5M decisions kept whole took a worker to 2 GB).
KEEP_ROWS = 262_144


class Partials:
    """One task's partial tables: its decisions' columns kept batch after batch and counted every KEEP_ROWS rows
    (and its connections, a few percent of the lines), grouped when the task ends. A key counted in two chunks
    has two partial rows; the merge adds them up like those of two tasks."""

    def __init__(self) -> None:
        self.decisions: list[pa.Table] = []
        self.kept = 0
        self.connections: list[pa.Table] = []  # connections' columns (all of them: few rows)
        self.kept_connections = 0
        self.counted: dict[str, list[pa.Table]] = {"rejections": [], "latency": [], "inventory": []}

    def add_decisions(self, d: pa.Table) -> None:
        self.decisions.append(d.select(_DECISION_COLUMNS))
        self.kept += d.num_rows
        if self.kept >= KEEP_ROWS:
            self._count()

    def add_connections(self, c: pa.Table) -> None:
        self.connections.append(c)
        self.kept_connections += c.num_rows
        if self.kept_connections >= KEEP_ROWS:
            self._count_connections()

    def _count_connections(self) -> None:
        if self.connections:
            self.counted["inventory"].append(inventory_from_connections(pa.concat_tables(self.connections)))
            self.connections, self.kept_connections = [], 0

    def _count(self) -> None:
        if not self.decisions:
            return
        d = pa.concat_tables(self.decisions)
        self.decisions, self.kept = [], 0
        self.counted["rejections"].append(rejection_partials(d))
        self.counted["latency"].append(latency_partials(d))
        self.counted["inventory"].append(inventory_from_decisions(d))

    def tables(self) -> dict[str, pa.Table]:
        self._count()
        self._count_connections()
        return {kind: pa.concat_tables(parts) for kind, parts in self.counted.items() if parts}

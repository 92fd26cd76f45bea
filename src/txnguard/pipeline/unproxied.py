"""The table `unproxied_transactional_ids`: transactional ids active in the cluster's log that no proxy saw.

Every proxy's follower lists the ids active in the coordinator's log (`transaction_log_ids`, one row per id and
round, with whether that proxy saw the id in a request); the proxies' own records name the ids that came through
them. An id is **seen** when any proxy says so: a `transaction_log_id` row with `seen_by_proxy`, a decision, an
end_txn_hold, or a connection whose first transactional id it was. What the log lists and no proxy saw is a client
that reaches the brokers another way: what an operator moving clients behind txnguard has left. A sidecar or a
replica sees a share of the clients; the union over every proxy is what counts, so the fleet's answer holds where
one proxy's gauge cannot.

One row per unseen id: its latest state in the log and the coordinator's time of it (`last_activity`), its producer
id and epoch then, which proxies' followers listed it and when last, and how many ids the last round that listed it
left out past its cap (0: the round was whole). Computed in the driver with Arrow from the raw tables, reading only
the transactional id columns, and only when some round listed an unseen id.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

NAME = "unproxied_transactional_ids"
_TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([
    pa.field("day", pa.date32()),                 # the UTC day of `last_activity` (every table's partition column)
    pa.field("transactional_id", pa.string()),
    pa.field("coordinator_state", pa.string()),
    pa.field("last_activity", _TS),              # the coordinator's time of the id's latest record
    pa.field("last_update_ms", pa.int64()),
    pa.field("producer_id", pa.int64()),
    pa.field("producer_epoch", pa.int32()),
    pa.field("reported_by", pa.list_(pa.string())),  # the proxies whose followers listed it, sorted
    pa.field("last_reported", _TS),
    pa.field("omitted_ids", pa.int64()),
])
_LOG_COLUMNS = ["time_ms", "proxy_id", "transactional_id", "producer_id", "producer_epoch", "coordinator_state",
                "last_update_ms", "seen_by_proxy", "omitted_ids"]
# Where each other raw table names the transactional ids that came through a proxy.
SEEN_IN = {"decisions": "transactional_id", "end_txn_holds": "transactional_id",
           "connections": "first_transactional_id"}
_DAY_MS = 86_400_000


def unproxied(log_ids: pa.Table, seen_elsewhere: pa.Array) -> pa.Table:
    """The table from the `transaction_log_ids` rows (at least `_LOG_COLUMNS`) and the ids the other tables name."""
    if not log_ids.num_rows:
        return SCHEMA.empty_table()
    seen_by_a_follower = pc.filter(log_ids["transactional_id"], pc.fill_null(log_ids["seen_by_proxy"], False))
    seen = pc.unique(pa.concat_arrays([_array(seen_by_a_follower), _array(seen_elsewhere).cast(pa.string())]))
    rows = log_ids.filter(pc.invert(pc.is_in(log_ids["transactional_id"], value_set=seen)))
    latest: dict[str, dict[str, Any]] = {}
    reporters: dict[str, set[str]] = {}
    reported: dict[str, int] = {}
    # The latest state by the coordinator's own time; the latest round breaks a tie (and gives the omitted count).
    for r in sorted(rows.select(_LOG_COLUMNS).to_pylist(), key=lambda r: (r["last_update_ms"], r["time_ms"])):
        txn_id = r["transactional_id"]
        latest[txn_id] = r
        reporters.setdefault(txn_id, set()).add(r["proxy_id"])
        reported[txn_id] = max(reported.get(txn_id, r["time_ms"]), r["time_ms"])
    ordered = sorted(latest.values(), key=lambda r: (-r["last_update_ms"], r["transactional_id"]))

    def column(name: str, type_: pa.DataType) -> pa.Array:
        return pa.array([r[name] for r in ordered], type_)

    return pa.table({
        "day": pa.array([r["last_update_ms"] // _DAY_MS for r in ordered], pa.int32()).cast(pa.date32()),
        "transactional_id": column("transactional_id", pa.string()),
        "coordinator_state": column("coordinator_state", pa.string()),
        "last_activity": _time([r["last_update_ms"] for r in ordered]),
        "last_update_ms": column("last_update_ms", pa.int64()),
        "producer_id": column("producer_id", pa.int64()),
        "producer_epoch": column("producer_epoch", pa.int32()),
        "reported_by": pa.array([sorted(reporters[r["transactional_id"]]) for r in ordered], pa.list_(pa.string())),
        "last_reported": _time([reported[r["transactional_id"]] for r in ordered]),
        "omitted_ids": column("omitted_ids", pa.int64()),
    }, schema=SCHEMA)


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _time(ms: list[int]) -> pa.Array:
    return pc.cast(pc.multiply(pa.array(ms, pa.int64()), 1000), _TS)


def _dataset(folder: str) -> ds.Dataset | None:
    """A raw table as the ingest or a --follow sink wrote it (hive `day=` folders), or None without a file."""
    if not os.path.isdir(folder) or not any(p.endswith(".parquet") for _, _, files in os.walk(folder) for p in files):
        return None
    return ds.dataset(folder, format="parquet", partitioning="hive")


def _window(time_column: str, since_ms: int | None, until_ms: int | None) -> pc.Expression | None:
    """since <= time < until, as `tables.window` keeps records (either bound optional)."""
    t = pc.field(time_column)
    found: pc.Expression | None = None
    if since_ms is not None:
        found = t >= pa.scalar(since_ms * 1000, _TS)
    if until_ms is not None:
        before = t < pa.scalar(until_ms * 1000, _TS)
        found = before if found is None else found & before
    return found


def from_tables(out: str, since_ms: int | None = None, until_ms: int | None = None) -> pa.Table:
    """The table from the raw tables under `out` (within --since/--until by each record's time). The other tables
    are read only for the ids some round listed unseen, and only their transactional id column."""
    log = _dataset(os.path.join(out, "transaction_log_ids"))
    if log is None:
        return SCHEMA.empty_table()
    log_ids = log.to_table(columns=_LOG_COLUMNS, filter=_window("event_time", since_ms, until_ms))
    candidates = pc.unique(pc.filter(log_ids["transactional_id"],
                                     pc.invert(pc.fill_null(log_ids["seen_by_proxy"], False))))
    if not len(candidates):
        return SCHEMA.empty_table()
    named: list[pa.Array] = []
    for name, column in SEEN_IN.items():
        table = _dataset(os.path.join(out, name))
        if table is None:
            continue
        wanted = pc.field(column).isin(candidates)
        window = _window("event_time", since_ms, until_ms)
        got = table.to_table(columns=[column], filter=wanted if window is None else wanted & window)
        named.append(_array(got[column]))
    return unproxied(log_ids, pa.concat_arrays(named) if named else pa.array([], pa.string()))

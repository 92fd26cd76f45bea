"""The output tables, each a function of the routed records (or of the tables before it).

Times are UTC (the session's time zone is set to UTC); `day` is the partition column of every table.
`decisions`, `connections` and `quarantine` hold one row per input record; the others are aggregates
recomputed from `decisions` and `connections`, so a streaming run can refresh them at any time.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from txnguard.pipeline import records as R
from txnguard.pipeline.incidents import ANY_API, INCIDENTS, UNCLASSIFIED
from txnguard.pipeline.parse import CONNECTION, DECISION, END_TXN_HOLD, HANGING, QUARANTINE

DECISION_FIELDS = [name for name, _, _ in R.DECISION_V1 if name != "schema_version"]
CONNECTION_FIELDS = [name for name, _, _ in R.CONNECTION_V2 if name not in ("schema_version", "kind", "proxy_id")]
HANGING_FIELDS = [name for name, _, _ in R.HANGING_V2 if name not in ("schema_version", "kind", "proxy_id")]
END_TXN_HOLD_FIELDS = [name for name, _, _ in R.END_TXN_HOLD_V2 if name not in ("schema_version", "kind", "proxy_id")]
QUARANTINE_PREFIX_CHARS = 1024
LATENCY_ACCURACY = 10_000  # percentile_approx: relative error 1/10,000


def _day(time_ms: Column) -> Column:
    return F.to_date(F.timestamp_millis(time_ms))


def _pre_tv2(api: Column, version: Column) -> Column:
    return ((api == "produce") & (version <= R.LAST_PRE_TV2_VERSION["produce"])) | \
        ((api == "txn_offset_commit") & (version <= R.LAST_PRE_TV2_VERSION["txn_offset_commit"]))


def _decision_columns() -> dict[str, Column]:
    target = F.col("target")
    is_group = target.startswith("group:")
    return {
        "day": _day(F.col("time_ms")),
        "event_time": F.timestamp_millis(F.col("time_ms")),
        "schema_version": F.col("schema_version"),
        "proxy_id": F.col("proxy_id"),
        **{n: F.col(n) for n in DECISION_FIELDS},
        "topic": F.when(~is_group, F.regexp_extract(target, r"^(.*)-\d+$", 1)),
        "partition": F.when(~is_group, F.regexp_extract(target, r"-(\d+)$", 1).cast("int")),
        "group_id": F.when(is_group, F.substring(target, 7, 1 << 20)),
        "source": F.col("source"),
    }


def _connection_columns() -> dict[str, Column]:
    return {
        "day": _day(F.col("time_ms")),
        "event_time": F.timestamp_millis(F.col("time_ms")),
        "connected_time": F.timestamp_millis(F.col("connected_ms")),
        "proxy_id": F.col("proxy_id"),
        **{n: F.col(n) for n in CONNECTION_FIELDS},
        "source": F.col("source"),
    }


def _quarantine_columns() -> dict[str, Column]:
    return {
        "day": F.current_date(),
        "ingested_at": F.current_timestamp(),
        "source": F.col("source"),
        "reason": F.col("quarantine_reason"),
        "reason_kind": F.regexp_extract(F.col("quarantine_reason"), r"^([a-z_]+)", 1),
        "chars": F.col("chars"),
        "line_prefix": F.substring(F.col("value"), 1, QUARANTINE_PREFIX_CHARS),
    }


def _hanging_columns() -> dict[str, Column]:
    return {
        "day": _day(F.col("time_ms")),
        "event_time": F.timestamp_millis(F.col("time_ms")),
        "proxy_id": F.col("proxy_id"),
        **{n: F.col(n) for n in HANGING_FIELDS},
        "last_write_time": F.timestamp_millis(F.col("last_timestamp_ms")),
        "source": F.col("source"),
    }


def _end_txn_hold_columns() -> dict[str, Column]:
    return {
        "day": _day(F.col("time_ms")),
        "event_time": F.timestamp_millis(F.col("time_ms")),
        "proxy_id": F.col("proxy_id"),
        **{n: F.col(n) for n in END_TXN_HOLD_FIELDS},
        "in_doubt_count": F.size(F.col("end_txns_in_doubt")),
        "source": F.col("source"),
    }


# Each raw table: the route its rows come from and its columns (expressions over the routed frame).
RAW: dict[str, tuple[str, Callable[[], dict[str, Column]]]] = {
    "decisions": (DECISION, _decision_columns),
    "connections": (CONNECTION, _connection_columns),
    "quarantine": (QUARANTINE, _quarantine_columns),
    "hanging_transactions": (HANGING, _hanging_columns),
    "end_txn_holds": (END_TXN_HOLD, _end_txn_hold_columns),
}
TABLE = "table"  # the partition column of `all_raw`: which table a row belongs to


def raw_table(routed: DataFrame, name: str) -> DataFrame:
    route, columns = RAW[name]
    return routed.where(F.col("route") == route).select(*[c.alias(n) for n, c in columns().items()])


def decisions(routed: DataFrame) -> DataFrame:
    """One row per verification decision (v1 and v2), with the target split into topic/partition or group."""
    return raw_table(routed, "decisions")


def connections(routed: DataFrame) -> DataFrame:
    """One row per client connection record (schema v2)."""
    return raw_table(routed, "connections")


def quarantine(routed: DataFrame) -> DataFrame:
    """Lines that are not a supported record: the reason, where from, and the start of the line."""
    return raw_table(routed, "quarantine")


def hanging_transactions(routed: DataFrame) -> DataFrame:
    """One row per hanging transaction a proxy's scan found (schema v2, `kind: hanging`), as the proxy judged it."""
    return raw_table(routed, "hanging_transactions")


def end_txn_holds(routed: DataFrame) -> DataFrame:
    """One row per request held while an EndTxn of its producer was in doubt (KAFKA-17754; `kind: end_txn_hold`):
    how the hold ended (settled, fenced, timeout), how long it held, what the client got."""
    return raw_table(routed, "end_txn_holds")


def all_raw(routed: DataFrame) -> DataFrame:
    """Every raw table in one frame, for one write partitioned by `table` and `day`: each line is read and parsed
    once, with no cache and no filter (a filter per table would re-scan the input or a cache of it).

    A column is the union of the tables' columns by name (the same name has the same type in every table that
    has it); in a row it holds its own table's value, null where its table has no such column.
    """
    route = F.col("route")
    per_table = {name: (r, fn()) for name, (r, fn) in RAW.items()}
    names: list[str] = []
    for _, cols in per_table.values():
        names += [n for n in cols if n not in names]
    table = F.coalesce(*[F.when(route == r, F.lit(name)) for name, (r, _) in per_table.items()])

    def merged(col: str) -> Column:
        branches = [(r, cols[col]) for r, cols in per_table.values() if col in cols]
        expr = F.when(route == branches[0][0], branches[0][1])
        for r, c in branches[1:]:
            expr = expr.when(route == r, c)
        return expr.alias(col)

    return routed.select(table.alias(TABLE), *[merged(n) for n in names])


def window(frame: DataFrame, since_ms: int | None, until_ms: int | None) -> DataFrame:
    """Keep records with since <= time < until (either bound optional)."""
    t = F.unix_millis(F.col("event_time"))
    if since_ms is not None:
        frame = frame.where(t >= since_ms)
    if until_ms is not None:
        frame = frame.where(t < until_ms)
    return frame


def _failed(decisions_: DataFrame) -> DataFrame:
    return decisions_.where(F.col("outcome") != "pass")


def rejections(decisions_: DataFrame) -> DataFrame:
    """Failed verifications (rejected, or forwarded in monitor mode) by reason, family, topic, id and hour."""
    return (
        _failed(decisions_)
        .groupBy(
            "day", F.date_trunc("hour", "event_time").alias("hour"), F.col("outcome").alias("reason"), "decision",
            "client_family", "api", F.coalesce(F.col("topic"), F.concat(F.lit("group:"), F.col("group_id")))
            .alias("topic"), "transactional_id")
        .agg(F.count(F.lit(1)).alias("count"), F.min("event_time").alias("first_time"),
             F.max("event_time").alias("last_time"))
    )


def verification_latency(decisions_: DataFrame) -> DataFrame:
    """VerificationTimeMs percentiles per evidence path and hour."""
    pct = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], LATENCY_ACCURACY)
    return (
        decisions_.groupBy("day", F.date_trunc("hour", "event_time").alias("hour"), "evidence")
        .agg(F.count(F.lit(1)).alias("count"), pct.alias("p"), F.max("latency_ms").alias("max_ms"),
             F.avg("latency_ms").alias("mean_ms"))
        .select("day", "hour", "evidence", "count", F.col("p")[0].alias("p50_ms"), F.col("p")[1].alias("p95_ms"),
                F.col("p")[2].alias("p99_ms"), "max_ms", "mean_ms")
    )


def _incident_map(field: str) -> Column:
    entries = {f"{outcome}|{api}": getattr(incident, field) for (outcome, api), incident in INCIDENTS.items()}
    return F.create_map(*[F.lit(x) for x in chain.from_iterable(entries.items())])


def incidents_prevented(decisions_: DataFrame) -> DataFrame:
    """Each failed verification, classified by what it would have done (`prevented` false in monitor mode)."""
    def lookup(field: str) -> Column:
        m = _incident_map(field)
        exact = m[F.concat_ws("|", F.col("outcome"), F.col("api"))]
        general = m[F.concat_ws("|", F.col("outcome"), F.lit(ANY_API))]
        return F.coalesce(exact, general, F.lit(getattr(UNCLASSIFIED, field)))

    return _failed(decisions_).select(
        "day", "event_time", "proxy_id", "transactional_id", "producer_id", "producer_epoch", "api", "api_version",
        "target", "topic", "group_id", "client_family", "client_software_name", "client_software_version",
        "outcome", "evidence", "reason", "decision", "error_name",
        lookup("name").alias("incident"), lookup("consequence").alias("consequence"),
        (F.col("decision") == "rejected").alias("prevented"),
    )


def client_inventory(decisions_: DataFrame, connections_: DataFrame) -> DataFrame:
    """Every client (family, software name and version) seen per day, from its connections and its decisions."""
    from_decisions = decisions_.select(
        "day", "client_family", "client_software_name", "client_software_version", "client_id",
        "transactional_id", "listener", "proxy_id", F.col("event_time").alias("first_seen"),
        F.col("event_time").alias("last_seen"), F.lit(0).alias("connection"), F.lit(1).alias("decision_"),
        (F.col("decision") == "rejected").cast("int").alias("rejected"),
        (F.col("decision") == "forwarded_unenforced").cast("int").alias("unenforced"),
        F.lit(True).alias("used_transactions"), _pre_tv2(F.col("api"), F.col("api_version")).alias("pre_tv2"),
        F.when(F.col("api") == "produce", F.array(F.col("api_version"))).otherwise(F.array().cast("array<int>"))
        .alias("produce_versions"),
        F.when(F.col("api") == "txn_offset_commit", F.array(F.col("api_version")))
        .otherwise(F.array().cast("array<int>")).alias("txn_offset_commit_versions"),
    )
    old_produce = F.exists("produce_versions", lambda v: v <= R.LAST_PRE_TV2_VERSION["produce"])
    old_commit = F.exists("txn_offset_commit_versions", lambda v: v <= R.LAST_PRE_TV2_VERSION["txn_offset_commit"])
    from_connections = connections_.select(
        "day", "client_family", "client_software_name", "client_software_version", "client_id",
        F.col("first_transactional_id").alias("transactional_id"), "listener", "proxy_id",
        F.col("connected_time").alias("first_seen"), F.col("event_time").alias("last_seen"),
        F.lit(1).alias("connection"), F.lit(0).alias("decision_"), F.lit(0).alias("rejected"),
        F.lit(0).alias("unenforced"), "used_transactions",
        (F.col("used_transactions") & (old_produce | old_commit)).alias("pre_tv2"),
        "produce_versions", "txn_offset_commit_versions",
    )
    both = from_decisions.unionByName(from_connections)

    def sorted_set(col: str, limit: int = 100) -> Column:
        return F.slice(F.array_sort(F.collect_set(col)), 1, limit)

    return (
        both.groupBy("day", "client_family", "client_software_name", "client_software_version")
        .agg(sorted_set("client_id").alias("client_ids"),
             sorted_set("transactional_id").alias("transactional_ids"),
             F.approx_count_distinct("transactional_id").alias("transactional_id_count"),
             sorted_set("listener").alias("listeners"), sorted_set("proxy_id").alias("proxy_ids"),
             F.min("first_seen").alias("first_seen"), F.max("last_seen").alias("last_seen"),
             F.sum("connection").alias("connections"), F.sum("decision_").alias("decisions"),
             F.sum("rejected").alias("rejections"), F.sum("unenforced").alias("unenforced_rejections"),
             F.bool_or("used_transactions").alias("used_transactions"), F.bool_or("pre_tv2").alias("pre_tv2"),
             F.array_sort(F.array_distinct(F.flatten(F.collect_set("produce_versions")))).alias("produce_versions"),
             F.array_sort(F.array_distinct(F.flatten(F.collect_set("txn_offset_commit_versions"))))
             .alias("txn_offset_commit_versions"))
    )

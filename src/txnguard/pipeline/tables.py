"""The output tables, each a function of the routed records (or of the tables before it).

Times are UTC (the session's time zone is set to UTC); `day` is the partition column of every table.
`decisions`, `connections` and `quarantine` hold one row per input record; the others are aggregates
recomputed from `decisions` and `connections`, so a streaming run can refresh them at any time.
"""

from __future__ import annotations

from itertools import chain

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from txnguard.pipeline import arrow_tables
from txnguard.pipeline import records as R
from txnguard.pipeline.incidents import ACTED, ANY_API, BY_DECISION, INCIDENTS, UNCLASSIFIED

QUARANTINE_PREFIX_CHARS = arrow_tables.QUARANTINE_PREFIX_CHARS
LATENCY_ACCURACY = 10_000  # percentile_approx: relative error 1/10,000
TABLE = arrow_tables.TABLE  # the partition column of `parse.raw`'s frame: which table a row belongs to
RAW = list(arrow_tables.RAW)  # the raw tables, their columns computed with Arrow (`arrow_tables`)


def _pre_tv2(api: Column, version: Column) -> Column:
    return ((api == "produce") & (version <= R.LAST_PRE_TV2_VERSION["produce"])) | \
        ((api == "txn_offset_commit") & (version <= R.LAST_PRE_TV2_VERSION["txn_offset_commit"]))


def raw_table(raw: DataFrame, name: str) -> DataFrame:
    """One raw table's rows and columns out of `parse.raw`'s frame."""
    return raw.where(F.col(TABLE) == name).select(*arrow_tables.SCHEMAS[name].names)


def decisions(raw: DataFrame) -> DataFrame:
    """One row per verification decision (v1 and v2), with the target split into topic/partition or group."""
    return raw_table(raw, "decisions")


def connections(raw: DataFrame) -> DataFrame:
    """One row per client connection record (schema v2)."""
    return raw_table(raw, "connections")


def quarantine(raw: DataFrame) -> DataFrame:
    """Lines that are not a supported record: the reason, where from, and the start of the line."""
    return raw_table(raw, "quarantine")


def hanging_transactions(raw: DataFrame) -> DataFrame:
    """One row per hanging transaction a proxy's scan found (schema v2, `kind: hanging`), as the proxy judged it."""
    return raw_table(raw, "hanging_transactions")


def end_txn_holds(raw: DataFrame) -> DataFrame:
    """One row per request held while an EndTxn of its producer was in doubt (KAFKA-17754; `kind: end_txn_hold`):
    how the hold ended (settled, fenced, timeout), how long it held, what the client got."""
    return raw_table(raw, "end_txn_holds")


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
    entries |= {f"decision|{decision}": getattr(incident, field) for decision, incident in BY_DECISION.items()}
    return F.create_map(*[F.lit(x) for x in chain.from_iterable(entries.items())])


def incidents_prevented(decisions_: DataFrame) -> DataFrame:
    """Each failed verification, classified by what it would have done (`prevented` false in monitor mode), as
    `incidents.classify` does: by the decision first (a KIP-588 timeout recovery), then the outcome and API."""
    def lookup(field: str) -> Column:
        m = _incident_map(field)
        by_decision = m[F.concat_ws("|", F.lit("decision"), F.col("decision"))]
        exact = m[F.concat_ws("|", F.col("outcome"), F.col("api"))]
        general = m[F.concat_ws("|", F.col("outcome"), F.lit(ANY_API))]
        return F.coalesce(by_decision, exact, general, F.lit(getattr(UNCLASSIFIED, field)))

    return _failed(decisions_).select(
        "day", "event_time", "proxy_id", "transactional_id", "producer_id", "producer_epoch", "api", "api_version",
        "target", "topic", "group_id", "client_family", "client_software_name", "client_software_version",
        "outcome", "evidence", "reason", "decision", "error_name",
        lookup("name").alias("incident"), lookup("consequence").alias("consequence"),
        F.col("decision").isin(*ACTED).alias("prevented"),
    )


def client_inventory(decisions_: DataFrame, connections_: DataFrame) -> DataFrame:
    """Every client (family, software name and version) seen per day, from its connections and its decisions.

    Decisions and connections are each aggregated per client and day first (one row per client and day each,
    sets instead of rows), then merged: no per-decision row of arrays to union, and the sets are built once.
    """
    keys = ["day", "client_family", "client_software_name", "client_software_version"]
    old_produce = F.exists("produce_versions", lambda v: v <= R.LAST_PRE_TV2_VERSION["produce"])
    old_commit = F.exists("txn_offset_commit_versions", lambda v: v <= R.LAST_PRE_TV2_VERSION["txn_offset_commit"])
    api, version, decision = F.col("api"), F.col("api_version"), F.col("decision")
    from_decisions = decisions_.groupBy(*keys).agg(
        F.collect_set("client_id").alias("client_ids"), F.collect_set("transactional_id").alias("transactional_ids"),
        F.collect_set("listener").alias("listeners"), F.collect_set("proxy_id").alias("proxy_ids"),
        F.min("event_time").alias("first_seen"), F.max("event_time").alias("last_seen"),
        F.lit(0).cast("long").alias("connections"), F.count(F.lit(1)).alias("decisions"),
        F.count(F.when(decision == "rejected", 1)).alias("rejections"),
        F.count(F.when(decision == "forwarded_unenforced", 1)).alias("unenforced_rejections"),
        F.lit(True).alias("used_transactions"), F.bool_or(_pre_tv2(api, version)).alias("pre_tv2"),
        F.collect_set(F.when(api == "produce", version)).alias("produce_versions"),
        F.collect_set(F.when(api == "txn_offset_commit", version)).alias("txn_offset_commit_versions"),
    )
    from_connections = connections_.groupBy(*keys).agg(
        F.collect_set("client_id").alias("client_ids"),
        F.collect_set("first_transactional_id").alias("transactional_ids"),
        F.collect_set("listener").alias("listeners"), F.collect_set("proxy_id").alias("proxy_ids"),
        F.min("connected_time").alias("first_seen"), F.max("event_time").alias("last_seen"),
        F.count(F.lit(1)).alias("connections"), F.lit(0).cast("long").alias("decisions"),
        F.lit(0).cast("long").alias("rejections"), F.lit(0).cast("long").alias("unenforced_rejections"),
        F.bool_or("used_transactions").alias("used_transactions"),
        F.bool_or(F.col("used_transactions") & (old_produce | old_commit)).alias("pre_tv2"),
        F.array_distinct(F.flatten(F.collect_set("produce_versions"))).alias("produce_versions"),
        F.array_distinct(F.flatten(F.collect_set("txn_offset_commit_versions"))).alias("txn_offset_commit_versions"),
    )

    def merged(col: str) -> Column:
        return F.array_distinct(F.flatten(F.collect_list(col)))

    def first_sorted(col: str, limit: int = 100) -> Column:
        return F.slice(F.array_sort(merged(col)), 1, limit)

    return (
        from_decisions.unionByName(from_connections).groupBy(*keys)
        .agg(first_sorted("client_ids").alias("client_ids"),
             first_sorted("transactional_ids").alias("transactional_ids"),
             F.size(merged("transactional_ids")).cast("long").alias("transactional_id_count"),
             first_sorted("listeners").alias("listeners"), first_sorted("proxy_ids").alias("proxy_ids"),
             F.min("first_seen").alias("first_seen"), F.max("last_seen").alias("last_seen"),
             F.sum("connections").alias("connections"), F.sum("decisions").alias("decisions"),
             F.sum("rejections").alias("rejections"), F.sum("unenforced_rejections").alias("unenforced_rejections"),
             F.bool_or("used_transactions").alias("used_transactions"), F.bool_or("pre_tv2").alias("pre_tv2"),
             F.array_sort(merged("produce_versions")).alias("produce_versions"),
             F.array_sort(merged("txn_offset_commit_versions")).alias("txn_offset_commit_versions"))
    )

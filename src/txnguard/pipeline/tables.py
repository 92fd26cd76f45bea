"""The output tables, each a function of the routed records (or of the tables before it).

Times are UTC (the session's time zone is set to UTC); `day` is the partition column of every table.
`decisions`, `connections` and `quarantine` hold one row per input record; the others are aggregates
recomputed from `decisions` and `connections`, so a streaming run can refresh them at any time.
"""

from __future__ import annotations

import math
from itertools import chain

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from txnguard.pipeline import arrow_aggregates, arrow_tables
from txnguard.pipeline import records as R
from txnguard.pipeline.incidents import ACTED, ANY_API, BY_DECISION, INCIDENTS, UNCLASSIFIED

QUARANTINE_PREFIX_CHARS = arrow_tables.QUARANTINE_PREFIX_CHARS
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


def transaction_log_ids(raw: DataFrame) -> DataFrame:
    """One row per transactional id active in the coordinator's log, per round of a proxy's records
    (`kind: transaction_log_id`): its latest state, the coordinator's time of it, and whether that proxy saw it."""
    return raw_table(raw, "transaction_log_ids")


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


REJECTION_KEYS = ("day", "hour", "reason", "decision", "client_family", "api", "topic", "transactional_id")


def rejection_partials(decisions_: DataFrame) -> DataFrame:
    """`rejections` before the merge: failed verifications counted per key (the ingest's tasks make the same rows
    with Arrow, `arrow_aggregates.rejection_partials`; `rejections_from` merges either)."""
    return (
        _failed(decisions_)
        .groupBy(
            "day", F.date_trunc("hour", "event_time").alias("hour"), F.col("outcome").alias("reason"), "decision",
            "client_family", "api", F.coalesce(F.col("topic"), F.concat(F.lit("group:"), F.col("group_id")))
            .alias("topic"), "transactional_id")
        .agg(F.count(F.lit(1)).alias("count"), F.min("event_time").alias("first_time"),
             F.max("event_time").alias("last_time"))
    )


def rejections_from(partials: DataFrame) -> DataFrame:
    """Failed verifications (rejected, or forwarded in monitor mode) by reason, family, topic, id and hour."""
    return partials.groupBy(*REJECTION_KEYS).agg(F.sum("count").alias("count"), F.min("first_time").alias("first_time"),
                                                 F.max("last_time").alias("last_time"))


def rejections(decisions_: DataFrame) -> DataFrame:
    return rejections_from(rejection_partials(decisions_))


# VerificationTimeMs percentiles come from a histogram that merges: each latency falls in the bucket
# ceil(log(v) / log(GAMMA)), whose middle value 2 * GAMMA**i / (GAMMA + 1) is within (GAMMA - 1) / (GAMMA + 1) =
# 0.5% of every value in it (DDSketch's idea). Tasks and hours merge by adding counts, so the percentiles of any
# span (an hour, the whole run, a --since window) come from the same table, and no task ever holds every value.
# One definition for the Arrow side and this one.
LATENCY_GAMMA, ZERO_BUCKET = arrow_aggregates.LATENCY_GAMMA, arrow_aggregates.ZERO_BUCKET
LATENCY_RELATIVE_ERROR = (LATENCY_GAMMA - 1) / (LATENCY_GAMMA + 1)
LATENCY_KEYS = ("day", "hour", "evidence")
PERCENTILES = arrow_aggregates.PERCENTILES


def latency_bucket(latency: Column) -> Column:
    return (F.when(latency > 0, F.ceil(F.log(latency) / math.log(LATENCY_GAMMA)).cast("int"))
            .when(latency.isNotNull(), F.lit(ZERO_BUCKET)))


def bucket_value(bucket: Column) -> Column:
    """The middle of a bucket: the value a percentile in it reads as."""
    return (F.when(bucket == ZERO_BUCKET, F.lit(0.0))
            .otherwise(F.pow(F.lit(LATENCY_GAMMA), bucket) * (2 / (LATENCY_GAMMA + 1))))


def latency_partials(decisions_: DataFrame) -> DataFrame:
    """Decisions per day, hour, evidence path and latency bucket: count, sum and max of the latencies (the ingest's
    tasks make the same rows with Arrow, `arrow_aggregates.latency_partials`)."""
    return (decisions_.groupBy("day", F.date_trunc("hour", "event_time").alias("hour"), "evidence",
                               latency_bucket(F.col("latency_ms")).alias("bucket"))
            .agg(F.count(F.lit(1)).alias("count"), F.sum("latency_ms").alias("sum_ms"),
                 F.max("latency_ms").alias("max_ms")))


def latency_buckets(partials: DataFrame) -> DataFrame:
    """The table `verification_latency_buckets`: the partials merged, one row per day, hour, path and bucket."""
    return partials.groupBy(*LATENCY_KEYS, "bucket").agg(F.sum("count").alias("count"), F.sum("sum_ms").alias("sum_ms"),
                                                         F.max("max_ms").alias("max_ms"))


def latency_summary(buckets: DataFrame, *keys: str) -> DataFrame:
    """count, p50/p95/p99 (exact percentiles, interpolated, of the bucketed values: within 0.5%), max, mean per key."""
    bucket = F.col("bucket")
    pct = F.percentile(bucket_value(bucket), list(PERCENTILES), F.col("count"))
    timed = F.when(bucket.isNotNull(), F.col("count"))
    return (buckets.groupBy(*keys)
            .agg(F.sum("count").alias("count"), pct.alias("p"), F.max("max_ms").alias("max_ms"),
                 (F.sum("sum_ms") / F.sum(timed)).alias("mean_ms"))
            .select(*keys, "count", F.col("p")[0].alias("p50_ms"), F.col("p")[1].alias("p95_ms"),
                    F.col("p")[2].alias("p99_ms"), "max_ms", "mean_ms"))


def verification_latency(buckets: DataFrame) -> DataFrame:
    """VerificationTimeMs percentiles per evidence path and hour, from `verification_latency_buckets`."""
    return latency_summary(buckets, *LATENCY_KEYS)


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


INVENTORY_KEYS = arrow_aggregates.INVENTORY_KEYS


def inventory_partials(decisions_: DataFrame, connections_: DataFrame) -> DataFrame:
    """`client_inventory` before the merge: decisions and connections each aggregated per client and day (sets
    instead of rows). The ingest's tasks make the same rows with Arrow (`arrow_aggregates.inventory_partials`)."""
    keys = list(INVENTORY_KEYS)
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
    return from_decisions.unionByName(from_connections)


def inventory_from(partials: DataFrame) -> DataFrame:
    """Every client (family, software name and version) seen per day, from its connections and its decisions."""
    def merged(col: str) -> Column:
        return F.array_distinct(F.flatten(F.collect_list(col)))

    def first_sorted(col: str, limit: int = arrow_aggregates.INVENTORY_FIRST) -> Column:
        return F.slice(F.array_sort(merged(col)), 1, limit)

    return (
        partials.groupBy(*INVENTORY_KEYS)
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


def client_inventory(decisions_: DataFrame, connections_: DataFrame) -> DataFrame:
    return inventory_from(inventory_partials(decisions_, connections_))

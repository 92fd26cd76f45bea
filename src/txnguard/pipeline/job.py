"""The report job: batch (`run_batch`) or Structured Streaming (`run_follow`), then the aggregates and the page.

Stages, each timed:
  ingest     one pass: a local JSONL input split into byte ranges the tasks read themselves (`ranges`; any other
             source through Spark's reader), each task parsing with Arrow and writing its rows of decisions /
             connections / quarantine / hanging_transactions / end_txn_holds / transaction_log_ids and
             incidents_prevented as Parquet, plus its partial aggregates (`arrow_aggregates`)
  aggregate  rejections, verification_latency(_buckets), client_inventory: the tasks' partials merged (a window
             or --follow: made from the tables instead), each its own stage; unproxied_transactional_ids
             (`unproxied`: in the driver with Arrow, from the raw tables)
  collect    the report's queries over the tables, side by side
  report     plot, write report.html
In --follow the ingest stage is three streaming queries with Parquet file sinks and checkpoints (Spark's
exactly-once sink: a restarted query re-runs an uncommitted batch and the sink's log keeps only one
copy), and aggregate + report rerun every --refresh-seconds from what the sinks committed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from txnguard.pipeline import (
    arrow_aggregates,
    arrow_tables,
    local_merge,
    parse,
    ranges,
    report,
    spark_session,
    tables,
    unproxied,
)
from txnguard.pipeline.schema import from_arrow_schema

RAW_TABLES: dict[str, Callable[[DataFrame], DataFrame]] = {
    "decisions": tables.decisions, "connections": tables.connections, "quarantine": tables.quarantine,
    "hanging_transactions": tables.hanging_transactions, "end_txn_holds": tables.end_txn_holds,
    "transaction_log_ids": tables.transaction_log_ids,
}

log = structlog.get_logger("txnguard.pipeline")


@dataclass(frozen=True)
class Source:
    kind: str                 # "jsonl" or "kafka"
    location: str             # a path, or bootstrap servers
    topic: str | None = None

    @classmethod
    def parse(cls, text: str) -> Source:
        kind, sep, rest = text.partition(":")
        if sep and kind == "jsonl" and rest:
            return cls("jsonl", rest)
        if sep and kind == "kafka":
            bootstrap, _, topic = rest.rpartition("/")
            if bootstrap and topic:
                return cls("kafka", bootstrap, topic)
        raise ValueError(f"--source must be jsonl:PATH or kafka:BOOTSTRAP/TOPIC, not {text!r}")


@dataclass
class Summary:
    """What a run did: rows per table and seconds per stage.

    `cpu_probe`, when given, reads a CPU-time clock (the benchmark passes the Spark JVM's): each stage's CPU
    seconds then land in `cpu_seconds`, a figure a loaded machine's scheduler does not stretch like wall time.
    """

    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    cpu_probe: Callable[[], float] | None = None


def _kafka_reader(spark: SparkSession, source: Source, streaming: bool) -> Any:
    reader = spark.readStream if streaming else spark.read
    r = (reader.format("kafka").option("kafka.bootstrap.servers", source.location)
         .option("subscribe", source.topic).option("startingOffsets", "earliest")
         .option("failOnDataLoss", "false"))
    if streaming:
        return r
    # More tasks than topic partitions (Spark splits their offset ranges): both cores busy with a 1-partition topic,
    # and each task's memory bounded by its share of the records, not by a whole partition's.
    return r.option("endingOffsets", "latest").option("minPartitions", str(spark.sparkContext.defaultParallelism * 4))


def read_lines(spark: SparkSession, source: Source) -> DataFrame:
    if source.kind == "jsonl":
        return parse.jsonl_lines(spark, source.location)
    return parse.kafka_lines(_kafka_reader(spark, source, streaming=False).load())


_SCHEMAS: dict[str, T.StructType] = {}


def raw_table_schemas(spark: SparkSession) -> dict[str, T.StructType]:
    """Each raw table's schema, from the transformations themselves (an empty input is still typed).

    Tables are always read with their schema: an empty table (or a streaming sink before its first
    commit) has no file Spark could infer one from.
    """
    return {name: schema for name, schema in table_schemas(spark).items() if name in RAW_TABLES}


def _aggregates(decisions: DataFrame, connections: DataFrame) -> dict[str, DataFrame]:
    buckets = tables.latency_buckets(tables.latency_partials(decisions))
    return {"rejections": tables.rejections(decisions), "verification_latency_buckets": buckets,
            "verification_latency": tables.verification_latency(buckets),
            "incidents_prevented": tables.incidents_prevented(decisions),
            "client_inventory": tables.client_inventory(decisions, connections)}


def table_schemas(spark: SparkSession) -> dict[str, T.StructType]:
    """Every table's schema, raw and aggregate: worked out once per process (they depend on the code only;
    each time costs a dozen plan analyses, seconds on a loaded machine)."""
    if not _SCHEMAS:
        empty = spark.createDataFrame([], T.StructType([T.StructField("value", T.StringType()),
                                                        T.StructField("source", T.StringType())]))
        all_raw = parse.raw(empty)
        raw = {name: fn(all_raw) for name, fn in RAW_TABLES.items()}
        aggregates = _aggregates(raw["decisions"], raw["connections"])
        _SCHEMAS.update({name: frame.schema for name, frame in {**raw, **aggregates}.items()})
        _SCHEMAS[unproxied.NAME] = from_arrow_schema(unproxied.SCHEMA)
    return dict(_SCHEMAS)


def read_table(spark: SparkSession, out: Path, name: str, schema: T.StructType) -> DataFrame:
    path = out / name
    if not path.exists():  # a streaming sink that has not committed its first batch yet
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(str(path))


def _write(frame: DataFrame, out: Path, name: str) -> None:
    frame.write.mode("overwrite").partitionBy("day").parquet(str(out / name))


PARTIALS = "_partials"  # where the ingest's tasks leave their partial aggregates (`arrow_aggregates`)


def _lines_written(spark: SparkSession, source: Source, staging: str) -> DataFrame:
    """The ingest's Spark job: the manifest of what its tasks wrote. A local JSONL file (or folder) is split into
    byte ranges the tasks read themselves (`ranges`); anything else is read by Spark (its text source, or Kafka)."""
    if source.kind == "jsonl":
        files = ranges.input_files(source.location)
        if files is not None:
            return parse.write_ranges(spark, ranges.split(files, spark.sparkContext.defaultParallelism), staging)
    return parse.write_raw(read_lines(spark, source), staging)


def ingest(spark: SparkSession, source: Source, out: Path) -> dict[str, int]:
    """Every raw table and `incidents_prevented` in one pass over the input, plus the tasks' partial aggregates
    (under `out/_partials`); returns the rows written to each of those tables.

    Each task parses its lines and writes its rows of every table as Parquet files itself
    (`arrow_tables.write_raw`: only that table's columns, partitioned by day, into a staging folder); the job's
    result lists the files, and those (only those: a failed attempt's are not listed) are moved into the tables.
    Spark's own partitioned write of the one frame with every table's columns cost ~2/3 of the ingest's CPU (a sort
    by table and day, ~60 columns per row, most of them null).
    """
    staging = out / "_ingest"
    shutil.rmtree(staging, ignore_errors=True)
    manifest = _lines_written(spark, source, str(staging)).collect()
    written = [*RAW_TABLES, "incidents_prevented"]
    rows = dict.fromkeys(written, 0)
    for name in written:
        shutil.rmtree(out / name, ignore_errors=True)
    shutil.rmtree(out / PARTIALS, ignore_errors=True)
    for r in manifest:
        file, name = Path(r["file"]), r[tables.TABLE]
        if name.startswith(arrow_tables.PARTIAL_PREFIX):
            target = out / PARTIALS / name[len(arrow_tables.PARTIAL_PREFIX):] / file.name
        else:
            target = out / name / f"day={r['day']}" / file.name
            rows[name] += int(r["rows"])
        target.parent.mkdir(parents=True, exist_ok=True)
        file.rename(target)
    for name in written:
        if (out / name).exists():
            (out / name / "_SUCCESS").touch()
    (out / PARTIALS).mkdir(exist_ok=True)
    (out / PARTIALS / "_SUCCESS").touch()  # this ingest's partials are all here (an empty input has none)
    shutil.rmtree(staging, ignore_errors=True)
    return rows


def _read_partials(spark: SparkSession, out: Path, kind: str) -> DataFrame:
    schema = from_arrow_schema(arrow_aggregates.PARTIAL_SCHEMAS[kind])
    path = out / PARTIALS / kind
    if not path.exists():
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(str(path))


def _merged_by_spark(spark: SparkSession, out: Path, since_ms: int | None, until_ms: int | None,
                     partials_ready: bool) -> dict[str, Callable[[], None]]:
    """The aggregates merged by Spark: from the ingest's partials, or (a window, --follow, a rebuild) from partial
    rows Spark makes from the decisions and connections tables, with `incidents_prevented` too."""
    work: dict[str, Callable[[], None]] = {}
    if partials_ready:
        rejection_p = _read_partials(spark, out, "rejections")
        latency_p = _read_partials(spark, out, "latency")
        inventory_p = _read_partials(spark, out, "inventory")
    else:
        schemas = raw_table_schemas(spark)
        d = tables.window(read_table(spark, out, "decisions", schemas["decisions"]), since_ms, until_ms)
        c = tables.window(read_table(spark, out, "connections", schemas["connections"]), since_ms, until_ms)
        rejection_p, latency_p = tables.rejection_partials(d), tables.latency_partials(d)
        inventory_p = tables.inventory_partials(d, c)
        work["incidents_prevented"] = partial(_write, tables.incidents_prevented(d), out, "incidents_prevented")

    def latency() -> None:  # the percentiles read the buckets as written
        _write(tables.latency_buckets(latency_p), out, "verification_latency_buckets")
        buckets = read_table(spark, out, "verification_latency_buckets",
                             table_schemas(spark)["verification_latency_buckets"])
        _write(tables.verification_latency(buckets), out, "verification_latency")

    work["rejections"] = partial(_write, tables.rejections_from(rejection_p), out, "rejections")
    work["verification_latency"] = latency
    work["client_inventory"] = partial(_write, tables.inventory_from(inventory_p), out, "client_inventory")
    return work


def _bytes_under(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*.parquet"))


def _merge_locally(out: Path, summary: Summary | None) -> dict[str, pa.Table]:
    """The aggregates from the partials, merged in the driver with Arrow (`local_merge`) and written; the merged
    tables, which the report's queries then read in memory."""
    def read(kind: str) -> pa.Table:
        return local_merge.read(str(out / PARTIALS / kind), kind)

    merged: dict[str, pa.Table] = {}

    def rejections() -> None:
        merged["rejections"] = local_merge.rejections(read("rejections"))
        local_merge.write(merged["rejections"], str(out / "rejections"))

    def latency() -> None:
        buckets = merged["verification_latency_buckets"] = local_merge.latency_buckets(read("latency"))
        local_merge.write(buckets, str(out / "verification_latency_buckets"))
        merged["verification_latency"] = local_merge.latency_summary(buckets, list(tables.LATENCY_KEYS))
        local_merge.write(merged["verification_latency"], str(out / "verification_latency"))

    def inventory() -> None:
        merged["client_inventory"] = local_merge.client_inventory(read("inventory"))
        local_merge.write(merged["client_inventory"], str(out / "client_inventory"))

    for name, write in (("rejections", rejections), ("verification_latency", latency),
                        ("client_inventory", inventory)):
        if summary is None:
            write()
        else:
            _timed(summary, name, write)
    return merged


# Partial files up to this size are merged in the driver (`local_merge`: ~0.5 s a table) rather than by a Spark job
# each (~5 s a table here, nearly all of it fixed: planning, code generation, the JIT). 10M synthetic records leave
# ~40 MB of partials; a fleet's month may leave more, and then Spark merges them.
LOCAL_MERGE_MAX_BYTES = 512 * 1024 * 1024


def aggregate(spark: SparkSession, out: Path, since_ms: int | None, until_ms: int | None,
              summary: Summary | None = None, from_partials: bool = False,
              local_merge_max_bytes: int = LOCAL_MERGE_MAX_BYTES) -> dict[str, pa.Table] | None:
    """The derived tables; with `summary`, each table's write is a timed stage. Returns the merged tables when the
    driver merged them (the report's queries then run on them in memory), else None.

    `from_partials`: merge the partial aggregates the ingest's tasks left (a batch run over all of its input: they
    cover exactly the tables): in the driver when they are small (`local_merge_max_bytes`), else with Spark.
    Otherwise (a --since/--until window, --follow, a rebuild) Spark makes the same partial rows from the decisions
    and connections tables, and `incidents_prevented` too; the merge is the same code.
    """
    partials_ready = from_partials and (out / PARTIALS / "_SUCCESS").exists()
    if partials_ready and _bytes_under(out / PARTIALS) <= local_merge_max_bytes:
        return _merge_locally(out, summary)
    work = _merged_by_spark(spark, out, since_ms, until_ms, partials_ready)
    # One after the other: side by side (`_concurrently`) measured slower here (10M records: 14.8 s against 11.9 s),
    # as their time is the JVM's CPU (compiling, merging), not waiting.
    for name, write in work.items():
        if summary is None:
            write()
        else:
            _timed(summary, name, write)
    return None


def _raw_counts(d: DataFrame, c: DataFrame, q: DataFrame, hanging: DataFrame, holds: DataFrame) -> dict[str, int]:
    """Rows per raw table, counted (one job; a Parquet count reads the files' footers)."""
    union = None
    for name, frame in (("decisions", d), ("connections", c), ("quarantine", q), ("hanging_transactions", hanging),
                        ("end_txn_holds", holds)):
        tagged = frame.select(F.lit(name).alias("table"))
        union = tagged if union is None else union.unionByName(tagged)
    assert union is not None
    got = {r["table"]: int(r["n"]) for r in union.groupBy("table").agg(F.count("*").alias("n")).collect()}
    return {name: got.get(name, 0) for name in ("decisions", "connections", "quarantine", "hanging_transactions",
                                                "end_txn_holds")}


def write_unproxied(out: Path, since_ms: int | None, until_ms: int | None) -> pa.Table:
    """The table `unproxied_transactional_ids`, from the raw tables (`unproxied.from_tables`), written."""
    table = unproxied.from_tables(str(out), since_ms, until_ms)
    local_merge.write(table, str(out / unproxied.NAME))
    return table


def _unproxied_rows(table: pa.Table) -> list[tuple[str, str, Any, int, list[str]]]:
    shown = local_merge._naive(table.slice(0, report.UNPROXIED_SHOWN)).to_pylist()
    return [(r["transactional_id"], r["coordinator_state"], r["last_activity"], r["producer_id"], r["reported_by"])
            for r in shown]


def collect_report(spark: SparkSession, out: Path, since_ms: int | None, until_ms: int | None,
                   title: str, raw_rows: dict[str, int] | None = None,
                   merged: dict[str, pa.Table] | None = None,
                   unproxied_ids: pa.Table | None = None) -> report.ReportData:
    """The report's figures from the tables. `raw_rows`: each raw table's rows as the ingest wrote them (used for
    the totals when no --since/--until narrows them; else the tables are counted). `merged`: the aggregates the
    driver merged itself (`aggregate`): then the queries run on them and the small raw tables with Arrow
    (`local_merge.report_queries`), the same figures without a Spark job (a test compares the two)."""
    if merged is not None and raw_rows is not None and since_ms is None and until_ms is None:
        got = local_merge.report_queries(
            merged["rejections"], merged["verification_latency_buckets"], merged["client_inventory"],
            local_merge.read_table(str(out / "incidents_prevented")), local_merge.read_table(str(out / "quarantine")),
            local_merge.read_table(str(out / "end_txn_holds")), report.TOP_IDS)
        return _with_unproxied(_report_data(title, {**got, "counts": raw_rows}), unproxied_ids)
    schemas = table_schemas(spark)
    d = tables.window(read_table(spark, out, "decisions", schemas["decisions"]), since_ms, until_ms)
    c = tables.window(read_table(spark, out, "connections", schemas["connections"]), since_ms, until_ms)
    q = read_table(spark, out, "quarantine", schemas["quarantine"])
    hanging = tables.window(read_table(spark, out, "hanging_transactions", schemas["hanging_transactions"]),
                            since_ms, until_ms)
    holds = tables.window(read_table(spark, out, "end_txn_holds", schemas["end_txn_holds"]), since_ms, until_ms)
    rej = read_table(spark, out, "rejections", schemas["rejections"])
    inc = read_table(spark, out, "incidents_prevented", schemas["incidents_prevented"])
    inv = read_table(spark, out, "client_inventory", schemas["client_inventory"])

    held = F.percentile("held_ms", [0.5])  # exact, interpolated: what `local_merge` computes too
    buckets = read_table(spark, out, "verification_latency_buckets", schemas["verification_latency_buckets"])
    whole = raw_rows is not None and since_ms is None and until_ms is None
    queries: dict[str, Callable[[], Any]] = {
        "end_txn_holds": lambda: [
            (r["ending"], r["decision"], int(r["n"]), float(r["p"][0]), float(r["mx"])) for r in
            holds.groupBy("ending", "decision").agg(F.count("*").alias("n"), held.alias("p"),
                                                    F.max("held_ms").alias("mx")).orderBy("ending", "decision")
            .collect()],
        "counts": lambda: raw_rows if whole else _raw_counts(d, c, q, hanging, holds),
        # Every decision that is not "forwarded" failed its verification and is in `rejections`, counted by
        # decision (verification/decisions.py: a passed verification is forwarded, a failed one rejected,
        # forwarded_unenforced or timeout_recovered): no second scan of every decision.
        "failed": lambda: {r["decision"]: int(r["n"]) for r in
                           rej.groupBy("decision").agg(F.sum("count").alias("n")).collect()},
        "by_hour": lambda: [(r["hour"], r["reason"], int(r["n"])) for r in rej.groupBy("hour", "reason")
                            .agg(F.sum("count").alias("n")).orderBy("hour").collect()],
        "latency": lambda: [(r["evidence"], int(r["count"]), float(r["p50_ms"]), float(r["p95_ms"]),
                             float(r["p99_ms"]), float(r["max_ms"]))
                            for r in tables.latency_summary(buckets, "evidence").orderBy("evidence").collect()],
        "inventory": lambda: [r.asDict() for r in inv.groupBy("client_family", "client_software_name",
                                                              "client_software_version")
                              .agg(F.sum("connections").alias("connections"), F.sum("decisions").alias("decisions"),
                                   F.sum("rejections").alias("rejections"),
                                   F.sum("unenforced_rejections").alias("unenforced_rejections"),
                                   F.bool_or("pre_tv2").alias("pre_tv2"),
                                   F.array_sort(F.array_distinct(F.flatten(F.collect_list("client_ids"))))
                                   .alias("client_ids"),
                                   F.min("first_seen").alias("first_seen"), F.max("last_seen").alias("last_seen"))
                              .orderBy("client_family", "client_software_name", "client_software_version")
                              .collect()],
        "top": lambda: [(r["transactional_id"], int(r["n"])) for r in rej.groupBy("transactional_id")
                        .agg(F.sum("count").alias("n")).orderBy(F.desc("n"), "transactional_id")
                        .limit(report.TOP_IDS).collect()],
        "incidents": lambda: [(r["incident"], bool(r["prevented"]), int(r["n"]), r["consequence"]) for r in
                              inc.groupBy("incident", "prevented").agg(F.count("*").alias("n"),
                                                                       F.first("consequence").alias("consequence"))
                              .orderBy(F.desc("n")).collect()],
        "quarantine": lambda: [(r["reason_kind"], int(r["n"])) for r in
                               q.groupBy("reason_kind").agg(F.count("*").alias("n")).orderBy(F.desc("n")).collect()],
    }
    return _with_unproxied(_report_data(title, _concurrently(queries)), unproxied_ids)


def _with_unproxied(data: report.ReportData, table: pa.Table | None) -> report.ReportData:
    if table is not None:
        data.unproxied, data.unproxied_total = _unproxied_rows(table), table.num_rows
        data.totals["transactional ids no proxy saw"] = table.num_rows
    return data


def _report_data(title: str, got: dict[str, Any]) -> report.ReportData:
    counts, failed, end_txn_holds = got["counts"], got["failed"], got["end_txn_holds"]
    decision_counts = {**failed, "forwarded": counts["decisions"] - sum(failed.values())}
    totals = {
        "decisions": counts["decisions"],
        "passed and forwarded": decision_counts.get("forwarded", 0),
        "rejected (enforce)": decision_counts.get("rejected", 0),
        "would be rejected (monitor)": decision_counts.get("forwarded_unenforced", 0),
        "client connections": counts["connections"],
        "quarantined lines": counts["quarantine"],
        "hanging transactions found": counts["hanging_transactions"],
        "coordinator timeouts recovered (KIP-588)": decision_counts.get("timeout_recovered", 0),
        "requests held behind an EndTxn in doubt": sum(n for _, _, n, _, _ in end_txn_holds),
    }
    return report.ReportData(title, totals, got["by_hour"], got["latency"], got["inventory"], got["top"],
                             got["incidents"], got["quarantine"], end_txn_holds)


# Spark jobs submitted from several driver threads run side by side (its scheduler takes jobs from any thread).
# The aggregates and the report's queries are small jobs over small tables: most of each one's time is the
# driver planning it and Spark starting its few tasks, which side by side overlap instead of queueing.
CONCURRENT_JOBS = 4


def _concurrently(work: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each function in its own driver thread; their results by name (the first error is raised)."""
    with ThreadPoolExecutor(max_workers=CONCURRENT_JOBS, thread_name_prefix="txnguard-report") as pool:
        futures = {name: pool.submit(fn) for name, fn in work.items()}
        return {name: f.result() for name, f in futures.items()}


def _timed(summary: Summary, stage: str, fn: Callable[[], Any]) -> Any:
    started, cpu_started = time.perf_counter(), summary.cpu_probe() if summary.cpu_probe else 0.0
    result = fn()
    summary.seconds[stage] = round(time.perf_counter() - started, 3)
    if summary.cpu_probe:
        summary.cpu_seconds[stage] = round(summary.cpu_probe() - cpu_started, 3)
    log.info("stage_done", stage=stage, seconds=summary.seconds[stage])
    return result


def count_rows(spark: SparkSession, out: Path) -> dict[str, int]:
    """Rows per table, in one Spark job (a Parquet count reads only the files' footers)."""
    counts = [read_table(spark, out, name, schema).select(F.lit(name).alias("table"))
              for name, schema in table_schemas(spark).items()]
    union = counts[0]
    for frame in counts[1:]:
        union = union.unionByName(frame)
    got = {r["table"]: int(r["n"]) for r in union.groupBy("table").agg(F.count("*").alias("n")).collect()}
    return {name: got.get(name, 0) for name in table_schemas(spark)}


def refresh(spark: SparkSession, out: Path, since_ms: int | None, until_ms: int | None, title: str,
            summary: Summary, raw_rows: dict[str, int] | None = None,
            from_partials: bool = False) -> dict[str, pa.Table] | None:
    """The derived tables and the report from the raw tables; the aggregates when the driver merged them."""
    merged = aggregate(spark, out, since_ms, until_ms, summary, from_partials)
    found = _timed(summary, unproxied.NAME, lambda: write_unproxied(out, since_ms, until_ms))
    data = _timed(summary, "collect", lambda: collect_report(spark, out, since_ms, until_ms, title, raw_rows, merged,
                                                             found))
    if merged is not None:
        merged[unproxied.NAME] = found
    _timed(summary, "report", lambda: report.write(data, out))
    return merged


def run_batch(spark: SparkSession, source: Source, out: Path, since_ms: int | None = None,
              until_ms: int | None = None, cpu_probe: Callable[[], float] | None = None) -> Summary:
    summary = Summary(cpu_probe=cpu_probe)
    out.mkdir(parents=True, exist_ok=True)
    written = _timed(summary, "ingest", lambda: ingest(spark, source, out))
    raw_rows = {name: n for name, n in written.items() if name in RAW_TABLES}
    whole = since_ms is None and until_ms is None  # the ingest's partials cover exactly the tables
    merged = refresh(spark, out, since_ms, until_ms, _title(source), summary, raw_rows, from_partials=whole)
    if merged is not None:
        # Every table's rows as this run wrote them (the ingest's manifest, the merged tables): counting the files
        # again was a Spark job of its own, 8 s after a 10M-record run. test_pipeline compares the two.
        summary.rows = {**written, **{name: table.num_rows for name, table in merged.items()}}
    else:
        summary.rows = count_rows(spark, out)
    log.info("report_written", out=str(out), rows=summary.rows, seconds=summary.seconds)
    return summary


def start_stream(spark: SparkSession, source: Source, out: Path, name: str, trigger_s: float,
                 max_offsets_per_trigger: int | None = None) -> Any:
    """One raw table's streaming query: the topic into `out/name` (Parquet file sink, checkpoint under
    `out/_checkpoints`)."""
    if source.kind != "kafka":
        raise ValueError("--follow reads a Kafka topic (a JSONL file has no end to wait at)")
    reader = _kafka_reader(spark, source, streaming=True)
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    all_raw = parse.raw(parse.kafka_lines(reader.load()))
    return (RAW_TABLES[name](all_raw).writeStream.format("parquet").queryName(name)
            .option("path", str(out / name)).option("checkpointLocation", str(out / "_checkpoints" / name))
            .partitionBy("day").trigger(processingTime=f"{trigger_s} seconds").outputMode("append").start())


def start_streams(spark: SparkSession, source: Source, out: Path, trigger_s: float,
                  max_offsets_per_trigger: int | None = None) -> list[Any]:
    return [start_stream(spark, source, out, name, trigger_s, max_offsets_per_trigger) for name in RAW_TABLES]


# Spark 4.1.1's Kafka source fails a query right after it re-runs the micro-batch a crash left uncommitted:
# reporting that batch's progress reads the latest offsets, which only a new batch's planning sets
# (KafkaMicroBatchStream.metrics, SPARK-55271 / apache/spark#55236; fixed after 4.1.1). By then the batch
# is written and committed, so starting the query again from its checkpoint resumes cleanly (the next batch
# plans normally). Recognised by its message; any other failure still ends the job.
_KAFKA_METRICS_NPE = ('"scala.collection.IterableOps.map(scala.Function1)" because the return value of '
                      '"scala.Option.get()" is null')
_MAX_RESTARTS = 3


def _restartable(error: Any) -> bool:
    return _KAFKA_METRICS_NPE in str(error)


def run_follow(spark: SparkSession, source: Source, out: Path, *, trigger_s: float, refresh_s: float,
               since_ms: int | None = None, until_ms: int | None = None,
               max_offsets_per_trigger: int | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    queries = dict(zip(RAW_TABLES, start_streams(spark, source, out, trigger_s, max_offsets_per_trigger),
                       strict=True))
    restarts = dict.fromkeys(RAW_TABLES, 0)
    log.info("follow_started", source=f"{source.location}/{source.topic}", out=str(out))
    try:
        while True:
            try:
                terminated = spark.streams.awaitAnyTermination(max(1, round(refresh_s)))
            except StreamingQueryException:  # a query that failed is raised here; it is looked at below
                terminated = True
            if terminated:
                spark.streams.resetTerminated()
                for name, q in list(queries.items()):
                    if q.isActive:
                        continue
                    error = q.exception()
                    if error is None:  # stopped from outside: the job is done
                        return
                    if not _restartable(error) or restarts[name] >= _MAX_RESTARTS:
                        raise RuntimeError(f"streaming query {name} failed: {error}")
                    restarts[name] += 1
                    log.warning("stream_restarted", query=name, restarts=restarts[name],
                                reason="Kafka source progress after a re-run batch (SPARK-55271)")
                    queries[name] = start_stream(spark, source, out, name, trigger_s, max_offsets_per_trigger)
                continue
            summary = Summary()
            refresh(spark, out, since_ms, until_ms, _title(source), summary)
            progress = {name: (q.lastProgress or {}).get("numInputRows") for name, q in queries.items()}
            log.info("report_refreshed", seconds=summary.seconds, last_batch_rows=progress)
    finally:
        for q in queries.values():
            q.stop()


def _title(source: Source) -> str:
    where = source.location if source.kind == "jsonl" else f"{source.location}/{source.topic}"
    return f"txnguard fleet report ({source.kind}:{where})"


def _configure_logging() -> None:
    """One JSON object per line on stderr, like the proxy's logs."""
    structlog.configure(processors=[structlog.processors.add_log_level,
                                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                                    structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def main(args: argparse.Namespace) -> int:
    _configure_logging()
    try:
        source = Source.parse(args.source)
    except ValueError as e:
        log.error("bad_arguments", error=str(e))
        return 2
    if args.follow and source.kind != "kafka":
        log.error("bad_arguments", error="--follow needs a kafka: source")
        return 2
    spark = spark_session.build(args.master, kafka_jars=source.kind == "kafka" and args.cached_jars,
                          shuffle_partitions=args.shuffle_partitions, driver_memory=args.driver_memory)
    out = Path(args.out)
    try:
        if args.follow:
            run_follow(spark, source, out, trigger_s=args.trigger_seconds, refresh_s=args.refresh_seconds,
                       since_ms=args.since, until_ms=args.until,
                       max_offsets_per_trigger=args.max_offsets_per_trigger)
        else:
            summary = run_batch(spark, source, out, args.since, args.until)
            print(f"report: {out / 'report.html'}; rows: {summary.rows}; seconds: {summary.seconds}", flush=True)
    except KeyboardInterrupt:
        log.info("stopped")
    finally:
        spark_session.stop(spark)
    return 0

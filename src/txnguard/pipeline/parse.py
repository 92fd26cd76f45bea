"""Raw lines (a JSONL file or Kafka values) into typed records, each routed to its table or to quarantine.

Every line ends up in exactly one place. The parse is `arrow_parse.route_batches` in Spark's Python workers
(`mapInArrow`): pyarrow's JSON reader with the declared schema, a batch of lines at a time, and the quarantine
reason for the few lines that need one (see that module). It replaced `from_json`, which cost 10-19 us of CPU per
record. The workers get that module and `records` by value (cloudpickle), so the executors of a cluster need
pyarrow (PySpark's own Arrow requirement) but not txnguard.

`mapInArrow` is opaque to the optimizer: a filter on `route` or `table` above it (one per --follow stream) stays
above it, and each line is parsed once per query.
"""

from __future__ import annotations

from pathlib import Path

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txnguard.pipeline import arrow_aggregates, arrow_parse, arrow_tables, incidents, ranges, records
from txnguard.pipeline.arrow_parse import CHARS, REASON, ROUTE, SOURCE, VALUE
from txnguard.pipeline.records import CONNECTION, DECISION, END_TXN_HOLD, HANGING, QUARANTINE
from txnguard.pipeline.schema import all_raw_schema, manifest_schema, routed_schema

__all__ = ["CHARS", "CONNECTION", "DECISION", "END_TXN_HOLD", "HANGING", "QUARANTINE", "REASON", "ROUTE", "SOURCE",
           "VALUE", "jsonl_lines", "kafka_lines", "raw", "route", "write_ranges", "write_raw"]

# Shipped with the function rather than imported on the executors (see the module's docstring).
cloudpickle.register_pickle_by_value(arrow_parse)  # type: ignore[no-untyped-call]
cloudpickle.register_pickle_by_value(arrow_tables)  # type: ignore[no-untyped-call]
cloudpickle.register_pickle_by_value(records)  # type: ignore[no-untyped-call]
cloudpickle.register_pickle_by_value(arrow_aggregates)  # type: ignore[no-untyped-call]
cloudpickle.register_pickle_by_value(incidents)  # type: ignore[no-untyped-call]
cloudpickle.register_pickle_by_value(ranges)  # type: ignore[no-untyped-call]


def jsonl_lines(spark: SparkSession, path: str) -> DataFrame:
    """One row per line: `value` (the text) and `source` (the file)."""
    return (spark.read.option("lineSep", "\n").text(path)
            .select(F.col("value"), F.col("_metadata.file_path").alias("source")))


def kafka_lines(frame: DataFrame) -> DataFrame:
    """The Kafka source's rows (batch or stream) as `value` and `source` (topic/partition@offset)."""
    return frame.select(
        F.col("value").cast("string").alias("value"),
        F.concat_ws("", F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
                    F.col("offset").cast("string")).alias("source"))


def route(lines: DataFrame) -> DataFrame:
    """`value`, `source` -> one column per record field, `route`, `quarantine_reason`, `source`, `chars`, `value`
    (the text, kept only for a quarantined line)."""
    return lines.select(VALUE, SOURCE).mapInArrow(arrow_parse.route_batches, routed_schema())


def raw(lines: DataFrame) -> DataFrame:
    """`value`, `source` -> every raw table's rows: `table` and the union of the tables' columns
    (`arrow_tables`; `tables.raw_table` takes one table's rows and columns out of it)."""
    return lines.select(VALUE, SOURCE).mapInArrow(arrow_tables.all_raw_batches, all_raw_schema())


def write_raw(lines: DataFrame, staging: str) -> DataFrame:
    """`value`, `source` -> every raw table written as Parquet under `staging/NAME/day=DAY/` by the tasks themselves
    (`arrow_tables.write_raw`); the frame lists the files written: `table`, `day`, `file`, `rows`."""
    return lines.select(VALUE, SOURCE).mapInArrow(arrow_tables.writer(staging), manifest_schema())


def write_ranges(spark: SparkSession, found: list[ranges.Range], staging: str) -> DataFrame:
    """`write_raw` for local files read by the tasks themselves (`ranges`): one task per byte range. The
    `source` column says what Spark's text source said (`_metadata.file_path`: the file's URI).

    The ranges travel with the function; the frame is `spark.range` with one id per partition, so no Python
    worker turns rows of ranges into Spark rows first (`createDataFrame` of a Python list would)."""
    # Hadoop's form of a local file's URI (file:/tmp/a.jsonl, not file:///tmp/a.jsonl), as Spark wrote it.
    todo = [(path, start, end, "file:" + Path(path).as_uri()[len("file://"):]) for path, start, end in found]
    ids = spark.range(0, len(todo), 1, max(1, len(todo)))
    return ids.mapInArrow(arrow_tables.range_writer(staging, todo), manifest_schema())

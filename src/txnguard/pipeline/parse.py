"""Raw lines (a JSONL file or Kafka values) into typed records, each routed to decisions, connections or quarantine.

Every line ends up in exactly one place: parsing is one `from_json` with the declared schema in
PERMISSIVE mode, and a line that fails any check gets the first reason that applies. Nothing here
raises on bad input; a 10 MB line is measured, never parsed.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from txnguard.pipeline import records as R
from txnguard.pipeline.schema import CORRUPT, record_schema

DECISION, CONNECTION, QUARANTINE = "decision", "connection", "quarantine"


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


def _missing(names: list[str]) -> Column:
    """Comma-separated names of the required fields that are null (empty string when none)."""
    return F.concat_ws(",", *[F.when(F.col(f"r.{n}").isNull(), F.lit(n)) for n in names])


def _reason() -> Column:
    version, kind = F.col("r.schema_version"), F.col("r.kind")
    missing_v1 = _missing(R.required(1, DECISION))
    missing_v2_decision = _missing(R.required(2, DECISION))
    missing_v2_connection = _missing(R.required(2, CONNECTION))

    def missing(col: Column) -> Column:
        return F.when(col != "", F.concat(F.lit(R.MISSING_FIELDS + ":"), col))

    return (
        F.when(F.col("value").isNull() | (F.trim(F.col("value")) == ""), F.lit(R.EMPTY))
        .when(F.col("chars") > R.MAX_RECORD_CHARS, F.lit(R.TOO_LARGE))
        .when(F.col("r").isNull() | F.col(f"r.{CORRUPT}").isNotNull(), F.lit(R.MALFORMED_JSON))
        .when(version.isNull(), F.lit(R.MISSING_FIELDS + ":schema_version"))
        .when(~version.isin(*R.SUPPORTED_SCHEMA_VERSIONS),
              F.concat(F.lit(R.UNSUPPORTED_SCHEMA_VERSION + ":"), version.cast("string")))
        .when(version == 1, missing(missing_v1))
        .when(kind.isNull(), F.lit(R.MISSING_FIELDS + ":kind"))
        .when(~kind.isin(*R.KINDS), F.concat(F.lit(R.UNKNOWN_KIND + ":"), F.substring(kind, 1, 64)))
        .when(kind == DECISION, missing(missing_v2_decision))
        .otherwise(missing(missing_v2_connection))
    )


def route(lines: DataFrame) -> DataFrame:
    """`value`, `source` -> `route`, `quarantine_reason`, `r` (the parsed struct), `value`, `source`, `chars`."""
    sized = lines.withColumn("chars", F.length("value"))
    # Never hand a huge line to the parser: CASE WHEN evaluates only the branch it takes.
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = sized.withColumn(
        "r", F.when(F.col("chars") <= R.MAX_RECORD_CHARS, F.from_json("value", record_schema(), options)))
    with_reason = parsed.withColumn("quarantine_reason", _reason())
    routed = with_reason.withColumn(
        "route",
        F.when(F.col("quarantine_reason").isNotNull(), F.lit(QUARANTINE))
        .when(F.col("r.schema_version") == 1, F.lit(DECISION))
        .otherwise(F.col("r.kind")))
    # Only a quarantined line keeps its text: the parsed ones are cached between writes, and the text is
    # most of their size.
    return routed.withColumn("value", F.when(F.col("route") == QUARANTINE, F.col("value")))

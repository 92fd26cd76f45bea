"""Raw lines (a JSONL file or Kafka values) into typed records, each routed to decisions, connections or quarantine.

Every line ends up in exactly one place: parsing is one `from_json` with the declared schema in
PERMISSIVE mode, and a line that fails any check gets the first reason that applies. Nothing here
raises on bad input; a 10 MB line is measured, never parsed.

The routed frame is flat (one column per record field, not a nested struct): a flat frame caches as
compressed columns, where a 40-field struct is stored and rebuilt row by row.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from txnguard.pipeline import records as R
from txnguard.pipeline.schema import CORRUPT, record_schema

DECISION, CONNECTION, HANGING, QUARANTINE = "decision", "connection", "hanging", "quarantine"
# The routed frame's own columns, beside one column per record field (`records.union_fields`).
ROUTE, REASON, VALUE, SOURCE, CHARS = "route", "quarantine_reason", "value", "source", "chars"
_PARSED = "_parsed"  # null when the line was not handed to the parser, or it gave nothing


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
    """Comma-separated names of the required fields that are null (null when none is).

    The list is built only when one is missing: a cheap OR of null checks decides first (building the
    string for every line cost ~15% of the parse).
    """
    any_null = reduce(lambda a, b: a | b, [F.col(n).isNull() for n in names])
    return F.when(any_null, F.concat(F.lit(R.MISSING_FIELDS + ":"),
                                     F.concat_ws(",", *[F.when(F.col(n).isNull(), F.lit(n)) for n in names])))


def _reason() -> Column:
    version, kind = F.col("schema_version"), F.col("kind")
    unparsed = F.col(_PARSED).isNull() | F.col(CORRUPT).isNotNull()
    return (
        # Only a line the parser gave nothing for can be blank: trimming every line (570 bytes) is not free.
        F.when(F.col(VALUE).isNull() | (unparsed & (F.trim(F.col(VALUE)) == "")), F.lit(R.EMPTY))
        .when(F.col(CHARS) > R.MAX_RECORD_CHARS, F.lit(R.TOO_LARGE))
        .when(unparsed, F.lit(R.MALFORMED_JSON))
        .when(version.isNull(), F.lit(R.MISSING_FIELDS + ":schema_version"))
        .when(~version.isin(*R.SUPPORTED_SCHEMA_VERSIONS),
              F.concat(F.lit(R.UNSUPPORTED_SCHEMA_VERSION + ":"), version.cast("string")))
        .when(version == 1, _missing(R.required(1, DECISION)))
        .when(kind.isNull(), F.lit(R.MISSING_FIELDS + ":kind"))
        .when(~kind.isin(*R.KINDS), F.concat(F.lit(R.UNKNOWN_KIND + ":"), F.substring(kind, 1, 64)))
        .when(kind == DECISION, _missing(R.required(2, DECISION)))
        .when(kind == CONNECTION, _missing(R.required(2, CONNECTION)))
        .otherwise(_missing(R.required(2, HANGING)))
    )


def route(lines: DataFrame, *, filtered: bool = True) -> DataFrame:
    """`value`, `source` -> one column per record field, `route`, `quarantine_reason`, `value`, `source`, `chars`.

    `filtered`: the frame will be filtered by route (one query per table, as the --follow streams are); the
    batch job writes every table in one pass with no filter and passes False (see below).
    """
    sized = lines.select(VALUE, SOURCE, F.length(VALUE).alias(CHARS))
    # Never hand a huge line to the parser: CASE WHEN evaluates only the branch it takes.
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    struct = F.when(F.col(CHARS) <= R.MAX_RECORD_CHARS, F.from_json(VALUE, record_schema(), options))
    # The parse runs inside a generator (explode of a one-element array: exactly one row out per line, a null
    # struct included) because Spark pushes a filter through a projection by pasting the projected expression
    # into it (SPARK-47672): every table's `route = ...` filter would carry from_json once per field the reason
    # reads, ~100 parses per line (measured: 150 s instead of 20 s for 200k lines). A filter on a generator's
    # output stays above the generator, so each line is parsed once.
    # Without a filter above (the batch job's one write) the plain projection parses once too, and is cheaper.
    parsed = sized.select(VALUE, SOURCE, CHARS, (F.explode(F.array(struct)) if filtered else struct).alias("r"))
    fields = [name for name, _ in R.union_fields()]
    flat = parsed.select(VALUE, SOURCE, CHARS, F.when(F.col("r").isNotNull(), F.lit(True)).alias(_PARSED),
                         *[F.col(f"r.{n}").alias(n) for n in (*fields, CORRUPT)])
    with_reason = flat.withColumn(REASON, _reason())
    routed = with_reason.withColumn(
        ROUTE,
        F.when(F.col(REASON).isNotNull(), F.lit(QUARANTINE))
        .when(F.col("schema_version") == 1, F.lit(DECISION))
        .otherwise(F.col("kind")))
    # Only a quarantined line keeps its text: the parsed ones are cached between writes, and the text is
    # most of their size.
    return routed.select(*fields, ROUTE, REASON, SOURCE, CHARS,
                         F.when(F.col(ROUTE) == QUARANTINE, F.col(VALUE)).alias(VALUE))

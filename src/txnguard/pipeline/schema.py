"""The Spark schemas, declared (never inferred) from `records`: the routed frame `parse.route` returns."""

from __future__ import annotations

from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from txnguard.pipeline import arrow_tables
from txnguard.pipeline.arrow_parse import CHARS, REASON, ROUTE, SOURCE, VALUE
from txnguard.pipeline.records import FieldType, union_fields

_TYPES: dict[FieldType, T.DataType] = {
    "long": T.LongType(),
    "int": T.IntegerType(),
    "string": T.StringType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "int_array": T.ArrayType(T.IntegerType()),
    "in_doubt_array": T.ArrayType(T.StructType([
        T.StructField("committed", T.BooleanType()), T.StructField("connection_id", T.LongType()),
        T.StructField("sent_ms", T.LongType()), T.StructField("orphaned", T.BooleanType())])),
}


def record_schema() -> T.StructType:
    """Every field of every supported record kind."""
    return T.StructType([T.StructField(name, _TYPES[kind], True) for name, kind in union_fields()])


def routed_schema() -> T.StructType:
    """The record's fields, then where the line goes and why, where it came from, its size, its text if kept
    (the Arrow side's `arrow_parse.ROUTED_SCHEMA`, field for field)."""
    own = [T.StructField(ROUTE, T.StringType()), T.StructField(REASON, T.StringType()),
           T.StructField(SOURCE, T.StringType()), T.StructField(CHARS, T.IntegerType()),
           T.StructField(VALUE, T.StringType())]
    return T.StructType([*record_schema().fields, *own])


def all_raw_schema() -> T.StructType:
    """`arrow_tables.ALL_RAW_SCHEMA` in Spark's types: `table`, then the union of the raw tables' columns."""
    return from_arrow_schema(arrow_tables.ALL_RAW_SCHEMA)


def manifest_schema() -> T.StructType:
    """What the batch job's write returns: one row per Parquet file a task wrote (`arrow_tables.write_raw`)."""
    return from_arrow_schema(arrow_tables.MANIFEST_SCHEMA)


__all__ = ["all_raw_schema", "from_arrow_schema", "manifest_schema", "record_schema", "routed_schema"]

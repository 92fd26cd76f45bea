"""The Spark schemas, declared (never inferred) from `records`."""

from __future__ import annotations

from pyspark.sql import types as T

from txnguard.pipeline.records import FieldType, union_fields

CORRUPT = "_corrupt_record"

_TYPES: dict[FieldType, T.DataType] = {
    "long": T.LongType(),
    "int": T.IntegerType(),
    "string": T.StringType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "int_array": T.ArrayType(T.IntegerType()),
}


def record_schema() -> T.StructType:
    """Every field of every supported record kind, plus the column Spark fills with a line it cannot parse."""
    fields = [T.StructField(name, _TYPES[kind], True) for name, kind in union_fields()]
    return T.StructType([*fields, T.StructField(CORRUPT, T.StringType(), True)])

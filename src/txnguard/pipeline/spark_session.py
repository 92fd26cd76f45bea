"""The SparkSession: UTC, quiet, and the Kafka connector from the local jar cache when asked."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from txnguard.pipeline import connector


def build(master: str | None, *, kafka_jars: bool, shuffle_partitions: int = 8,
          driver_memory: str | None = None, app: str = "txnguard-report") -> SparkSession:
    """`master` None leaves it to spark-submit; `kafka_jars` adds the cached connector (offline after setup)."""
    b = SparkSession.builder.appName(app)
    if master:
        b = b.master(master)
    b = (b.config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
         # Every table is partitioned by day: with a writer per day open at once a task writes its rows as they
         # come, instead of sorting them by day first (the sort was half of a decisions write).
         .config("spark.sql.maxConcurrentOutputFileWriters", "16")
         # A 10 MB line is legal input (it is quarantined): keep Spark from refusing it on the way.
         .config("spark.sql.files.maxPartitionBytes", str(128 << 20)))
    if master and master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # The Arrow parse runs in Python workers: on this machine they are this interpreter (its pyarrow), not
        # whatever `python3` is first on PATH. SparkContext reads it from the environment, not the builder's
        # config. A cluster names its executors' Python itself.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if kafka_jars:
        b = b.config("spark.jars", ",".join(str(p) for p in connector.jars()))
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop(spark: SparkSession) -> None:
    spark.stop()

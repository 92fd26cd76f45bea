"""`txnguard report` arguments. Importable without pyspark: the command line loads the job only when asked."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

DEFAULT_MASTER = "local[*]"


def iso_ms(text: str) -> int:
    """ISO 8601 time (naive means UTC) -> epoch milliseconds."""
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def add_arguments(p: argparse.ArgumentParser, default_master: str | None = DEFAULT_MASTER) -> None:
    p.add_argument("--source", required=True, metavar="jsonl:PATH|kafka:BOOTSTRAP/TOPIC",
                   help="audit records: a JSONL file (or folder, or glob) or a Kafka topic")
    p.add_argument("--out", required=True, metavar="DIR", help="where the Parquet tables and report.html go")
    p.add_argument("--master", default=default_master, help=f"Spark master (default {default_master})")
    p.add_argument("--since", type=iso_ms, metavar="ISO", help="only records at or after this time (UTC if naive)")
    p.add_argument("--until", type=iso_ms, metavar="ISO", help="only records before this time")
    p.add_argument("--follow", action="store_true",
                   help="Structured Streaming from the Kafka topic, with a checkpoint in DIR (restart resumes)")
    p.add_argument("--trigger-seconds", type=float, default=5.0, help="--follow: micro-batch interval")
    p.add_argument("--refresh-seconds", type=float, default=30.0,
                   help="--follow: how often the aggregate tables and report.html are rebuilt")
    p.add_argument("--max-offsets-per-trigger", type=int,
                   help="--follow: at most this many Kafka records per micro-batch (default: all available)")
    p.add_argument("--shuffle-partitions", type=int, default=8,
                   help="spark.sql.shuffle.partitions (small suits local runs; raise it on a cluster)")
    p.add_argument("--driver-memory", help="spark.driver.memory for local runs (e.g. 2g)")
    p.add_argument("--no-cached-jars", dest="cached_jars", action="store_false",
                   help="do not add the Kafka connector from the local jar cache (spark-submit --packages does it)")


def add_parser(sub: Any) -> None:
    """The `report` subcommand of `txnguard`."""
    p = sub.add_parser("report", help="the fleet report: audit records -> Parquet tables + report.html (PySpark)")
    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        from txnguard.pipeline.job import main
    except ImportError as e:
        print(f"txnguard report needs the pipeline extra (pip install 'txnguard[pipeline]'): {e}", file=sys.stderr)
        return 1
    return main(args)

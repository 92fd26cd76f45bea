"""spark-submit entry point for the fleet report: the same job as `txnguard report`, master left to spark-submit.

    export PYSPARK_PYTHON=$PWD/.venv/bin/python   # the executors' Python (pyarrow, pandas, polars): required
    .venv/bin/spark-submit --master spark://host:7077 \
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1 \
        pipeline/report_job.py --source kafka:broker:9092/txnguard-audit --out /mnt/shared/txnguard-report

(--packages for a kafka: source only; pipeline/README.md says why each piece is needed.)

The driver needs `txnguard` importable (`pip install .` on the submitting host, client deploy mode, or
`--py-files` with a zip of src/txnguard); the executors do not: the Arrow parse that runs in their Python
workers (`mapInArrow`) is shipped with the job by value, and needs only pyarrow and pandas there (PySpark's own
Arrow requirements). --out is a filesystem path that the driver and every executor see (a shared mount): the
executors write the raw tables' files there in a batch run, the driver report.html.
"""

from __future__ import annotations

import argparse
import sys

from txnguard.pipeline import options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_job.py", description="txnguard fleet report (spark-submit)")
    options.add_arguments(parser, default_master=None)
    args = parser.parse_args(argv)
    if args.master is None:
        args.cached_jars = False  # spark-submit --packages brings the Kafka connector
    return options.run(args)


if __name__ == "__main__":
    sys.exit(main())

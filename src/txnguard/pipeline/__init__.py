"""The fleet pipeline: audit records (JSONL or a Kafka topic) into Parquet tables and an HTML report, on Spark.

An optional part (`pip install txnguard[pipeline]`): the proxy and its pure core never import it
(an import-linter contract). Only `options` may be imported without pyspark installed.
"""

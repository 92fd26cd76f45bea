"""`spark-submit pipeline/report_job.py` on a Spark standalone cluster gives the tables a `local[2]` run gives.

    test ──spark-class Master + 1 Worker of 2 cores (pinned pyspark, plain PATH: no virtualenv)──▶ spark://127.0.0.1:P
    test ──.venv/bin/spark-submit --master spark://… report_job.py --source jsonl:IN --out A──▶ 1 executor (2 tasks)
    test ──.venv/bin/spark-submit --master local[2] report_job.py --source jsonl:IN --out B   (at the same time)
    every table of A == the same table of B, row for row; the master lists the job as finished; then every
    daemon (and executor) it started is gone

As pipeline/README.md says a user must: the venv is not activated (its bin/ is not on PATH), PYSPARK_PYTHON names
the venv's interpreter (find-spark-home runs it, the driver is it, and the executors start their Python workers
with it), no --packages (a jsonl: source), and the input is a local path every executor sees (one machine here).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from txnguard.pipeline.synthetic import Generator
from txnguard.testing.spark_standalone import PLAIN_PATH, Standalone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]
REPORT_JOB = REPO / "pipeline" / "report_job.py"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
# ~9 MB: more than one of the job's byte ranges (4 MiB at least each), so more than one task reads the file.
RECORDS = 15_000
# Columns that say when a run happened, not what it read: a quarantined line's ingest time (and its day).
RUN_TIME_COLUMNS = {"quarantine": {"ingested_at", "day"}}


def _submit(master: str, source: Path, out: Path, log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_DRIVER_PYTHON")}
    env.update({"PATH": PLAIN_PATH, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"})
    return subprocess.Popen(
        [str(SPARK_SUBMIT), "--master", master, "--conf", "spark.executor.memory=512m",
         "--conf", "spark.ui.showConsoleProgress=false", str(REPORT_JOB), "--source", f"jsonl:{source}",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env, stdin=subprocess.DEVNULL)


def _finish(proc: subprocess.Popen[str], log: Path, timeout_s: float = 300) -> dict[str, int]:
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert proc.returncode == 0, f"{stdout}\n{tail}"
    rows = re.search(r"^report: .*; rows: (\{.*?\}); seconds:", stdout, re.MULTILINE)
    assert rows, stdout
    return dict(ast.literal_eval(rows.group(1)))


def _table(out: Path, name: str) -> list[dict]:
    folder = out / name
    if not folder.exists():
        return []
    drop = RUN_TIME_COLUMNS.get(name, set())
    rows = ds.dataset(folder, format="parquet", partitioning="hive").to_table().to_pylist()
    return sorted(({k: v for k, v in r.items() if k not in drop} for r in rows), key=repr)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=1e-9) if isinstance(a[k], float) and isinstance(b[k], float) else a[k] == b[k]
        for k in a)


def _tasks_per_executor(spark_dir: Path) -> dict[str, int]:
    """Tasks each executor finished, from its stderr in its worker's work dir (worker-N/app-ID/EXEC/stderr)."""
    return {f"{p.parent.parent.parent.name}/executor-{p.parent.name}":
            p.read_text(errors="replace").count("Finished task") for p in sorted(spark_dir.glob("worker-*/*/*/stderr"))}


def test_spark_submit_on_a_standalone_cluster_gives_the_local_runs_tables(tmp_path):
    source = tmp_path / "audit.jsonl"
    with source.open("w") as f:
        for line in Generator(seed=23, failure_rate=0.1).lines(RECORDS):
            f.write(line + "\n")
        f.write("not json\n")  # one quarantined line
    started = time.monotonic()
    local = _submit("local[2]", source, tmp_path / "out-local", tmp_path / "local.log")
    # One worker of two cores: a second worker and its executor were two more JVMs on a two-core machine (the gate
    # ran this test in 4-5 minutes with them); the job still runs its tasks on an executor, two at a time.
    cluster = Standalone(tmp_path / "spark", workers=1, cores_per_worker=2)
    try:
        cluster.start()
        up_s = time.monotonic() - started
        on_cluster = _submit(cluster.master_url, source, tmp_path / "out-cluster", tmp_path / "cluster.log")
        cluster_rows = _finish(on_cluster, tmp_path / "cluster.log")
        local_rows = _finish(local, tmp_path / "local.log")
        state = cluster.state()
        tasks = _tasks_per_executor(tmp_path / "spark")
    finally:
        if local.poll() is None:
            local.kill()
        cluster.stop()
    print(f"\ncluster up in {up_s:.1f} s, both runs done in {time.monotonic() - started:.1f} s; "
          f"tasks per executor: {tasks}")
    print(f"rows per table, standalone cluster: {json.dumps(cluster_rows)}")
    print(f"rows per table, local[2]:           {json.dumps(local_rows)}")

    # The job ran on this cluster (the driver never runs tasks in standalone mode: executors did).
    assert [(a["name"], a["state"]) for a in state["completedapps"]] == [("txnguard-report", "FINISHED")]
    assert sum(tasks.values()) > 0
    # Same rows per table, and the same rows.
    assert cluster_rows == local_rows
    assert cluster_rows["decisions"] > 0 and cluster_rows["quarantine"] == 1 and cluster_rows["rejections"] > 0
    for name, count in local_rows.items():
        a, b = _table(tmp_path / "out-cluster", name), _table(tmp_path / "out-local", name)
        assert len(a) == len(b) == count, name
        different = [(x, y) for x, y in zip(a, b, strict=True) if not _same(x, y)]
        assert different[:1] == [], name
    assert (tmp_path / "out-cluster" / "report.html").exists() and (tmp_path / "out-local" / "report.html").exists()
    # Nothing the test started is left running: no daemon's process group, no process naming this test's folder.
    assert cluster.running() == []
    assert _processes_naming(tmp_path) == []


def _processes_naming(path: Path) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmdline:
                out.append(f"{proc.name}: {cmdline[:200]}")
    return out

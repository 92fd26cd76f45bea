"""How fast is the fleet pipeline? Synthetic audit records through `txnguard report` on local[2].

Run: `.venv/bin/python bench/pipeline.py [--records 1000000] [--sources jsonl,kafka] [--driver-memory 3g]
[--jsonl FILE]` (`--jsonl` reuses a generated file: runs compared back to back read the same input)

For each source it writes N synthetic records (`txnguard.pipeline.synthetic`: a realistic mix of client
families, outcomes and latencies; ~2% connection records, v1 and v2 decisions) to a JSONL file, or
produces them with confluent-kafka to a topic of a 1-node Kafka 3.5.2 started for the run, then runs the
batch job in this process and prints, as figures (nothing is asserted):
* events/s end to end (the whole `job.run_batch` call, wall clock: its stages and anything between them) and per
  stage (ingest: read, parse, route and write the raw
  tables decisions/connections/quarantine/hanging_transactions/end_txn_holds and incidents_prevented in one pass,
  with the tasks' partial aggregates; then each derived table merged: rejections, verification_latency (with its
  buckets), client_inventory; collect: the report's queries; report: plots and page);
* the SparkSession start (not in the end-to-end rate: a long-running job pays it once);
* CPU seconds per stage of the whole job: the Spark JVM (on local[*] the driver and executors are that one
  process), the Python workers under it (the Arrow parse runs there) and this driver process; and events per
  CPU second: on this shared machine the wall-clock rate measures the other engineers' load as
  much as the job, the CPU rate does not;
* driver peak memory: the Spark JVM's peak resident set (VmHWM; on local[*] the executors are inside
  it) and the Python process's own peak; and the largest peak of the executors' Python workers (the parse).
Target: >= 200,000 events/s from JSONL on local[2].
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from txnguard.pipeline import job, spark_session
from txnguard.pipeline.synthetic import Generator
from txnguard.testing import kafka
from txnguard.testing.fixtures import fresh_topic


def write_jsonl(path: Path, n: int) -> float:
    started = time.perf_counter()
    with path.open("w") as f:
        chunk: list[str] = []
        for line in Generator(seed=1).lines(n):
            chunk.append(line)
            if len(chunk) == 10_000:
                f.write("\n".join(chunk) + "\n")
                chunk.clear()
        if chunk:
            f.write("\n".join(chunk) + "\n")
    return time.perf_counter() - started


def produce(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Producer

    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    for record in Generator(seed=1).records(n):
        key = record.get("transactional_id") or record.get("first_transactional_id")
        value = json.dumps(record, separators=(",", ":")).encode()
        while True:
            try:
                producer.produce(topic, key=key.encode() if key else None, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("records not delivered")
    return time.perf_counter() - started


def jvm_peak_rss_mb(spark: Any) -> float:
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# (pid, start time) -> peak resident set of each process under the JVM (PySpark's daemon and Python workers)
WORKER_PEAK_KB: dict[tuple[int, int], int] = {}


def _peak_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_cpu_ticks(root: int) -> dict[tuple[int, int], int]:
    """(pid, start time) -> own CPU ticks (utime + stime) of `root` and every process under it, from /proc."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    children: dict[int, list[int]] = {}
    for pid, f in stats.items():
        children.setdefault(int(f[1]), []).append(pid)
    tree: set[int] = set()
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats and pid not in tree:
            tree.add(pid)
            frontier += children.get(pid, [])
    return {(pid, int(stats[pid][19])): int(stats[pid][11]) + int(stats[pid][12]) for pid in tree}


def cpu_seconds(spark: Any) -> Any:
    """A clock of the job's CPU time (user + system): the Spark JVM, every process under it (PySpark's worker
    daemon and the Python workers `mapInArrow` runs in; their CPU is not the JVM's), and this driver process.

    Spark ends a Python worker idle for a minute, and its time must not vanish from the sum with it: a thread
    samples each process's own time (utime + stime) every second and the clock adds up the last sample of every
    process ever seen (a process that lives less than a second can be missed; PySpark's live for minutes).
    """
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict[tuple[int, int], int] = {}  # (pid, start time) -> ticks of own CPU time, last sampled
    lock = threading.Lock()

    def sample() -> None:
        now = _tree_cpu_ticks(jvm)
        with lock:
            seen.update(now)
        for pid, started in now:
            if pid != jvm:
                WORKER_PEAK_KB[(pid, started)] = max(WORKER_PEAK_KB.get((pid, started), 0), _peak_kb(pid))

    def loop() -> None:
        while True:
            sample()
            time.sleep(1.0)

    threading.Thread(target=loop, daemon=True, name="cpu-sampler").start()

    def read() -> float:
        sample()
        me = os.times()
        with lock:
            return sum(seen.values()) / ticks + me.user + me.system

    return read


def run(spark: Any, source: job.Source, out: Path, n: int) -> dict[str, Any]:
    probe = cpu_seconds(spark)
    started, cpu_started = time.perf_counter(), probe()
    summary = job.run_batch(spark, source, out, cpu_probe=probe)
    # The whole call, not the sum of its stages: until 2026-11-24 this was the sum, and a Spark job counting the
    # tables' rows after the report (8 s at 10M records, since removed) was in neither.
    total, total_cpu = time.perf_counter() - started, probe() - cpu_started
    stages, cpu = summary.seconds, summary.cpu_seconds
    stages["outside the stages"] = round(total - sum(stages.values()), 3)
    cpu["outside the stages"] = round(total_cpu - sum(cpu.values()), 3)
    return {"rows": summary.rows, "stages": stages, "total_s": total, "cpu": cpu, "total_cpu_s": total_cpu,
            "end_to_end_events_per_s": n / total, "events_per_cpu_s": n / total_cpu if total_cpu else float("inf"),
            "events_per_s_by_stage": {k: (n / v if v else float("inf")) for k, v in stages.items()},
            "load_average": os.getloadavg()}


def print_result(name: str, n: int, prepared_s: float, result: dict[str, Any]) -> None:
    print(f"\n== {name}: {n:,} records (prepared in {prepared_s:.1f} s) ==")
    print(f"  end to end: {result['total_s']:.1f} s = {result['end_to_end_events_per_s']:,.0f} events/s; "
          f"CPU {result['total_cpu_s']:.1f} s = {result['events_per_cpu_s']:,.0f} events per CPU second "
          f"(load average after: {result['load_average'][0]:.1f})")
    for stage, seconds in result["stages"].items():
        rate = result["events_per_s_by_stage"][stage]
        cpu = result["cpu"].get(stage, 0.0)
        shown = "" if stage == "outside the stages" else f"{rate:14,.0f} events/s"
        print(f"  {stage:<10} {seconds:8.1f} s  {shown:>23}   CPU {cpu:7.1f} s")
    rows = result["rows"]
    print(f"  rows: decisions {rows['decisions']:,}, connections {rows['connections']:,}, "
          f"quarantine {rows['quarantine']:,}, hanging_transactions {rows.get('hanging_transactions', 0):,}, "
          f"end_txn_holds {rows.get('end_txn_holds', 0):,}",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--sources", default="jsonl,kafka")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="3g")
    p.add_argument("--shuffle-partitions", type=int, default=8)
    p.add_argument("--dir", help="working folder (default: a temporary one, removed after)")
    p.add_argument("--jsonl", help="an existing JSONL file of synthetic records to read instead of writing one "
                                   "(the Python generator takes ~1 minute per million records)")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="txnguard-bench-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    sources = args.sources.split(",")
    cluster = None
    try:
        started = time.perf_counter()
        spark = spark_session.build(args.master, kafka_jars="kafka" in sources,
                                    shuffle_partitions=args.shuffle_partitions, driver_memory=args.driver_memory)
        print(f"SparkSession ({args.master}, driver memory {args.driver_memory}) started in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        if "jsonl" in sources:
            path = Path(args.jsonl) if args.jsonl else work / "audit.jsonl"
            prepared = 0.0 if args.jsonl else write_jsonl(path, args.records)
            result = run(spark, job.Source("jsonl", str(path)), work / "out-jsonl", args.records)
            print_result(f"jsonl ({path.stat().st_size / 1e6:,.0f} MB)", args.records, prepared, result)
            if not args.jsonl:
                path.unlink()
        if "kafka" in sources:
            cluster = kafka.up("3.5.2", 1, work / "kafka", {"log.retention.bytes": "-1"})
            topic = fresh_topic(cluster, "audit", partitions=2)
            prepared = produce(cluster.bootstrap_servers, topic, args.records)
            result = run(spark, job.Source("kafka", cluster.bootstrap_servers, topic), work / "out-kafka",
                         args.records)
            print_result(f"kafka (topic {topic}, 2 partitions)", args.records, prepared, result)
        print(f"\ndriver peak memory: JVM {jvm_peak_rss_mb(spark):,.0f} MB resident (VmHWM), "
              f"Python {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB; "
              f"Python workers (executors, {len(WORKER_PEAK_KB)} processes): the largest "
              f"{max(WORKER_PEAK_KB.values(), default=0) / 1024:,.0f} MB", flush=True)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.down()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

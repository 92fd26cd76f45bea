"""What does publishing audit records to Kafka cost the proxy? Proxy CPU per MB, audit-to-Kafka on vs off.

Run: `.venv/bin/python bench/audit_publishing.py [--rounds 3] [--records 20000]`

One run starts a 1-node Kafka 3.5.2 cluster and two `txnguard run` processes in gateway mode in
front of it, identical but for the audit: "off" writes the JSONL file only, "on" writes the file
and publishes every record to a topic on the same cluster (librdkafka, linger 100 ms). Kafka's
own ProducerPerformance (3.5.2) runs transactional loads with short transactions (many Produce
requests, so many decision records) through each side in turn, order alternating per round.

Per run it reads the proxy process's CPU (/proc/PID/stat utime+stime, 10 ms ticks) before and
after, and prints CPU seconds per MB of produced payload and per 1,000 audit records, for each
side (medians over rounds), plus the published/dropped counters of the "on" side. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from verification_overhead import free_port, scrape

from txnguard.testing import kafka
from txnguard.testing.clients import java_producer_performance
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess

KAFKA_VERSION = "3.5.2"
RECORD_SIZE = 100
TRANSACTION_MS = 50
RESULTS = Path(__file__).resolve().parent / "results"
TICK = os.sysconf("SC_CLK_TCK")
# All of the proxy's CPU divided by the audit records it wrote: an upper bound per record, not its cost.
PER_1000 = "proxy_cpu_ms_per_1000_audit_records"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of stat)


def start(name: str, upstream: str, tmp: Path, audit: dict[str, Any]) -> dict[str, Any]:
    port, admin = free_port(), f"127.0.0.1:{free_port()}"
    config = tmp / f"{name}.yaml"
    config.write_text(json.dumps({"mode": "gateway", "upstream": upstream, "listen": f"127.0.0.1:{port}",
                                  "admin": admin, "log_level": "warning",
                                  "audit": {"path": str(tmp / f"{name}.jsonl"), **audit}}))
    proc = ProxyProcess(["--config", str(config)], tmp / f"{name}.log").start(wait_port=("127.0.0.1", port))
    return {"name": name, "bootstrap": f"127.0.0.1:{port}", "admin": admin, "proc": proc, "runs": []}


def audit_lines(side: dict[str, Any], tmp: Path) -> int:
    return sum(1 for _ in (tmp / f"{side['name']}.jsonl").open())


def run(side: dict[str, Any], cluster: kafka.Cluster, records: int, rate: int, tmp: Path) -> dict[str, float]:
    topic = fresh_topic(cluster, f"bench-{side['name']}-{uuid.uuid4().hex[:6]}")
    pid = side["proc"].proc.pid
    lines0, cpu0 = audit_lines(side, tmp), cpu_seconds(pid)
    result = java_producer_performance(side["bootstrap"], topic, records, KAFKA_VERSION, record_size=RECORD_SIZE,
                                       throughput=rate, transactional_id=f"bench-{uuid.uuid4().hex[:8]}",
                                       transaction_duration_ms=TRANSACTION_MS, timeout_s=300)
    time.sleep(1.0)  # the last linger and delivery reports land inside the measurement
    cpu, audited = cpu_seconds(pid) - cpu0, audit_lines(side, tmp) - lines0
    mb = records * RECORD_SIZE / 1e6
    figures = {"cpu_s": round(cpu, 3), "mb": mb, "cpu_s_per_mb": round(cpu / mb, 4), "audit_records": audited,
               PER_1000: round(cpu * 1e6 / max(audited, 1), 3),
               "records_per_sec": result.records_per_sec}
    side["runs"].append(figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--rate", type=int, default=2500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="txnguard-bench-audit-") as d:
        tmp = Path(d)
        cluster = kafka.up(KAFKA_VERSION, 1, tmp / "kafka")
        sides: list[dict[str, Any]] = []
        try:
            audit_topic = fresh_topic(cluster, "txnguard-audit")
            sides = [start("off", cluster.bootstrap_servers, tmp, {}),
                     start("on", cluster.bootstrap_servers, tmp, {"topic": audit_topic})]
            for s in sides:  # warm-up: connections, metadata, the producer's first batches
                run(s, cluster, 2000, args.rate, tmp)
                s["runs"].clear()
            for r in range(args.rounds):
                for s in sides if r % 2 == 0 else list(reversed(sides)):
                    f = run(s, cluster, args.records, args.rate, tmp)
                    print(f"  round {r + 1} audit-to-kafka {s['name']:3s}: {f['cpu_s']:.2f} s CPU, "
                          f"{f['cpu_s_per_mb']:.3f} s/MB, {f['audit_records']} records "
                          f"({f[PER_1000]:.1f} ms proxy CPU per 1000), {f['records_per_sec']:.0f} rec/s",
                          flush=True)
            on_metrics = scrape(sides[1]["admin"])
        finally:
            for s in sides:
                s["proc"].terminate()
            cluster.down()
    med = {s["name"]: {k: statistics.median(x[k] for x in s["runs"])
                       for k in ("cpu_s_per_mb", PER_1000, "audit_records")} for s in sides}
    summary = {
        "kafka": KAFKA_VERSION, "records": args.records, "record_size": RECORD_SIZE, "rate": args.rate,
        "transaction_ms": TRANSACTION_MS, "rounds": args.rounds, "median": med,
        "publishing_cpu_s_per_mb": round(med["on"]["cpu_s_per_mb"] - med["off"]["cpu_s_per_mb"], 4),
        "on_side_audit_records": {k.split('"')[1]: v for k, v in on_metrics.items()
                                  if k.startswith("txnguard_audit_records_total")},
        "runs": {s["name"]: s["runs"] for s in sides}, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(summary, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"audit_publishing-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

"""What does one hanging-transaction scan cost, by the number of partitions it sweeps?

Run: `.venv/bin/python bench/hanging_scan_cost.py [--partitions 100,1000,2000] [--open 20] [--rounds 3]
[--version 3.5.2] [--zookeeper]`

A 1-node Kafka (KRaft unless --zookeeper), topics of 100 partitions each up to every size of --partitions, and
--open transactions left open (begun within their timeout, each with a record on one partition: DescribeProducers
then answers with active producers, as on a busy cluster). For each size, --rounds scans of the whole cluster
with the code the proxy's periodic scan runs (`txnguard.proxy.hanging_io.scan`, own-timeout rule, a fresh
connection each scan as after a failed one; the first round also opens the connections): the scan's wall time,
the scanning process's CPU (what a proxy with `health.hanging_scan_interval_s` pays each interval) and the
broker's CPU over the scan (from /proc: user + system of its JVM), and the requests it made. Open transactions
younger than their timeout are not candidates: the figures are the sweep every scan does, not the follow-up
questions of a finding (ListTransactions, DescribeTransactions, a second DescribeProducers) that only a
transaction open past its timeout costs. Prints medians; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from txnguard.proxy import hanging_io
from txnguard.proxy.config import HostPort
from txnguard.testing import kafka, raw
from txnguard.testing.scenarios import TxnActor
from txnguard.verification.hanging import OwnTimeout

TOPIC_PARTITIONS = 100
TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its JVM's threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class CountingAdmin(hanging_io.ClusterAdmin):
    """The scan's admin client, counting the requests it sends by kind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[str, int] = {}

    async def request(self, address: HostPort, payload: Any) -> Any:
        name = type(payload).__name__.removesuffix("Request")
        self.sent[name] = self.sent.get(name, 0) + 1
        return await super().request(address, payload)


async def one_scan(bootstrap: HostPort) -> tuple[float, float, dict[str, int], int]:
    admin = CountingAdmin([bootstrap], timeout_s=60.0)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        result = await hanging_io.scan(admin, hanging_io.Scope(), OwnTimeout())
        return time.perf_counter() - wall, time.process_time() - cpu, admin.sent, len(result.findings)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", default="100,1000,2000")
    parser.add_argument("--open", type=int, default=20, help="transactions left open (default 20)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--version", default="3.5.2")
    parser.add_argument("--zookeeper", action="store_true")
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.partitions.split(","))
    mode = "ZooKeeper" if args.zookeeper else "KRaft"
    print(f"hanging scan cost: Kafka {args.version} ({mode}, 1 node), {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}, {args.open} open transactions, {args.rounds} scans per size")
    with tempfile.TemporaryDirectory(prefix="txnguard-scan-cost-") as tmp:
        cluster = kafka.up(args.version, 1, Path(tmp) / "kafka", zookeeper=args.zookeeper)
        try:
            node = cluster.nodes[0]
            assert node.pid is not None
            host, port = node.address.rsplit(":", 1)
            bootstrap = HostPort(host, int(port))
            actors = []
            for i in range(args.open):
                actor = TxnActor(cluster.bootstrap_servers, f"scan-cost-{i}", timeout_ms=60_000)
                actor.init()
                actors.append(actor)
            made = 0
            rows = []
            for size in sizes:
                while made < size:
                    name = f"scan-cost-{made // TOPIC_PARTITIONS}"
                    raw.create_topic(cluster.bootstrap_servers, name, TOPIC_PARTITIONS)
                    made += TOPIC_PARTITIONS
                for i, actor in enumerate(actors):  # open transactions spread over the newest topic
                    if size == sizes[0]:
                        topic = f"scan-cost-{(made - 1) // TOPIC_PARTITIONS}"
                        actor.add_partitions(topic, i % TOPIC_PARTITIONS)
                        actor.produce(topic, i % TOPIC_PARTITIONS, [b"open"])
                time.sleep(2.0)  # leaders elected, metadata settled
                figures = []
                for _ in range(args.rounds):
                    broker_before = process_cpu_s(node.pid)
                    wall, cpu, sent, findings = asyncio.run(one_scan(bootstrap))
                    figures.append((wall, cpu, process_cpu_s(node.pid) - broker_before, sent, findings))
                wall_ms = statistics.median(f[0] for f in figures) * 1000
                cpu_ms = statistics.median(f[1] for f in figures) * 1000
                broker_ms = statistics.median(f[2] for f in figures) * 1000
                rows.append((made, wall_ms, cpu_ms, broker_ms, figures[-1][3], figures[-1][4]))
                print(f"  {made:>6} partitions: scan {wall_ms:8.1f} ms wall, {cpu_ms:7.1f} ms scanner CPU, "
                      f"{broker_ms:7.1f} ms broker CPU; requests {figures[-1][3]}; findings {figures[-1][4]}")
            print("\npartitions  wall ms  scanner CPU ms  broker CPU ms  scanner CPU us/partition")
            for made, wall_ms, cpu_ms, broker_ms, _, _ in rows:
                print(f"{made:>10}  {wall_ms:7.1f}  {cpu_ms:14.1f}  {broker_ms:13.1f}  {cpu_ms * 1000 / made:24.1f}")
            print("(broker CPU is read in clock ticks of 10 ms: small figures are coarse)")
        finally:
            cluster.down()


if __name__ == "__main__":
    main()

"""The proxy itself fails (issue 10, deliverable 3): SIGKILL a gateway process in the middle of an exactly-once
copy, restart it on the same ports, and check what came out.

    copier ──▶ gateway (a `txnguard run` process) ──▶ Kafka, 3 nodes
          SIGKILL once the output holds `kill_at` records; restart `pause_s` later on the same ports

A run passes when the copier finished, the output equals the input at read_committed (no loss, no
duplicate, in order), find-hanging is empty on both topics, and every decision the restarted proxy
took passed (no false rejection). Used by tests/integration/test_proxy_bounce.py and bench/proxy_bounce.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyProcess

COPIERS = ("java-3.5.2", "java-2.8.2", "confluent-kafka")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listener_ports(cluster: Cluster) -> dict[int, int]:
    """A free port per broker listener, chosen once so that a restarted gateway opens the same ones (the
    default, bootstrap port + 1 + node id, may already be taken on a busy machine)."""
    return {n.id: free_port() for n in cluster.nodes}


def gateway(cluster: Cluster, port: int, admin: int, audit: Path, log: Path,
            broker_ports: dict[int, int], *, upstream: str | None = None) -> ProxyProcess:
    """A gateway process, returned once its bootstrap port listens and /readyz says it knows the brokers.

    `upstream`: where it bootstraps (default the brokers; J1-lite gives it the fault relays)."""
    config = log.with_suffix(".yaml")
    config.write_text(json.dumps({
        "mode": "gateway", "upstream": upstream or cluster.bootstrap_servers, "listen": f"127.0.0.1:{port}",
        "broker_ports": broker_ports, "admin": f"127.0.0.1:{admin}", "audit": {"path": str(audit)},
        "log_level": "warning"}))
    proxy = ProxyProcess(["--config", str(config)], log).start(wait_port=("127.0.0.1", port))
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proxy
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway was not ready within 30 s:\n{proxy.log()}")
        time.sleep(0.1)


def kill(proxy: ProxyProcess) -> None:
    assert proxy.proc is not None
    os.kill(proxy.proc.pid, signal.SIGKILL)
    proxy.proc.wait(10)


def high_watermark(cluster: Cluster, topic: str) -> int:
    _, host, port = raw.leader_of(cluster.live_bootstrap(), topic, 0)
    with raw.RawClient(host, port) as c:
        return c.list_offsets(topic, 0, read_committed=False)


@dataclass
class BounceResult:
    copier: str
    passed: bool
    seconds: float
    killed_at: int                    # output log end when the gateway was killed
    copied_exactly_once: bool
    hanging: int
    decisions_after: int
    refused_after: int
    evidence_after: list[str] = field(default_factory=list)
    detail: str = ""

    def row(self) -> str:
        return (f"| {self.copier} | {'pass' if self.passed else 'FAIL'} | {self.killed_at} | "
                f"{'yes' if self.copied_exactly_once else 'no'} | {self.hanging} | {self.decisions_after} | "
                f"{self.refused_after} | {', '.join(self.evidence_after)} | {self.seconds:.0f} s | {self.detail} |")


def run_bounce(cluster: Cluster, copier: str, tmp: Path, *, records: int = 6000, kill_at: int = 1500,
               pause_s: float = 1.0, timeout_s: float = 240.0) -> BounceResult:
    u = uuid.uuid4().hex[:8]
    source = fresh_topic(cluster, f"bounce-in-{u}", replication_factor=3)
    sink = fresh_topic(cluster, f"bounce-out-{u}", replication_factor=3)
    values = [f"bounce-{i:05d}-{'x' * 200}".encode() for i in range(records)]
    clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, values, partition=0)
    port, admin, brokers = free_port(), free_port(), listener_ports(cluster)
    before, after = tmp / f"before-{u}.jsonl", tmp / f"after-{u}.jsonl"
    first = gateway(cluster, port, admin, before, tmp / f"before-{u}.log", brokers)
    second: ProxyProcess | None = None
    progress = [0]
    bootstrap = f"127.0.0.1:{port}"
    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            job: concurrent.futures.Future[Any]
            if copier.startswith("java-"):
                job = pool.submit(clients.java_transactional_copier, bootstrap, source, sink, f"tid-{u}",
                                  f"group-{u}", max_messages=records, java_version=copier[5:],
                                  transaction_size=500, timeout_s=timeout_s)
            else:
                job = pool.submit(clients.confluent_exactly_once_copy, bootstrap, source, sink, f"tid-{u}",
                                  f"group-{u}", records, commit_every=500, timeout_s=timeout_s,
                                  progress=lambda n: progress.__setitem__(0, n))
            deadline = time.monotonic() + 120
            while high_watermark(cluster, sink) < kill_at and not job.done():
                if time.monotonic() > deadline:
                    raise AssertionError("the copier made no progress")
                time.sleep(0.05)
            if job.done():
                raise AssertionError(f"the copier finished before the kill: {job.result()}")
            kill(first)
            killed_at = high_watermark(cluster, sink)
            time.sleep(pause_s)
            second = gateway(cluster, port, admin, after, tmp / f"after-{u}.log", brokers)
            outcome = job.result(timeout_s + 30)
    finally:
        for p in (first, second):
            if p is not None and p.proc is not None and p.proc.poll() is None:
                p.terminate()
    seconds = time.monotonic() - started
    finished = (getattr(outcome, "shutdown_complete", True) and getattr(outcome, "remaining", 0) == 0
                and getattr(outcome, "total_processed", getattr(outcome, "copied", records)) == records)
    clients.stable_end_offsets(cluster.bootstrap_servers, sink)
    out = clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, sink)
    expected = values if copier.startswith("java-") else [clients.copy_of(v) for v in values]
    exactly_once = out == expected
    hanging = len(clients.transactions_find_hanging(cluster.bootstrap_servers, topic=sink)) + \
        len(clients.transactions_find_hanging(cluster.bootstrap_servers, topic=source))
    decisions = [r for r in map(json.loads, after.read_text().splitlines()) if r.get("kind") == "decision"]
    refused = [r for r in decisions if r["outcome"] != "pass"]
    detail = "" if not refused else f"refused: {refused[0]['outcome']} {refused[0]['reason'][:60]}"
    return BounceResult(copier, bool(finished and exactly_once and hanging == 0 and decisions and not refused),
                        seconds, killed_at, exactly_once, hanging, len(decisions), len(refused),
                        sorted({r["evidence"] for r in decisions}), detail or str(outcome)[:80])

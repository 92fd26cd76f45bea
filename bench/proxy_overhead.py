"""What does txnguard cost? Direct vs through-the-proxy figures on one real Kafka 3.5.2 broker.

Run: `.venv/bin/python bench/proxy_overhead.py [--quick]` (see bench/README.md).

One run starts a 1-node Kafka 3.5.2 cluster and `txnguard run` in gateway mode as a
separate process (so its CPU and memory can be read from /proc apart from the client
and the broker), then measures, each side alternately so slow drift cancels:

1. ProducerPerformance (Kafka's Java tool): 1 KiB records, acks=all, a fixed offered rate.
2. EndToEndLatency (Kafka's Java tool): one record at a time, produce then consume.
3. A sequential Produce round trip from a raw Python client, with microsecond
   resolution, because both Java tools print latency percentiles in whole milliseconds.
4. The proxy's resident memory with 5,000 idle client connections.
5. Saturation: ProducerPerformance with --throughput -1 (as fast as the producer can) and
   ConsumerPerformance reading back what it wrote, at 1 KiB and 16 KiB records, with the
   proxy's CPU per MiB carried and the machine's busy share. `--only saturation` runs this alone.
   A third arm (unless --no-floor), the bare relay (bench/bare_relay.py: a uvloop byte pipe,
   no Kafka framing), measures the floor any user-space relay pays on this machine, so a
   ratio below the targets reads against what no relay at all could reach.
   A fourth arm (unless --no-peer), Kroxylicious 0.12.0 (a Java/Netty Kafka proxy) pass-through with
   no filters, its own JVM (txnguard.testing.kroxylicious), is the peer txnguard is held against.
6. A transactional producer at saturation: ProducerPerformance --transactional-id
   --transaction-duration-ms 50, 512 B records, in every arm (`--only txn`); the transactions it
   committed are the commit markers in the log (end offset - records), so CPU per transaction is exact.
7. One-record transaction loops per client family (txnguard.testing.short_transactions: Java 3.5.2,
   confluent-kafka, kafka-python), as fast as each client goes, in every arm (`--only loops`).

Three more txnguard arms, off by default, join the saturation, txn and loops parts, each a second `txnguard run`
process beside the first (same flags, its own ports, its own CPU): `--general-path`, the proxy with its
native module hidden (bench/general_path_proxy.py), so the general (kio) path reads every frame, checked at
start by its txnguard_native_data_path gauge reading 0; `--audit-on`, the proxy writing its audit records
to a file (audit_path), since the txnguard arm itself runs with audit off (no audit_path: the default); and
`--follower-live`, the proxy whose follower of the coordinator's log long-polls throughout, where the txnguard
arm's idles 30 s after the last write that asked the log (every write here passes on what the proxy saw, so
after its first 30 s the txnguard arm's follower only reads the log every 5 s).

The cluster uses the harness's sidecar layout: the broker's PLAINTEXT listener advertises the
bare relay's port (a byte pipe cannot rewrite Metadata), and its BROKER listener advertises
itself. The direct arm and the proxy's upstream use the BROKER listener, so direct clients
stay direct and the proxy rewrites the broker's own address, as in any gateway deployment.

It prints figures and compares them with the targets as information: nothing here
asserts on timing. The summary is also written to bench/results/ as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import io
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kio.index import load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import jars, kafka, raw
from txnguard.testing.clients import (
    TOOL_HEAP,
    TOOLS_PACKAGE,
    java_command,
    java_producer_performance,
    run_tool,
    tools_log_config,
)
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kroxylicious import VERSION as KROXYLICIOUS_VERSION
from txnguard.testing.kroxylicious import KroxyliciousProcess
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.short_transactions import FAMILIES, run_loop

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script run from anywhere: its sibling scripts
from verification_overhead import audit_decisions, pct

KAFKA_VERSION = "3.5.2"
JAVA_CLIENT = "3.5.2"
RECORD_SIZE = 1024
OFFERED_RATE = 5000                 # records/s: ~5 MiB/s, which an idle 2-core machine sustains both ways
SATURATED = 0.95                    # a direct run below this share of the offered rate: the machine did not keep up
QUEUEING_P99_MS = 100               # direct acks=all p99 above this on loopback: records queue in the producer
BUSY_PCT = 90                       # the whole machine busier than this during a run: figures include CPU waits
MIB = 1024 * 1024                   # ProducerPerformance's "MB" is a MiB; we use the same unit
HOST = "127.0.0.1"
RESULTS = Path(__file__).resolve().parent / "results"
SIDES = ("direct", "proxy")
FLOOR_SIDES = ("direct", "relay", "proxy")   # saturation with the bare relay: direct / bare relay / txnguard
PEER = "kroxylicious"                        # the peer proxy's arm (saturation, txn, loops)
RELAY_SCRIPT = Path(__file__).resolve().parent / "bare_relay.py"
# The extra txnguard arms (saturation, txn, loops), each a txnguard process of its own beside the "proxy" one:
GENERAL = "general"                          # the native module hidden: the general (kio) path reads every frame
AUDIT_ON = "audit-on"                        # audit records written to a file (the "proxy" arm writes none)
# The follower of the coordinator's log long-polls throughout (the "proxy" arm's idles once no write asks it)
FOLLOWER_LIVE = "follower-live"
EXTRA_ARMS = (GENERAL, AUDIT_ON, FOLLOWER_LIVE)
TXNGUARD_SIDES = ("proxy", *EXTRA_ARMS)      # the arms a txnguard process carries (its counters tell the route)
GENERAL_LAUNCHER = Path(__file__).resolve().parent / "general_path_proxy.py"

# The issue's targets. Printed next to the figures; never asserted.
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ADDED_P50_MS = 0.3
TARGET_ADDED_P99_MS = 2.0
TARGET_CPU_MS_PER_MB = 15.0
TARGET_RSS_MIB = 200.0
TARGET_SAT_RATIO = 0.95             # saturation throughput through the proxy, produce and consume (issue 9)
TARGET_SAT_PRODUCE_MS_PER_MIB = 4.0
TARGET_SAT_CONSUME_MS_PER_MIB = 1.5

PARTS = ("fixed", "e2e", "rtt", "idle", "saturation", "txn", "loops", "ab")   # --only chooses among these
DEFAULT_PARTS = PARTS[:5]           # txn and loops on demand (they take as long again); "ab" needs --compare-rev
ARM_PARTS = ("saturation", "txn", "loops")   # the parts that run the bare relay and the peer arms
SAT_RECORD_SIZES = (1024, 16 * 1024)
SAT_MIB = 200                       # payload per saturation run (the issue read 200,000 x 1 KiB)
SAT_WARMUP_SHARE = 0.25             # the untimed warm-up run per side carries this share of SAT_MIB
SAT_CONSUMER_TIMEOUT_MS = 60000     # ConsumerPerformance --timeout: the longest wait between returned records
SAT_IDLE_BUSY_PCT = 80              # a saturation run with the machine less busy than this did not saturate it
TXN_RECORD_SIZE = 512               # the transactional producer's records (as the issue measured)
TXN_DURATION_MS = 50                # ProducerPerformance --transaction-duration-ms
TXN_RECORDS = 100_000               # per transactional run (~3-4 s at ~29,000 records/s direct)
LOOP_TRANSACTIONS = 200             # one-record transactions per loop run


@dataclass(frozen=True)
class Settings:
    mode: str
    seconds_per_run: float          # ProducerPerformance run length at the offered rate
    pairs: int                      # direct+proxy pairs per measurement
    e2e_messages: int               # EndToEndLatency messages per run
    rtt_requests: int               # raw Produce round trips per run
    idle_connections: int = 5000
    open_concurrency: int = 200     # connections being opened at once (the proxy's backlog is 1024)
    rate: int = OFFERED_RATE        # ProducerPerformance --throughput, records/s
    rounds: int = 3                 # saturation, txn, loops: rounds (one run of each arm) per record size / family
    sat_mib: float = SAT_MIB        # saturation: payload MiB per run
    record_sizes: tuple[int, ...] = SAT_RECORD_SIZES
    parts: tuple[str, ...] = DEFAULT_PARTS
    profile_cmd: str | None = None  # attached to the proxy around each proxied saturation run of round 0
    compare_rev: str | None = None  # "ab": a second proxy of this git revision, alternating with the first
    ab_kind: str = "saturation"     # "ab": what alternates, "saturation" (produce) or "loops" (each family's)
    floor: bool = True              # saturation, txn, loops: a bare relay arm beside direct and proxy
    peer: bool = True               # saturation, txn, loops: a Kroxylicious arm
    arms: tuple[str, ...] = ()      # saturation, txn, loops: extra txnguard arms, of EXTRA_ARMS
    txn_records: int = TXN_RECORDS  # txn: records per transactional ProducerPerformance run
    loop_transactions: int = LOOP_TRANSACTIONS   # loops: transactions per loop run
    families: tuple[str, ...] = FAMILIES         # loops: the client families

    @property
    def sat_sides(self) -> tuple[str, ...]:
        return (*(FLOOR_SIDES if self.floor else SIDES), *(a for a in EXTRA_ARMS if a in self.arms),
                *((PEER,) if self.peer else ()))

    @property
    def records(self) -> int:
        return int(self.rate * self.seconds_per_run)


DEFAULT = Settings("default", seconds_per_run=15, pairs=3, e2e_messages=2000, rtt_requests=2000)
QUICK = Settings("quick", seconds_per_run=3, pairs=2, e2e_messages=500, rtt_requests=500, rounds=2, sat_mib=50,
                 txn_records=20_000, loop_transactions=50)


def say(text: str) -> None:
    print(text, flush=True)


# -- the proxy process, read from /proc ------------------------------------------------------------


def proxy_cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of one process, in seconds (fields 14 and 15 of /proc/<pid>/stat).

    stime is the kernel's work on the process's behalf: socket reads and writes (the copies
    to and from socket buffers), epoll. utime is everything in user space (Python, uvloop).
    """
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may contain spaces; everything after its ')' is fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def proxy_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    return sum(proxy_cpu_times(pid))


def jvm_cpu_split(pid: int) -> tuple[float, float]:
    """(utime + stime of every thread but the JIT compilers, of the JIT compiler threads) of a JVM, seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    other = jit = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                name, rest = f.read().rsplit(")", 1)
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        fields = rest.split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if "CompilerThre" in name:  # "C1 CompilerThre", "C2 CompilerThre" (comm keeps 15 characters)
            jit += cpu
        else:
            other += cpu
    return other, jit


def proxy_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(values) - values[3] - values[4], sum(values)


@contextlib.contextmanager
def cpu_meter(pid: int) -> Iterator[dict[str, float]]:
    """Proxy CPU seconds, wall seconds and how busy the whole machine was, inside the block.

    The machine figure tells a clean run from one that shared its cores with
    something else: on a busy host every latency here is mostly scheduling delay.
    """
    out: dict[str, float] = {}
    (user0, sys0), t0, (busy0, total0) = proxy_cpu_times(pid), time.monotonic(), host_cpu_ticks()
    yield out
    busy1, total1 = host_cpu_ticks()
    user1, sys1 = proxy_cpu_times(pid)
    out["proxy_cpu_s"] = (user1 - user0) + (sys1 - sys0)
    out["proxy_user_s"], out["proxy_sys_s"] = user1 - user0, sys1 - sys0
    out["wall_s"] = time.monotonic() - t0
    out["host_busy_pct"] = 100 * (busy1 - busy0) / max(1, total1 - total0)


def scrape_metrics(admin: str) -> dict[str, float]:
    """The proxy's /metrics as {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric_sum(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


# -- setting up --------------------------------------------------------------------------------------


def raise_fd_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit, before anything starts, so children inherit it.

    The proxy holds two sockets per client connection (client + broker) and the broker
    one per proxy connection: 5,000 idle clients need ~10,000 descriptors in the proxy.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def proxy_ports() -> tuple[int, int]:
    """(listen, admin). Gateway mode opens broker N's listener at listen + 1 + N, so node 1 needs listen + 2."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            listen = int(s.getsockname()[1])
        with socket.socket() as s:
            s.bind((HOST, 0))
            admin = int(s.getsockname()[1])
        if listen + 2 <= 65535 and admin not in (listen, listen + 2) and _bindable(listen + 2):
            return listen, admin
    raise RuntimeError("no free loopback ports for the proxy")


def wait_ready(admin: str, broker_port: int, timeout_s: float = 30.0) -> None:
    """/readyz answers 200 once the proxy's own Metadata succeeded, which also opens broker 1's listener."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{admin}/readyz", timeout=2) as r:
            if r.status == 200 and _accepts(broker_port):
                return
        time.sleep(0.2)
    raise RuntimeError(f"proxy not ready within {timeout_s:.0f}s (admin {admin}, broker listener {broker_port})")


def direct_bootstrap(cluster: kafka.Cluster) -> str:
    """The BROKER listeners: they advertise themselves (PLAINTEXT advertises the bare relay)."""
    return ",".join(f"{n.host}:{n.broker_port}" for n in cluster.nodes)


class RelayProcess:
    """bench/bare_relay.py as a child process; on SIGUSR1 it prints its byte counts on the pipe we read.

    Its stderr (asyncio's report of anything that went wrong in a callback) goes to `log`.
    """

    def __init__(self, listen: int, upstream: str, log: Path) -> None:
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, str(RELAY_SCRIPT), "--listen", f"{HOST}:{listen}",
                                          "--upstream", upstream], stdout=subprocess.PIPE, stderr=err, text=True)
        first = self._line()
        if not first.startswith("listening"):
            self.stop()
            raise RuntimeError(f"bare relay did not start: {first!r}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def counts(self) -> tuple[int, int, int]:
        """(bytes client to upstream, bytes upstream to client, bytes of stderr) since it started."""
        self.proc.send_signal(signal.SIGUSR1)
        line = self._line()
        if not line.startswith("relayed "):
            raise RuntimeError(f"bare relay answered {line!r} (exit {self.proc.poll()})")
        up, down, _ = (int(x) for x in line.split()[1:])
        return up, down, self.log.stat().st_size

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode


class LaunchedProxyProcess(ProxyProcess):
    """ProxyProcess started as `python <launcher> run <args>` instead of `python -m txnguard.cli run <args>`.

    The general-path arm's launcher hides txnguard._native before txnguard is imported, which an environment
    variable cannot do; the rest (log, SIGTERM, waiting for the port) is ProxyProcess's.
    """

    def __init__(self, launcher: Path, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(args, log_path, env)
        self.launcher = launcher

    def start(self, wait_port: tuple[str, int] | None = None, timeout: float = 90.0) -> LaunchedProxyProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen([sys.executable, str(self.launcher), "run", *self.args], stdout=log,
                                     stderr=subprocess.STDOUT, env={**os.environ, **(self.env or {})})
        log.close()
        if wait_port is not None:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"proxy ({self.launcher.name}) exited with {self.proc.returncode}:\n"
                                       f"{self.log()}")
                with contextlib.suppress(OSError), socket.create_connection(wait_port, timeout=0.5):
                    return self
                time.sleep(0.1)
            self.proc.kill()  # one that comes up after we gave up must not outlive the bench
            self.proc.wait()
            raise RuntimeError(f"proxy ({self.launcher.name}) did not listen on {wait_port} within {timeout:.0f} s")
        return self


@dataclass
class ArmProxy:
    """An extra txnguard arm: a `txnguard run` process of its own beside the bench's proxy, same flags."""

    proxy: ProxyProcess
    listen: int
    admin: str
    native: float                   # its txnguard_native_data_path gauge at start
    audit_path: Path | None = None  # the audit-on arm's records

    @property
    def pid(self) -> int:
        assert self.proxy.proc is not None
        return self.proxy.proc.pid


@dataclass
class Bench:
    cluster: kafka.Cluster
    proxy: ProxyProcess
    listen: int
    admin: str
    stamp: str = ""
    relay: RelayProcess | None = None
    peer: KroxyliciousProcess | None = None
    arms: dict[str, ArmProxy] = dataclasses.field(default_factory=dict)   # the extra txnguard arms by side

    @property
    def pid(self) -> int:
        assert self.proxy.proc is not None
        return self.proxy.proc.pid

    def pid_of(self, side: str) -> int:
        """The process whose CPU a run of `side` is charged: the bare relay's or Kroxylicious's for their
        arms, else txnguard's (a direct run is charged txnguard's idle process: ~0)."""
        if side == "relay":
            assert self.relay is not None
            return self.relay.proc.pid
        if side == PEER:
            assert self.peer is not None
            return self.peer.pid
        if side in self.arms:
            return self.arms[side].pid
        return self.pid

    @property
    def direct_bootstrap(self) -> str:
        return direct_bootstrap(self.cluster)

    def bootstrap(self, side: str) -> str:
        if side == "direct":
            return self.direct_bootstrap
        if side == "relay":
            return self.cluster.sidecar_bootstrap
        if side == PEER:
            assert self.peer is not None
            return self.peer.bootstrap
        if side in self.arms:
            return f"{HOST}:{self.arms[side].listen}"
        return f"{HOST}:{self.listen}"

    def counters(self) -> dict[str, dict[str, float]]:
        """The /metrics of every txnguard process by the side it carries: "proxy" and the extra arms."""
        return {"proxy": scrape_metrics(self.admin), **{side: scrape_metrics(a.admin) for side, a in self.arms.items()}}

    def relay_counts(self) -> tuple[int, int, int]:
        return self.relay.counts() if self.relay is not None else (0, 0, 0)

    def peer_counts(self) -> tuple[float, float]:
        """(CPU seconds of Kroxylicious's threads but its JIT compilers, of its JIT compilers) so far.

        The first is its route check: without its metrics endpoint (left off to keep it pass-through) it
        counts no bytes, and /proc/<pid>/io misses Netty's recv/send system calls. The compilers go on
        compiling for a second or so after a run of its own, so their CPU is kept apart (and reported).
        """
        return jvm_cpu_split(self.peer.pid) if self.peer is not None else (0.0, 0.0)

    def topic(self, kind: str, side: str) -> str:
        # Topics are created on the broker directly, so topic creation never counts against the proxy.
        return fresh_topic(self.cluster, f"bench-{kind}-{side}-{uuid.uuid4().hex[:8]}")


def alternating(pairs: int) -> Iterator[tuple[int, str]]:
    """direct, proxy, proxy, direct, direct, proxy, ...: each side goes first equally often."""
    for i in range(pairs):
        for side in SIDES if i % 2 == 0 else reversed(SIDES):
            yield i, side


def median_of(runs: list[dict[str, Any]], side: str, key: str) -> float:
    return float(statistics.median(r[key] for r in runs if r["side"] == side))


def medians(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    return {side: {k: median_of(runs, side, k) for k in keys} for side in SIDES}


def busy_warnings(phase: str, runs: list[dict[str, Any]]) -> list[str]:
    """A warning when the machine was nearly saturated: then latency is mostly waiting for a CPU."""
    busy = statistics.median(r["host_busy_pct"] for r in runs)
    if busy <= BUSY_PCT:
        return []
    return [f"{phase}: the machine was {busy:.0f}% busy (median over runs; the bench's own broker, client and "
            "proxy included): latencies include waiting for a CPU, compare them with care"]


def saturation_warnings(direct: dict[str, float], rate: int) -> list[str]:
    out = []
    if direct["records_per_sec"] < SATURATED * rate:
        out.append(f"ProducerPerformance: direct runs reached {direct['records_per_sec']:.0f} of {rate} records/s "
                   "offered: the machine did not sustain the rate (try a lower --rate)")
    if direct["p99_ms"] > QUEUEING_P99_MS:
        out.append(f"ProducerPerformance: direct p99 {direct['p99_ms']:.0f} ms means records queued in the producer "
                   "(client or broker short of CPU): its latencies measure that queue, not the proxy")
    return out


# -- 1. ProducerPerformance -------------------------------------------------------------------------

PERF_KEYS = ("records_per_sec", "mb_per_sec", "avg_latency_ms", "p50_ms", "p99_ms", "max_latency_ms",
             "proxy_cpu_s", "wall_s")


def producer_perf_run(b: Bench, side: str, records: int, rate: int) -> dict[str, Any]:
    topic = b.topic("perf", side)
    before = scrape_metrics(b.admin)
    with cpu_meter(b.pid) as cpu:
        r = java_producer_performance(
            b.bootstrap(side), topic, records, JAVA_CLIENT, record_size=RECORD_SIZE, throughput=rate,
            timeout_s=4 * records / rate + 60,
        )
    # Every Kafka frame the proxy carried, both directions (0 for a direct run, bar its own Metadata).
    after = scrape_metrics(b.admin)
    frame_bytes = metric_sum(after, "txnguard_bytes_total") - metric_sum(before, "txnguard_bytes_total")
    payload_mib = r.records * RECORD_SIZE / MIB
    return {**asdict(r), **cpu, "side": side, "topic": topic, "payload_mib": payload_mib,
            "proxy_frame_mib": frame_bytes / MIB,
            "proxy_cpu_ms_per_mb": 1000 * cpu["proxy_cpu_s"] / payload_mib}


def producer_perf_phase(b: Bench, s: Settings) -> dict[str, Any]:
    say(f"\n[1/5] ProducerPerformance: {s.records} x {RECORD_SIZE} B, acks=all, offered {s.rate} records/s, "
        f"{s.pairs} pairs")
    # One short untimed run per side: JIT of broker and client, the proxy's first connections and caches.
    for side in SIDES:
        producer_perf_run(b, side, s.rate, s.rate)
    runs = []
    for i, side in alternating(s.pairs):
        run = producer_perf_run(b, side, s.records, s.rate)
        runs.append({**run, "pair": i})
        say(f"  pair {i} {side:6}: {run['records_per_sec']:8.1f} rec/s {run['mb_per_sec']:6.2f} MB/s  "
            f"avg {run['avg_latency_ms']:6.2f} ms p50 {run['p50_ms']} p99 {run['p99_ms']} max "
            f"{run['max_latency_ms']:.0f} ms  proxy CPU {run['proxy_cpu_s']:.2f} s "
            f"({run['proxy_cpu_ms_per_mb']:.1f} ms/MB)  host busy {run['host_busy_pct']:.0f}%")
    med = medians(runs, (*PERF_KEYS, "proxy_cpu_ms_per_mb", "proxy_frame_mib", "host_busy_pct"))
    warnings = saturation_warnings(med["direct"], s.rate) + busy_warnings("ProducerPerformance", runs)
    for w in warnings:
        say(f"  WARNING: {w}")
    return {"runs": runs, "median": med, "warnings": warnings}


# -- 2. EndToEndLatency -----------------------------------------------------------------------------

_E2E_AVG = re.compile(r"Avg latency: ([\d.]+) ms")
_E2E_PCT = re.compile(r"Percentiles: 50th = (\d+), 99th = (\d+), 99\.9th = (\d+)")


def e2e_run(b: Bench, side: str, messages: int) -> dict[str, Any]:
    topic = b.topic("e2e", side)
    # Positional: broker_list topic num_messages producer_acks message_size_bytes (kafka-tools 3.5.2).
    args = [b.bootstrap(side), topic, str(messages), "all", str(RECORD_SIZE)]
    with cpu_meter(b.pid) as cpu:
        run = run_tool(java_command("EndToEndLatency", JAVA_CLIENT, args), timeout_s=60 + 0.1 * messages)
    avg, pct = _E2E_AVG.search(run.stdout), _E2E_PCT.search(run.stdout)
    if avg is None or pct is None:
        raise RuntimeError(f"EndToEndLatency printed no result:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return {"side": side, "topic": topic, "avg_ms": float(avg[1]), "p50_ms": int(pct[1]), "p99_ms": int(pct[2]),
            "p999_ms": int(pct[3]), **cpu}


def e2e_phase(b: Bench, s: Settings) -> dict[str, Any]:
    say(f"\n[2/5] EndToEndLatency: {s.e2e_messages} x {RECORD_SIZE} B one at a time, acks=all, {s.pairs} pairs")
    runs = []
    for i, side in alternating(s.pairs):
        run = {**e2e_run(b, side, s.e2e_messages), "pair": i}
        runs.append(run)
        say(f"  pair {i} {side:6}: avg {run['avg_ms']:.3f} ms p50 {run['p50_ms']} p99 {run['p99_ms']} "
            f"p99.9 {run['p999_ms']} ms  host busy {run['host_busy_pct']:.0f}%")
    warnings = busy_warnings("EndToEndLatency", runs)
    for w in warnings:
        say(f"  WARNING: {w}")
    return {"runs": runs, "median": medians(runs, ("avg_ms", "p50_ms", "p99_ms", "p999_ms")), "warnings": warnings}


# -- 3. raw Produce round trip (microseconds) -------------------------------------------------------


def _produce_frames(client: raw.RawClient, topic: str, n: int) -> list[bytes]:
    batch = Records.parse(raw.build_batch([b"x" * RECORD_SIZE]))
    request = ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(TopicProduceData(name=TopicName(topic),
                                     partition_data=(PartitionProduceData(index=i32(0), records=batch),)),),
    )
    # Encoded up front: only the network, the proxy and the broker are inside the timed window.
    return [client.encode(request, i + 1) for i in range(n)]


def _produce_errors(responses: list[bytes]) -> Counter[str]:
    cls = load_response_schema(0, 9)
    errors: Counter[str] = Counter()
    for frame in responses:
        _, used = entity_reader(cls.__header_schema__)(frame, 0)
        body: Any = entity_reader(cls)(frame, used)[0]  # a ProduceResponse v9
        for p in body.responses[0].partition_responses:
            if p.error_code != ErrorCode.none:
                errors[p.error_code.name] += 1
    return errors


def rtt_run(b: Bench, side: str, n: int, warmup: int = 50) -> dict[str, Any]:
    topic = b.topic("rtt", side)
    _, host, port = raw.leader_of(b.bootstrap(side), topic, 0)  # through the proxy: its broker listener
    with raw.RawClient(host, port, client_id="txnguard-bench") as c, cpu_meter(b.pid) as cpu:
        frames = _produce_frames(c, topic, n + warmup)
        micros: list[float] = []
        responses: list[bytes] = []
        for frame in frames:
            t0 = time.perf_counter_ns()
            c.send_raw(frame)
            response = c.read_frame()
            micros.append((time.perf_counter_ns() - t0) / 1000)
            responses.append(response)
    errors = _produce_errors(responses)
    if errors:
        raise RuntimeError(f"raw Produce via {side} ({host}:{port}) failed: {dict(errors)}")
    timed = sorted(micros[warmup:])
    return {"side": side, "topic": topic, "address": f"{host}:{port}", "requests": n,
            "p50_us": statistics.median(timed), "p99_us": timed[int(0.99 * (len(timed) - 1))],
            "mean_us": statistics.fmean(timed), **cpu}


def rtt_phase(b: Bench, s: Settings) -> dict[str, Any]:
    say(f"\n[3/5] raw Produce round trip: {s.rtt_requests} sequential 1-record requests of {RECORD_SIZE} B, "
        f"acks=all, {s.pairs} pairs")
    runs = []
    for i, side in alternating(s.pairs):
        run = {**rtt_run(b, side, s.rtt_requests), "pair": i}
        runs.append(run)
        say(f"  pair {i} {side:6}: p50 {run['p50_us']:.0f} us p99 {run['p99_us']:.0f} us "
            f"mean {run['mean_us']:.0f} us  host busy {run['host_busy_pct']:.0f}%")
    warnings = busy_warnings("raw Produce RTT", runs)
    for w in warnings:
        say(f"  WARNING: {w}")
    return {"runs": runs, "median": medians(runs, ("p50_us", "p99_us", "mean_us")), "warnings": warnings}


# -- 4. idle connections ------------------------------------------------------------------------


def _api_versions_frame() -> bytes:
    """ApiVersions v3, correlation id 1: what every Java client sends first.

    The proxy reads nothing from a client until its broker connection is up, so an
    answer proves both sockets of the session exist.
    """
    request = ApiVersionsRequest(client_software_name="txnguard-bench", client_software_version="1.0")
    header_cls = request.__header_schema__
    header = header_cls(request_api_key=i16(ApiKey.API_VERSIONS), request_api_version=i16(3), correlation_id=i32(1),
                        client_id="txnguard-bench-idle")
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(ApiVersionsRequest)(buf, request)
    return struct.pack(">i", buf.tell()) + buf.getvalue()


async def _open_idle(port: int, frame: bytes, timeout_s: float) -> asyncio.StreamWriter:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout_s)
    try:
        writer.write(frame)
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout_s))
        body = await asyncio.wait_for(reader.readexactly(size), timeout_s)
    except BaseException:
        writer.close()
        raise
    # ApiVersions responses always use header v0: correlation id, then the body's error code.
    correlation_id, error_code = struct.unpack_from(">ih", body, 0)
    if correlation_id != 1 or error_code != 0:
        writer.close()
        raise RuntimeError(f"ApiVersions answer: correlation id {correlation_id}, error {error_code}")
    return writer


async def _open_many(port: int, n: int, concurrency: int) -> tuple[list[asyncio.StreamWriter], Counter[str]]:
    frame = _api_versions_frame()
    gate = asyncio.Semaphore(concurrency)
    failures: Counter[str] = Counter()

    async def one() -> asyncio.StreamWriter | None:
        async with gate:
            try:
                return await _open_idle(port, frame, 15.0)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, RuntimeError) as e:
                failures[f"{type(e).__name__}: {e}"[:160]] += 1
                return None

    opened = await asyncio.gather(*(one() for _ in range(n)))
    return [w for w in opened if w is not None], failures


async def _close_all(writers: list[asyncio.StreamWriter]) -> None:
    for w in writers:
        w.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True), 30)


def _wait_active(admin: str, predicate: Callable[[float], bool], timeout_s: float) -> float:
    """Poll the proxy's txnguard_connections_active until `predicate` holds; return the last value."""
    end = time.monotonic() + timeout_s
    while True:
        active = metric_sum(scrape_metrics(admin), "txnguard_connections_active")
        if predicate(active) or time.monotonic() > end:
            return active
        time.sleep(0.25)


async def _idle_connections(b: Bench, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_before_kib": proxy_rss_kib(b.pid), "fds_before": open_fds(b.pid)}
    with cpu_meter(b.pid) as cpu:
        writers, failures = await _open_many(b.listen, s.idle_connections, s.open_concurrency)
    try:
        out.update(opened=len(writers), failures=dict(failures), open_s=cpu["wall_s"],
                   open_proxy_cpu_s=cpu["proxy_cpu_s"], open_host_busy_pct=cpu["host_busy_pct"])
        await asyncio.sleep(2.0)  # let the proxy settle (buffers freed, timers run) before reading memory
        out.update(rss_after_kib=proxy_rss_kib(b.pid), fds_after=open_fds(b.pid),
                   active_reported=metric_sum(scrape_metrics(b.admin), "txnguard_connections_active"))
    finally:
        await _close_all(writers)
    out["active_after_close"] = await asyncio.to_thread(_wait_active, b.admin, lambda a: a == 0, 20.0)
    out.update(rss_after_close_kib=proxy_rss_kib(b.pid), fds_after_close=open_fds(b.pid))
    opened = max(1, len(writers))
    out["kib_per_connection"] = (out["rss_after_kib"] - out["rss_before_kib"]) / opened
    return out


def idle_phase(b: Bench, s: Settings) -> dict[str, Any]:
    say(f"\n[4/5] idle connections: {s.idle_connections} clients on the bootstrap listener, one ApiVersions each")
    out = asyncio.run(_idle_connections(b, s))
    say(f"  opened {out['opened']} in {out['open_s']:.1f} s (proxy CPU {out['open_proxy_cpu_s']:.2f} s, "
        f"host busy {out['open_host_busy_pct']:.0f}%), failures {out['failures'] or 'none'}; "
        f"proxy reports {out['active_reported']:.0f} active, fds {out['fds_before']} -> {out['fds_after']}")
    say(f"  proxy RSS {out['rss_before_kib'] / 1024:.1f} MiB -> {out['rss_after_kib'] / 1024:.1f} MiB "
        f"({out['kib_per_connection']:.1f} KiB per connection); after closing all: "
        f"{out['rss_after_close_kib'] / 1024:.1f} MiB, {out['active_after_close']:.0f} active, "
        f"fds {out['fds_after_close']}")
    return out


# -- 5. saturation: as fast as the producer can, then read it all back ----------------------------


def consumer_perf_command(args: list[str]) -> list[str]:
    """`java ... org.apache.kafka.tools.ConsumerPerformance args` from the cached kafka-tools jars.

    kafka-tools has shipped ConsumerPerformance under org.apache.kafka.tools since 3.5; the
    harness's `java_command` does not list it yet, so this builds the same command line.
    """
    logs = tools_log_config()
    return ["java", f"-Xmx{TOOL_HEAP}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
            "-Duser.language=en", "-Duser.country=US",
            f"-Dlog4j.configuration=file:{logs / 'log4j.properties'}",
            f"-Dlog4j2.configurationFile={logs / 'log4j2.properties'}",
            "-cp", jars.classpath(jars.resolve("kafka-tools", JAVA_CLIENT)), f"{TOOLS_PACKAGE}.ConsumerPerformance",
            *args]


def parse_consumer_performance(stdout: str) -> dict[str, float] | None:
    """The header line and the value line ConsumerPerformance prints (without --show-detailed-stats).

    start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec. Its "MB" is a MiB.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("start.time,"):
            names = [n.strip() for n in line.split(",")]
            values = [v.strip() for v in lines[i + 1].split(",")]
            if len(values) != len(names):
                return None
            return {n: float(v) for n, v in zip(names, values, strict=True) if n not in ("start.time", "end.time")}
    return None


def end_offset(b: Bench, topic: str) -> int:
    _, host, port = raw.leader_of(b.direct_bootstrap, topic, 0)
    with raw.RawClient(host, port) as c:
        return int(c.list_offsets(topic, 0, read_committed=False))


def _through_proxy(b: Bench, before: dict[str, dict[str, float]], side: str) -> tuple[float, float, float]:
    """(MiB framed both ways, requests) since `before` (Bench.counters) through the txnguard process of `side`,
    or for the other arms through all of them (which should be ~0); and the requests through the other txnguard
    processes of a txnguard arm (0: each txnguard arm's Metadata names its own listener)."""
    after = b.counters()

    def requests(m: dict[str, float]) -> float:
        return sum(v for k, v in m.items() if k.startswith("txnguard_frames_total{") and "client_to_broker" in k)

    own = [side] if side in after else list(after)
    mib = sum(metric_sum(after[n], "txnguard_bytes_total") - metric_sum(before[n], "txnguard_bytes_total")
              for n in own) / MIB
    return (mib, sum(requests(after[n]) - requests(before[n]) for n in own),
            sum(requests(after[n]) - requests(before[n]) for n in after if n not in own))


def _relayed(b: Bench, before: tuple[int, int, int]) -> dict[str, Any]:
    """MiB the bare relay carried each way since `before` (0 without one), and what it wrote to stderr."""
    up, down, err = b.relay_counts()
    errors = ""
    if err > before[2]:
        assert b.relay is not None
        with open(b.relay.log, "rb") as f:
            f.seek(before[2])
            errors = f.read(err - before[2]).decode(errors="replace")
    return {"relay_to_upstream_mib": (up - before[0]) / MIB, "relay_to_client_mib": (down - before[1]) / MIB,
            "relay_errors": errors}


def _peer_io(b: Bench, before: tuple[float, float]) -> dict[str, float]:
    """Kroxylicious's CPU seconds since `before` (0 without it), whichever arm ran: all but its JIT
    compilers' (the route check), and its JIT compilers'."""
    other, jit = b.peer_counts()
    return {"peer_cpu_s": other - before[0], "peer_jit_cpu_s": jit - before[1]}


def _per_request(cpu: dict[str, float], requests: float) -> dict[str, float]:
    """Proxy CPU per request (and its response) and requests per MiB: what the CPU per MiB is made of."""
    return {"proxy_requests": requests,
            "proxy_cpu_us_per_request": 1e6 * cpu["proxy_cpu_s"] / requests if requests else 0.0}


@contextlib.contextmanager
def profiled(b: Bench, template: str | None, name: str) -> Iterator[None]:
    """Run `template` (a command line with {pid} and {out}) against the proxy for the block's duration.

    Meant for `py-spy record --pid {pid} -o {out} ...` or `perf record -g -p {pid} -o {out}`: both
    write their output when interrupted, so the block ends with SIGINT and a bounded wait.
    """
    if template is None:
        yield
        return
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / name
    args = [a.format(pid=b.pid, out=out) for a in template.split()]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(0.5)  # let it attach before the load starts
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        say(f"  profile: {out.name} (profiler exit {proc.returncode}) {err.decode(errors='replace').strip()[-200:]}")


def sat_produce_run(b: Bench, side: str, size: int, records: int, profile_cmd: str | None = None) -> dict[str, Any]:
    """ProducerPerformance --throughput -1: the producer (Kafka's defaults, acks=all) is the only limit."""
    topic = b.topic(f"sat{size}", side)
    before, relay_before, peer_before = b.counters(), b.relay_counts(), b.peer_counts()
    with profiled(b, profile_cmd, f"profile-{size}-produce-{b.stamp}"), cpu_meter(b.pid_of(side)) as cpu:
        r = java_producer_performance(b.bootstrap(side), topic, records, JAVA_CLIENT, record_size=size,
                                      throughput=-1, timeout_s=120 + records * size / MIB)  # >= 1 MiB/s
    via, requests, stray = _through_proxy(b, before, side)
    relayed = {**_relayed(b, relay_before), **_peer_io(b, peer_before)}
    payload = r.records * size / MIB
    written = end_offset(b, topic)
    problems = []
    if r.records != records or written != records:
        problems.append(f"produce {side} {size} B: {records} asked, the tool counted {r.records}, "
                        f"the log ends at offset {written}")
    return {**asdict(r), **cpu, **_per_request(cpu, requests), "side": side, "topic": topic, "record_size": size,
            "payload_mib": payload,
            "end_offset": written, "proxy_frame_mib": via, "stray_requests": stray, "problems": problems,
            **relayed, "relay_payload_mib": relayed["relay_to_upstream_mib"],
            "proxy_cpu_ms_per_mib": 1000 * cpu["proxy_cpu_s"] / payload}


def sat_consume_run(b: Bench, side: str, size: int, topic: str, records: int,
                    profile_cmd: str | None = None) -> dict[str, Any]:
    """ConsumerPerformance over `topic` from the beginning (its own new group), up to `records` records."""
    args = ["--bootstrap-server", b.bootstrap(side), "--topic", topic, "--messages", str(records),
            "--timeout", str(SAT_CONSUMER_TIMEOUT_MS), "--group", f"bench-{uuid.uuid4().hex[:10]}"]
    before, relay_before, peer_before = b.counters(), b.relay_counts(), b.peer_counts()
    with profiled(b, profile_cmd, f"profile-{size}-consume-{b.stamp}"), cpu_meter(b.pid_of(side)) as cpu:
        run = run_tool(consumer_perf_command(args),
                       timeout_s=60 + 2 * SAT_CONSUMER_TIMEOUT_MS / 1000 + records * size / MIB)
    via, requests, stray = _through_proxy(b, before, side)
    relayed = {**_relayed(b, relay_before), **_peer_io(b, peer_before)}
    stats = parse_consumer_performance(run.stdout)
    if stats is None:
        raise RuntimeError(f"ConsumerPerformance printed no result:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    consumed_msgs = int(stats["data.consumed.in.nMsg"])
    consumed_mib = stats["data.consumed.in.MB"]
    expected_mib = records * size / MIB
    problems = []
    # The tool counts key + value bytes; ProducerPerformance writes no key, so bytes = records x size.
    if consumed_msgs != records or abs(consumed_mib - expected_mib) > 0.001 + 1e-6 * expected_mib:
        problems.append(f"consume {side} {size} B: read {consumed_msgs} records / {consumed_mib:.4f} MiB, "
                        f"produced {records} / {expected_mib:.4f} MiB")
    if "WARNING" in run.stdout:
        problems.append(f"consume {side} {size} B: " + next(x for x in run.stdout.splitlines() if "WARNING" in x))
    payload = max(consumed_mib, 1e-9)
    return {**cpu, **_per_request(cpu, requests), "side": side, "topic": topic, "record_size": size,
            "records": records,
            "consumed_records": consumed_msgs, "consumed_mib": consumed_mib,
            "mb_per_sec": stats["MB.sec"], "fetch_mb_per_sec": stats["fetch.MB.sec"],
            "fetch_records_per_sec": stats["fetch.nMsg.sec"], "rebalance_ms": stats["rebalance.time.ms"],
            "fetch_ms": stats["fetch.time.ms"], "proxy_frame_mib": via, "stray_requests": stray,
            "problems": problems, **relayed,
            "relay_payload_mib": relayed["relay_to_client_mib"],
            "proxy_cpu_ms_per_mib": 1000 * cpu["proxy_cpu_s"] / payload}


def _route_problems(run: dict[str, Any], payload_mib: float) -> list[str]:
    """Did the run really go where its side says? The txnguard processes' and the bare relay's byte counters tell."""
    via, side = run["proxy_frame_mib"], run["side"]
    out = []
    if side in TXNGUARD_SIDES and via < 0.95 * payload_mib:
        out.append(f"{side} run carried only {via:.1f} of {payload_mib:.1f} MiB through its txnguard process")
    if side not in TXNGUARD_SIDES and via > 0.01 * payload_mib + 1:
        out.append(f"{side} run sent {via:.1f} MiB through txnguard")
    if run.get("stray_requests", 0.0) > 0:
        out.append(f"{side} run sent {run['stray_requests']:.0f} requests through another txnguard arm's process")
    # The payload's own direction (to the broker when producing, to the client when consuming) carries
    # the records plus their framing: never less than the payload.
    if run.get("relay_errors"):
        lines = run["relay_errors"].strip().splitlines()
        out.append(f"{side} run: the bare relay wrote {len(lines)} lines to stderr, the last: {lines[-1][:200]}")
    relayed = run.get("relay_payload_mib", 0.0)
    both = run.get("relay_to_upstream_mib", 0.0) + run.get("relay_to_client_mib", 0.0)
    if side == "relay" and relayed < payload_mib:
        out.append(f"{side} run: the bare relay carried only {relayed:.1f} of {payload_mib:.1f} MiB")
    if side != "relay" and both > 0.01 * payload_mib + 1:
        out.append(f"{side} run sent {both:.1f} MiB through the bare relay")
    # Kroxylicious counts no bytes (see Bench.peer_counts): its Metadata rewrite was checked at start, and
    # its CPU tells which runs it carried: a payload costs it several ms/MiB; idle, its JVM spends little
    # (its JIT compilers, which go on after a run of its own, are not counted here).
    peer_cpu = run.get("peer_cpu_s", 0.0)
    if side == PEER and peer_cpu < max(0.02, 1e-3 * payload_mib):
        out.append(f"{side} run: Kroxylicious used only {peer_cpu:.2f} s of CPU for {payload_mib:.1f} MiB")
    if side != PEER and peer_cpu > 0.25 + 2e-3 * payload_mib:
        out.append(f"{side} run: Kroxylicious used {peer_cpu:.2f} s of CPU meanwhile")
    return out


def _sat_line(kind: str, label: str, run: dict[str, Any]) -> str:
    if kind == "produce":
        rate = f"{run['records_per_sec']:9.0f} rec/s {run['mb_per_sec']:7.2f} MB/s  p99 {run['p99_ms']} ms"
    else:
        rate = (f"{run['fetch_records_per_sec']:9.0f} rec/s {run['fetch_mb_per_sec']:7.2f} MB/s "
                f"(fetch; {run['consumed_mib']:.1f} MiB read, join {run['rebalance_ms']:.0f} ms)")
    if run["side"] == "relay":
        carried = (f"relay CPU {run['proxy_cpu_s']:.2f} s [sys {run['proxy_sys_s']:.2f}] "
                   f"({run['proxy_cpu_ms_per_mib']:.2f} ms/MiB, {run['relay_to_upstream_mib']:.0f} MiB up / "
                   f"{run['relay_to_client_mib']:.0f} MiB down relayed, {run['proxy_frame_mib']:.0f} MiB framed)")
    elif run["side"] == PEER:
        carried = (f"Kroxylicious CPU {run['proxy_cpu_s']:.2f} s [sys {run['proxy_sys_s']:.2f}] "
                   f"({run['proxy_cpu_ms_per_mib']:.2f} ms/MiB)")
    else:
        carried = (f"proxy CPU {run['proxy_cpu_s']:.2f} s [sys {run['proxy_sys_s']:.2f}] "
                   f"({run['proxy_cpu_ms_per_mib']:.2f} ms/MiB, {run['proxy_frame_mib']:.0f} MiB framed, "
                   f"{run['proxy_requests']:.0f} requests, {run['proxy_cpu_us_per_request']:.0f} us each)")
    return (f"  {label} {kind:7} {run['side']:6}: {rate}  {carried}  "
            f"wall {run['wall_s']:.1f} s  host busy {run['host_busy_pct']:.0f}%"
            + ("  PROBLEM" if run["problems"] else ""))


def sat_pair(b: Bench, size: int, records: int, order: tuple[str, ...], label: str,
             profile_cmd: str | None = None) -> list[dict[str, Any]]:
    """Produce on each side in `order`, then consume each side's topic in the same order.

    The profiler, if any, attaches to the proxy's runs only."""
    runs = []
    produced: dict[str, dict[str, Any]] = {}
    for side in order:
        # The profiler covers the tool run only (not the bench's own /metrics scrapes around it).
        run = sat_produce_run(b, side, size, records, profile_cmd if side == "proxy" else None)
        run["problems"] += _route_problems(run, run["payload_mib"])
        produced[side] = run
        runs.append({**run, "kind": "produce"})
        say(_sat_line("produce", label, run))
    for side in order:
        run = sat_consume_run(b, side, size, produced[side]["topic"], records, profile_cmd if side == "proxy" else None)
        run["problems"] += _route_problems(run, run["consumed_mib"])
        runs.append({**run, "kind": "consume"})
        say(_sat_line("consume", label, run))
    return runs


def _median(runs: list[dict[str, Any]], kind: str, side: str, key: str) -> float:
    return float(statistics.median(r[key] for r in runs if r["kind"] == kind and r["side"] == side))


def saturation_size(b: Bench, s: Settings, size: int) -> dict[str, Any]:
    records = max(1000, int(s.sat_mib * MIB / size))
    warm = max(500, int(records * SAT_WARMUP_SHARE))
    say(f"\n  -- {size} B records: {records} per run ({records * size / MIB:.0f} MiB), warm-up {warm} per side, "
        f"{s.rounds} rounds --")
    sides = s.sat_sides
    # Untimed: JIT of the broker, the page cache, the proxy's first connections and caches.
    sat_pair(b, size, warm, sides, "warm-up")
    runs = []
    for i in range(s.rounds):
        # Which side goes first rotates (with two sides: alternates); with three sides and three rounds each
        # side takes each place once.
        order = rotated(sides, i)
        profile_cmd = s.profile_cmd if i == 0 else None  # a profiler costs CPU: its round's figures are not clean
        runs += [{**r, "round": i} for r in sat_pair(b, size, records, order, f"round {i}", profile_cmd)]
    keys = {"produce": ("records_per_sec", "mb_per_sec", "avg_latency_ms", "p99_ms", "proxy_cpu_s",
                        "proxy_cpu_ms_per_mib", "wall_s", "host_busy_pct", "proxy_frame_mib", "proxy_user_s",
                        "proxy_sys_s", "proxy_requests", "proxy_cpu_us_per_request", "payload_mib"),
            "consume": ("fetch_mb_per_sec", "mb_per_sec", "fetch_records_per_sec", "proxy_cpu_s",
                        "proxy_cpu_ms_per_mib", "wall_s", "fetch_ms", "rebalance_ms", "host_busy_pct",
                        "proxy_frame_mib", "proxy_user_s", "proxy_sys_s", "proxy_requests",
                        "proxy_cpu_us_per_request")}
    med = {kind: {side: {k: _median(runs, kind, side, k) for k in ks} for side in sides} for kind, ks in keys.items()}
    # Each round's own proxied/direct ratio, so a reader sees the spread behind the ratio of medians.
    paired: dict[str, list[float]] = {}
    paired_floor: dict[str, dict[str, list[float]]] = {}
    paired_peer: dict[str, dict[str, list[float]]] = {}
    for kind, key in (("produce", "mb_per_sec"), ("consume", "fetch_mb_per_sec")):
        paired[kind] = []
        paired_floor[kind] = {"relay/direct": [], "proxy/relay": []}
        paired_peer[kind] = {f"{PEER}/direct": [], f"proxy/{PEER}": []}
        for i in range(s.rounds):
            by_side = {r["side"]: r[key] for r in runs if r["kind"] == kind and r["round"] == i}
            paired[kind].append(by_side["proxy"] / by_side["direct"])
            if "relay" in by_side:
                paired_floor[kind]["relay/direct"].append(by_side["relay"] / by_side["direct"])
                paired_floor[kind]["proxy/relay"].append(by_side["proxy"] / by_side["relay"])
            if PEER in by_side:
                paired_peer[kind][f"{PEER}/direct"].append(by_side[PEER] / by_side["direct"])
                paired_peer[kind][f"proxy/{PEER}"].append(by_side["proxy"] / by_side[PEER])
    warnings = [p for r in runs for p in r["problems"]]
    for kind in ("produce", "consume"):
        busy = statistics.median(r["host_busy_pct"] for r in runs if r["kind"] == kind)
        if busy < SAT_IDLE_BUSY_PCT:
            warnings.append(f"saturation {size} B {kind}: the machine was only {busy:.0f}% busy (median): something "
                            "other than CPU limited the runs, so they may not measure the most either side can carry")
    for w in warnings:
        say(f"  WARNING: {w}")
    out = {"record_size": size, "records": records, "warmup_records": warm, "runs": runs, "median": med,
           "paired_ratios": paired, "warnings": warnings}
    if "relay" in sides:
        out["paired_ratios_floor"] = paired_floor
    if PEER in sides:
        out["paired_ratios_peer"] = paired_peer
    if set(EXTRA_ARMS) & set(sides):  # the extra txnguard arms against direct and against txnguard
        out["paired_ratios_arms"] = {kind: extra_pairs(runs, s.rounds, sides, key, kind=kind)
                                     for kind, key in (("produce", "mb_per_sec"), ("consume", "fetch_mb_per_sec"))}
    return out


def saturation_phase(b: Bench, s: Settings) -> dict[str, Any]:
    say(f"\n[5/5] saturation: ProducerPerformance --throughput -1 (acks=all, Kafka's producer defaults), then "
        f"ConsumerPerformance over what it wrote; {s.sat_mib:g} MiB per run, record sizes "
        f"{', '.join(str(x) for x in s.record_sizes)} B, {s.rounds} rounds, "
        + f"arms {', '.join(s.sat_sides)} in rotation")
    sizes = [saturation_size(b, s, size) for size in s.record_sizes]
    return {"sizes": sizes, "warnings": [w for x in sizes for w in x["warnings"]]}


def _size_name(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def saturation_rows(sat: dict[str, Any]) -> list[Row]:
    rows = []
    for x in sat["sizes"]:
        n = _size_name(x["record_size"])
        p, c = x["median"]["produce"], x["median"]["consume"]
        pr = p["proxy"]["mb_per_sec"] / p["direct"]["mb_per_sec"]
        cr = c["proxy"]["fetch_mb_per_sec"] / c["direct"]["fetch_mb_per_sec"]
        pcpu, ccpu = p["proxy"]["proxy_cpu_ms_per_mib"], c["proxy"]["proxy_cpu_ms_per_mib"]
        rows += [
            Row(f"{n}: produce at saturation (MB/s)", p["direct"]["mb_per_sec"], p["proxy"]["mb_per_sec"], pr,
                "ratio", f"ratio >= {TARGET_SAT_RATIO}", pr >= TARGET_SAT_RATIO),
            Row(f"{n}: produce at saturation (records/s)", p["direct"]["records_per_sec"],
                p["proxy"]["records_per_sec"], p["proxy"]["records_per_sec"] / p["direct"]["records_per_sec"],
                "ratio", "", None),
            Row(f"{n}: consume at saturation (fetch MB/s)", c["direct"]["fetch_mb_per_sec"],
                c["proxy"]["fetch_mb_per_sec"], cr, "ratio", f"ratio >= {TARGET_SAT_RATIO}", cr >= TARGET_SAT_RATIO),
            Row(f"{n}: proxy CPU per MiB produced (ms)", None, pcpu, None, "",
                f"<= {TARGET_SAT_PRODUCE_MS_PER_MIB:g} ms/MiB", pcpu <= TARGET_SAT_PRODUCE_MS_PER_MIB),
            Row(f"{n}: proxy CPU per MiB consumed (ms)", None, ccpu, None, "",
                f"<= {TARGET_SAT_CONSUME_MS_PER_MIB:g} ms/MiB", ccpu <= TARGET_SAT_CONSUME_MS_PER_MIB),
            Row(f"{n}: proxy CPU per Produce request and response (us)", None,
                p["proxy"]["proxy_cpu_us_per_request"], None, "", "", None),
            Row(f"{n}: Produce requests per MiB", None,
                p["proxy"]["proxy_requests"] / max(p["proxy"]["payload_mib"], 1e-9), None, "", "", None),
            Row(f"{n}: proxy % of a core during produce", None,
                100 * p["proxy"]["proxy_cpu_s"] / p["proxy"]["wall_s"], None, "", "", None),
            Row(f"{n}: proxy % of a core during consume", None,
                100 * c["proxy"]["proxy_cpu_s"] / c["proxy"]["wall_s"], None, "", "", None),
            Row(f"{n}: kernel share of proxy CPU, produce (%)", None,
                100 * p["proxy"]["proxy_sys_s"] / max(p["proxy"]["proxy_cpu_s"], 1e-9), None, "", "", None),
            Row(f"{n}: kernel share of proxy CPU, consume (%)", None,
                100 * c["proxy"]["proxy_sys_s"] / max(c["proxy"]["proxy_cpu_s"], 1e-9), None, "", "", None),
            Row(f"{n}: machine busy during produce (%)", p["direct"]["host_busy_pct"], p["proxy"]["host_busy_pct"],
                None, "", "", None),
            Row(f"{n}: machine busy during consume (%)", c["direct"]["host_busy_pct"], c["proxy"]["host_busy_pct"],
                None, "", "", None),
            Row(f"{n}: producer latency at saturation avg (ms)", p["direct"]["avg_latency_ms"],
                p["proxy"]["avg_latency_ms"], p["proxy"]["avg_latency_ms"] - p["direct"]["avg_latency_ms"], "diff",
                "", None),
        ]
        if "relay" in p:
            rows += floor_rows(n, p, c)
        if PEER in p:
            rows += sat_peer_rows(n, p, c)
        for side in EXTRA_ARMS:
            if side in p:
                rows += sat_arm_rows(n, p, c, side)
    return rows


def sat_arm_rows(n: str, p: dict[str, dict[str, float]], c: dict[str, dict[str, float]], side: str) -> list[Row]:
    """An extra txnguard arm beside direct and txnguard ("X | Y": X in the direct column, Y in the proxy one)."""
    label = _arm_label(side)
    pd, pa, pp = (p[x]["mb_per_sec"] for x in ("direct", side, "proxy"))
    cd, ca, cp = (c[x]["fetch_mb_per_sec"] for x in ("direct", side, "proxy"))
    pac, ppc = p[side]["proxy_cpu_ms_per_mib"], p["proxy"]["proxy_cpu_ms_per_mib"]
    cac, cpc = c[side]["proxy_cpu_ms_per_mib"], c["proxy"]["proxy_cpu_ms_per_mib"]
    return [
        Row(f"{n}: produce at saturation (MB/s), direct | {label}", pd, pa, pa / pd, "ratio", "", None),
        Row(f"{n}: consume at saturation (fetch MB/s), direct | {label}", cd, ca, ca / cd, "ratio", "", None),
        Row(f"{n}: produce at saturation (MB/s), txnguard | {label}", pp, pa, pa / pp, "ratio", "", None),
        Row(f"{n}: consume at saturation (fetch MB/s), txnguard | {label}", cp, ca, ca / cp, "ratio", "", None),
        Row(f"{n}: CPU per MiB produced (ms), txnguard | {label}", ppc, pac, pac / max(ppc, 1e-9), "ratio", "",
            None),
        Row(f"{n}: CPU per MiB consumed (ms), txnguard | {label}", cpc, cac, cac / max(cpc, 1e-9), "ratio", "",
            None),
    ]


def sat_peer_rows(n: str, p: dict[str, dict[str, float]], c: dict[str, dict[str, float]]) -> list[Row]:
    """Kroxylicious beside direct and txnguard ("X | Y": X in the direct column, Y in the proxy one)."""
    pd, pk, pp = (p[side]["mb_per_sec"] for side in ("direct", PEER, "proxy"))
    cd, ck, cp = (c[side]["fetch_mb_per_sec"] for side in ("direct", PEER, "proxy"))
    pkc, ppc = p[PEER]["proxy_cpu_ms_per_mib"], p["proxy"]["proxy_cpu_ms_per_mib"]
    ckc, cpc = c[PEER]["proxy_cpu_ms_per_mib"], c["proxy"]["proxy_cpu_ms_per_mib"]
    return [
        Row(f"{n}: produce at saturation (MB/s), direct | Kroxylicious", pd, pk, pk / pd, "ratio", "", None),
        Row(f"{n}: consume at saturation (fetch MB/s), direct | Kroxylicious", cd, ck, ck / cd, "ratio", "", None),
        Row(f"{n}: produce at saturation (MB/s), Kroxylicious | txnguard", pk, pp, pp / pk, "ratio",
            "ratio >= 1", pp >= pk),
        Row(f"{n}: consume at saturation (fetch MB/s), Kroxylicious | txnguard", ck, cp, cp / ck, "ratio",
            "ratio >= 1", cp >= ck),
        Row(f"{n}: CPU per MiB produced (ms), Kroxylicious | txnguard", pkc, ppc, ppc / pkc, "ratio",
            "below Kroxylicious", ppc < pkc),
        Row(f"{n}: CPU per MiB consumed (ms), Kroxylicious | txnguard", ckc, cpc, cpc / ckc, "ratio",
            "below Kroxylicious", cpc < ckc),
        Row(f"{n}: kernel share of Kroxylicious CPU, produce (%)", None,
            100 * p[PEER]["proxy_sys_s"] / max(p[PEER]["proxy_cpu_s"], 1e-9), None, "", "", None),
    ]


def _gap_share(direct: float, relay: float, proxy: float) -> float | None:
    """Of the throughput txnguard loses against direct, the share it loses against the bare relay (%).

    None below a 5 % gap: a share of a gap smaller than the rounds' spread is noise (it read 2,732 % once).
    """
    return 100 * (relay - proxy) / (direct - proxy) if direct - proxy >= 0.05 * direct else None


def floor_rows(n: str, p: dict[str, dict[str, float]], c: dict[str, dict[str, float]]) -> list[Row]:
    """The bare relay beside direct and txnguard: "X | Y" rows put X in the direct column, Y in the proxy one."""
    pd, pr, pp = (p[side]["mb_per_sec"] for side in FLOOR_SIDES)
    cd, cr, cp = (c[side]["fetch_mb_per_sec"] for side in FLOOR_SIDES)
    prc, ppc = p["relay"]["proxy_cpu_ms_per_mib"], p["proxy"]["proxy_cpu_ms_per_mib"]
    crc, cpc = c["relay"]["proxy_cpu_ms_per_mib"], c["proxy"]["proxy_cpu_ms_per_mib"]
    return [
        Row(f"{n}: produce at saturation (MB/s), direct | bare relay", pd, pr, pr / pd, "ratio",
            f"ratio >= {TARGET_SAT_RATIO}", pr / pd >= TARGET_SAT_RATIO),
        Row(f"{n}: consume at saturation (fetch MB/s), direct | bare relay", cd, cr, cr / cd, "ratio",
            f"ratio >= {TARGET_SAT_RATIO}", cr / cd >= TARGET_SAT_RATIO),
        Row(f"{n}: produce at saturation (MB/s), bare relay | txnguard", pr, pp, pp / pr, "ratio", "", None),
        Row(f"{n}: consume at saturation (fetch MB/s), bare relay | txnguard", cr, cp, cp / cr, "ratio", "", None),
        Row(f"{n}: txnguard's own share of its produce gap (%)", None, _gap_share(pd, pr, pp), None, "", "", None),
        Row(f"{n}: txnguard's own share of its consume gap (%)", None, _gap_share(cd, cr, cp), None, "", "", None),
        Row(f"{n}: bare relay CPU per MiB produced (ms)", None, prc, None, "",
            f"<= {TARGET_SAT_PRODUCE_MS_PER_MIB:g} ms/MiB", prc <= TARGET_SAT_PRODUCE_MS_PER_MIB),
        Row(f"{n}: bare relay CPU per MiB consumed (ms)", None, crc, None, "",
            f"<= {TARGET_SAT_CONSUME_MS_PER_MIB:g} ms/MiB", crc <= TARGET_SAT_CONSUME_MS_PER_MIB),
        Row(f"{n}: CPU per MiB produced (ms), bare relay | txnguard", prc, ppc, ppc - prc, "diff", "", None),
        Row(f"{n}: CPU per MiB consumed (ms), bare relay | txnguard", crc, cpc, cpc - crc, "diff", "", None),
        Row(f"{n}: kernel share of bare relay CPU, produce (%)", None,
            100 * p["relay"]["proxy_sys_s"] / max(p["relay"]["proxy_cpu_s"], 1e-9), None, "", "", None),
        Row(f"{n}: machine busy, bare relay: produce | consume (%)", p["relay"]["host_busy_pct"],
            c["relay"]["host_busy_pct"], None, "", "", None),
    ]


def saturation_notes(sat: dict[str, Any]) -> list[str]:
    out = []
    for x in sat["sizes"]:
        pr = ", ".join(f"x{r:.3f}" for r in x["paired_ratios"]["produce"])
        cr = ", ".join(f"x{r:.3f}" for r in x["paired_ratios"]["consume"])
        out.append(f"{_size_name(x['record_size'])}: per-round proxied/direct: produce {pr}; consume {cr}")
        if "paired_ratios_floor" in x:
            f = {kind: {k: ", ".join(f"x{r:.3f}" for r in v) for k, v in x["paired_ratios_floor"][kind].items()}
                 for kind in ("produce", "consume")}
            out.append(f"{_size_name(x['record_size'])}: per-round bare relay/direct: produce "
                       f"{f['produce']['relay/direct']}; consume {f['consume']['relay/direct']}; "
                       f"proxied/bare relay: produce {f['produce']['proxy/relay']}; "
                       f"consume {f['consume']['proxy/relay']}")
        if "paired_ratios_peer" in x:
            k = {kind: {key: ", ".join(f"x{r:.3f}" for r in v) for key, v in x["paired_ratios_peer"][kind].items()}
                 for kind in ("produce", "consume")}
            out.append(f"{_size_name(x['record_size'])}: per-round Kroxylicious/direct: produce "
                       f"{k['produce'][f'{PEER}/direct']}; consume {k['consume'][f'{PEER}/direct']}; "
                       f"txnguard/Kroxylicious: produce {k['produce'][f'proxy/{PEER}']}; "
                       f"consume {k['consume'][f'proxy/{PEER}']}")
        for name in x.get("paired_ratios_arms", {}).get("produce", {}):
            out.append(f"{_size_name(x['record_size'])}: per-round {_pair_label(name)}: produce "
                       f"{_ratios_text(x['paired_ratios_arms']['produce'][name])}; consume "
                       f"{_ratios_text(x['paired_ratios_arms']['consume'][name])}")
    return out


# -- 6. a transactional producer at saturation ----------------------------------------------------


def rotated(sides: tuple[str, ...], i: int) -> tuple[str, ...]:
    """Round i's order: the arms rotate, so with N arms and N rounds each arm takes each place once."""
    return sides[i % len(sides):] + sides[:i % len(sides)]


def per_round(runs: list[dict[str, Any]], key: str, rounds: int, num: str, den: str,
              **match: Any) -> list[float]:
    """Each round's own num/den ratio of `key` (among the runs matching `match`), so the spread shows."""
    out = []
    for i in range(rounds):
        by_side = {r["side"]: r[key] for r in runs if r["round"] == i and all(r[k] == v for k, v in match.items())}
        if num in by_side and den in by_side and by_side[den]:
            out.append(by_side[num] / by_side[den])
    return out


def extra_pairs(runs: list[dict[str, Any]], rounds: int, sides: tuple[str, ...], key: str,
                **match: Any) -> dict[str, list[float]]:
    """Each round's ratio of every extra txnguard arm in `sides` to direct and to the txnguard arm."""
    return {f"{side}/{other}": per_round(runs, key, rounds, side, other, **match)
            for side in EXTRA_ARMS if side in sides for other in ("direct", "proxy")}


def _ratios_text(ratios: list[float]) -> str:
    return ", ".join(f"x{r:.3f}" for r in ratios)


def _arm_label(side: str) -> str:
    return {"direct": "direct", "relay": "bare relay", "proxy": "txnguard", GENERAL: "txnguard general path",
            AUDIT_ON: "txnguard audit on", FOLLOWER_LIVE: "txnguard follower long-polling", PEER: "Kroxylicious"}[side]


def _cpu_label(side: str) -> str:
    return {"relay": "relay CPU", PEER: "Kroxylicious CPU"}.get(side, "proxy CPU")


def txn_run(b: Bench, side: str, records: int) -> dict[str, Any]:
    """Transactional ProducerPerformance, unthrottled, committing every TXN_DURATION_MS.

    One partition, so each committed transaction left exactly one commit marker in the log:
    transactions = end offset - records.
    """
    topic = b.topic("txn", side)
    before, relay_before, peer_before = b.counters(), b.relay_counts(), b.peer_counts()
    with cpu_meter(b.pid_of(side)) as cpu:
        r = java_producer_performance(
            b.bootstrap(side), topic, records, JAVA_CLIENT, record_size=TXN_RECORD_SIZE, throughput=-1,
            transactional_id=f"bench-txn-{side}-{uuid.uuid4().hex[:8]}", transaction_duration_ms=TXN_DURATION_MS,
            timeout_s=120 + records * TXN_RECORD_SIZE / MIB)
    via, requests, stray = _through_proxy(b, before, side)
    relayed = {**_relayed(b, relay_before), **_peer_io(b, peer_before)}
    payload = r.records * TXN_RECORD_SIZE / MIB
    written = end_offset(b, topic)
    stable = stable_offset(b, topic)
    transactions = written - r.records
    problems = []
    if r.records != records or transactions < 1 or stable != written:
        problems.append(f"txn {side}: {records} asked, the tool counted {r.records}, the log ends at {written} "
                        f"(last stable offset {stable}): {transactions} commit markers")
    run = {**asdict(r), **cpu, **_per_request(cpu, requests), **relayed, "side": side, "topic": topic,
           "payload_mib": payload, "end_offset": written, "transactions": transactions, "proxy_frame_mib": via,
           "stray_requests": stray,
           "relay_payload_mib": relayed["relay_to_upstream_mib"], "problems": problems,
           "proxy_cpu_ms_per_mib": 1000 * cpu["proxy_cpu_s"] / payload,
           "proxy_cpu_ms_per_txn": 1000 * cpu["proxy_cpu_s"] / max(transactions, 1)}
    run["problems"] += _route_problems(run, payload)
    return run


def stable_offset(b: Bench, topic: str) -> int:
    _, host, port = raw.leader_of(b.direct_bootstrap, topic, 0)
    with raw.RawClient(host, port) as c:
        return int(c.list_offsets(topic, 0, read_committed=True))


def _txn_line(label: str, run: dict[str, Any]) -> str:
    cpu = "" if run["side"] == "direct" else (
        f"  {_cpu_label(run['side'])} {run['proxy_cpu_s']:.2f} s [sys {run['proxy_sys_s']:.2f}] "
        f"({run['proxy_cpu_ms_per_mib']:.2f} ms/MiB, {run['proxy_cpu_ms_per_txn']:.3f} ms/txn)")
    return (f"  {label} {run['side']:12}: {run['records_per_sec']:9.0f} rec/s {run['mb_per_sec']:6.2f} MB/s "
            f"p99 {run['p99_ms']} ms, {run['transactions']} transactions{cpu}  wall {run['wall_s']:.1f} s  "
            f"host busy {run['host_busy_pct']:.0f}%" + ("  PROBLEM" if run["problems"] else ""))


TXN_KEYS = ("records_per_sec", "mb_per_sec", "avg_latency_ms", "p99_ms", "transactions", "proxy_cpu_s",
            "proxy_sys_s", "proxy_cpu_ms_per_mib", "proxy_cpu_ms_per_txn", "wall_s", "host_busy_pct")


def txn_phase(b: Bench, s: Settings) -> dict[str, Any]:
    sides = s.sat_sides
    say(f"\n[6] transactional producer: ProducerPerformance --throughput -1 --transaction-duration-ms "
        f"{TXN_DURATION_MS}, {s.txn_records} x {TXN_RECORD_SIZE} B per run, acks=all, {s.rounds} rounds, "
        f"arms {', '.join(sides)} in rotation")
    warm = max(1000, s.txn_records // 4)
    for side in sides:  # untimed: the transaction coordinator's first producer ids, JIT, connections
        # The peer's JIT compiles for seconds of load: two runs' worth first (as the loops part gives it).
        say(_txn_line("warm-up", txn_run(b, side, 2 * s.txn_records if side == PEER else warm)))
    if s.profile_cmd:  # an extra, untimed run: a profiler's cost never lands in the figures
        with profiled(b, s.profile_cmd, f"profile-txn-{b.stamp}"):
            say(_txn_line("profiled", txn_run(b, "proxy", s.txn_records)))
    runs = []
    for i in range(s.rounds):
        for side in rotated(sides, i):
            run = {**txn_run(b, side, s.txn_records), "round": i}
            runs.append(run)
            say(_txn_line(f"round {i}", run))
    med = {side: {k: float(statistics.median(r[k] for r in runs if r["side"] == side)) for k in TXN_KEYS}
           for side in sides}
    paired = {f"{side}/direct": per_round(runs, "records_per_sec", s.rounds, side, "direct")
              for side in sides if side != "direct"}
    if PEER in sides:
        paired[f"proxy/{PEER}"] = per_round(runs, "records_per_sec", s.rounds, "proxy", PEER)
    paired.update(extra_pairs(runs, s.rounds, sides, "records_per_sec"))
    warnings = [p for r in runs for p in r["problems"]]
    for w in warnings:
        say(f"  WARNING: {w}")
    return {"record_size": TXN_RECORD_SIZE, "transaction_duration_ms": TXN_DURATION_MS,
            "records": s.txn_records, "runs": runs, "median": med, "paired_ratios": paired, "warnings": warnings}


def txn_rows(txn: dict[str, Any]) -> list[Row]:
    med = txn["median"]
    d = med["direct"]
    rows = [Row("txn producer (records/s), direct | txnguard", d["records_per_sec"], med["proxy"]["records_per_sec"],
                med["proxy"]["records_per_sec"] / d["records_per_sec"], "ratio", "ratio >= 0.95",
                med["proxy"]["records_per_sec"] >= 0.95 * d["records_per_sec"])]
    for side in ("relay", PEER):
        if side in med:
            rows.append(Row(f"txn producer (records/s), direct | {_arm_label(side)}", d["records_per_sec"],
                            med[side]["records_per_sec"], med[side]["records_per_sec"] / d["records_per_sec"],
                            "ratio", "", None))
    if PEER in med:
        k, p = med[PEER], med["proxy"]
        rows += [
            Row("txn producer (records/s), Kroxylicious | txnguard", k["records_per_sec"], p["records_per_sec"],
                p["records_per_sec"] / k["records_per_sec"], "ratio", "ratio >= 1",
                p["records_per_sec"] >= k["records_per_sec"]),
            Row("txn producer CPU per MiB (ms), Kroxylicious | txnguard", k["proxy_cpu_ms_per_mib"],
                p["proxy_cpu_ms_per_mib"], p["proxy_cpu_ms_per_mib"] / k["proxy_cpu_ms_per_mib"], "ratio",
                "below Kroxylicious", p["proxy_cpu_ms_per_mib"] < k["proxy_cpu_ms_per_mib"]),
            Row("txn producer CPU per transaction (ms), Kroxylicious | txnguard", k["proxy_cpu_ms_per_txn"],
                p["proxy_cpu_ms_per_txn"], p["proxy_cpu_ms_per_txn"] / k["proxy_cpu_ms_per_txn"], "ratio", "", None),
        ]
    else:
        rows.append(Row("txn producer CPU per MiB (ms)", None, med["proxy"]["proxy_cpu_ms_per_mib"], None, "", "",
                        None))
    if "relay" in med:
        rows.append(Row("txn producer CPU per MiB (ms), bare relay | txnguard", med["relay"]["proxy_cpu_ms_per_mib"],
                        med["proxy"]["proxy_cpu_ms_per_mib"],
                        med["proxy"]["proxy_cpu_ms_per_mib"] - med["relay"]["proxy_cpu_ms_per_mib"], "diff", "", None))
    rows.append(Row("txn producer transactions per run, direct | txnguard", d["transactions"],
                    med["proxy"]["transactions"], None, "", "", None))
    for side in EXTRA_ARMS:
        if side in med:
            a, p, label = med[side], med["proxy"], _arm_label(side)
            rows += [
                Row(f"txn producer (records/s), direct | {label}", d["records_per_sec"], a["records_per_sec"],
                    a["records_per_sec"] / d["records_per_sec"], "ratio", "", None),
                Row(f"txn producer CPU per MiB (ms), txnguard | {label}", p["proxy_cpu_ms_per_mib"],
                    a["proxy_cpu_ms_per_mib"], a["proxy_cpu_ms_per_mib"] / max(p["proxy_cpu_ms_per_mib"], 1e-9),
                    "ratio", "", None),
                Row(f"txn producer CPU per transaction (ms), txnguard | {label}", p["proxy_cpu_ms_per_txn"],
                    a["proxy_cpu_ms_per_txn"], a["proxy_cpu_ms_per_txn"] / max(p["proxy_cpu_ms_per_txn"], 1e-9),
                    "ratio", "", None),
            ]
    return rows


# -- 7. one-record transaction loops per client family --------------------------------------------


def loop_run(b: Bench, side: str, family: str, topic: str, transactions: int) -> dict[str, Any]:
    before, relay_before, peer_before = b.counters(), b.relay_counts(), b.peer_counts()
    with cpu_meter(b.pid_of(side)) as cpu:
        result = run_loop(family, b.bootstrap(side), topic, f"bench-loop-{family}-{side}-{uuid.uuid4().hex[:8]}",
                          transactions)
    _, requests, stray = _through_proxy(b, before, side)
    relayed = {**_relayed(b, relay_before), **_peer_io(b, peer_before)}
    problems = []
    # Route: every transaction is several requests (AddPartitionsToTxn, Produce, EndTxn), each tens of bytes.
    if side in TXNGUARD_SIDES and requests < 3 * result.transactions:
        problems.append(f"loop {family} via {_arm_label(side)}: only {requests:.0f} requests through it")
    if side not in TXNGUARD_SIDES and requests > 0:
        problems.append(f"loop {family} {side}: {requests:.0f} requests through txnguard")
    if stray > 0:
        problems.append(f"loop {family} {side}: {stray:.0f} requests through another txnguard arm's process")
    carried = relayed["relay_to_upstream_mib"] * MIB
    if side == "relay" and carried < 100 * result.transactions:
        problems.append(f"loop {family} via the bare relay: only {carried:.0f} bytes carried")
    if side != "relay" and carried > 64 * 1024:
        problems.append(f"loop {family} {side}: {carried:.0f} bytes through the bare relay")
    if side == PEER and relayed["peer_cpu_s"] < 0.02:
        problems.append(f"loop {family} via Kroxylicious: it used only {relayed['peer_cpu_s']:.2f} s of CPU")
    if side != PEER and relayed["peer_cpu_s"] > 0.25:
        problems.append(f"loop {family} {side}: Kroxylicious used {relayed['peer_cpu_s']:.2f} s of CPU meanwhile")
    return {**cpu, **relayed, "side": side, "family": family, "transactions": result.transactions,
            "seconds": result.seconds, "per_second": result.per_second, "proxy_requests": requests,
            "stray_requests": stray,
            "proxy_cpu_ms_per_txn": 1000 * cpu["proxy_cpu_s"] / max(result.transactions, 1), "problems": problems}


def loops_phase(b: Bench, s: Settings) -> dict[str, Any]:
    sides = s.sat_sides
    say(f"\n[7] one-record transaction loops: {s.loop_transactions} transactions per run, families "
        f"{', '.join(s.families)}, {s.rounds} rounds, arms {', '.join(sides)} in rotation")
    topics = {side: b.topic("loop", side) for side in sides}
    runs = []
    unavailable: dict[str, str] = {}  # family -> why it could not run through Kroxylicious
    for family in s.families:
        for side in sides:  # untimed: the client's and the arm's first connections, the JIT
            # The peer's JIT compiles for seconds of load (its JIT threads' CPU is in its figures: 0.9-1.1 s of the
            # Java loop's first three rounds after a warm-up of a fifth of a run): three runs' worth first.
            warm = 3 * s.loop_transactions if side == PEER else max(10, s.loop_transactions // 5)
            try:
                loop_run(b, side, family, topics[side], warm)
            except RuntimeError as e:
                if side != PEER:
                    raise
                # A client the peer cannot serve is a finding, not a reason to lose the run.
                unavailable[family] = next(line for line in reversed(str(e).splitlines()) if line.strip())[:300]
                say(f"  {family:16} warm-up {side:12}: FAILED: {unavailable[family]}")
        if s.profile_cmd:  # an extra, untimed run: a profiler's cost never lands in the figures
            with profiled(b, s.profile_cmd, f"profile-loop-{family}-{b.stamp}"):
                loop_run(b, "proxy", family, topics["proxy"], s.loop_transactions)
        arms = tuple(side for side in sides if not (side == PEER and family in unavailable))
        for i in range(s.rounds):
            for side in rotated(arms, i):
                run = {**loop_run(b, side, family, topics[side], s.loop_transactions), "round": i}
                runs.append(run)
                cpu = "" if side == "direct" else (f"  {_cpu_label(side)} {run['proxy_cpu_s']:.2f} s "
                                                   f"({run['proxy_cpu_ms_per_txn']:.3f} ms/txn)")
                say(f"  {family:16} round {i} {side:12}: {run['per_second']:7.1f} txn/s{cpu}  "
                    f"host busy {run['host_busy_pct']:.0f}%" + ("  PROBLEM" if run["problems"] else ""))
    med = {family: {side: {k: float(statistics.median(r[k] for r in runs if r["family"] == family
                                                      and r["side"] == side))
                           for k in ("per_second", "proxy_cpu_ms_per_txn", "host_busy_pct")}
                    for side in sides if any(r["family"] == family and r["side"] == side for r in runs)}
           for family in s.families}
    paired = {family: {f"{side}/direct": per_round(runs, "per_second", s.rounds, side, "direct", family=family)
                       for side in sides if side != "direct"} for family in s.families}
    if PEER in sides:
        for family in s.families:
            paired[family][f"proxy/{PEER}"] = per_round(runs, "per_second", s.rounds, "proxy", PEER, family=family)
    for family in s.families:
        paired[family].update(extra_pairs(runs, s.rounds, sides, "per_second", family=family))
    warnings = [p for r in runs for p in r["problems"]]
    for w in warnings:
        say(f"  WARNING: {w}")
    warnings += [f"loop {family}: the Kroxylicious arm failed: {why}" for family, why in unavailable.items()]
    return {"transactions": s.loop_transactions, "families": list(s.families), "runs": runs, "median": med,
            "paired_ratios": paired, "peer_failed": unavailable, "warnings": warnings}


def loops_rows(loops: dict[str, Any]) -> list[Row]:
    rows = []
    for family, med in loops["median"].items():
        d, p = med["direct"]["per_second"], med["proxy"]["per_second"]
        rows.append(Row(f"{family} loop (txn/s), direct | txnguard", d, p, p / d, "ratio", "ratio >= 1", p >= d))
        if PEER in med:
            k = med[PEER]["per_second"]
            kc, pc = med[PEER]["proxy_cpu_ms_per_txn"], med["proxy"]["proxy_cpu_ms_per_txn"]
            rows += [Row(f"{family} loop (txn/s), direct | Kroxylicious", d, k, k / d, "ratio", "", None),
                     Row(f"{family} loop (txn/s), Kroxylicious | txnguard", k, p, p / k, "ratio", "", None),
                     Row(f"{family} loop CPU per transaction (ms), Kroxylicious | txnguard", kc, pc, pc / kc, "ratio",
                         "<= 0.25 ms", pc <= 0.25)]
        else:
            rows.append(Row(f"{family} loop CPU per transaction (ms)", None, med["proxy"]["proxy_cpu_ms_per_txn"],
                            None, "", "<= 0.25 ms", med["proxy"]["proxy_cpu_ms_per_txn"] <= 0.25))
        if "relay" in med:
            r = med["relay"]["per_second"]
            rows.append(Row(f"{family} loop (txn/s), direct | bare relay", d, r, r / d, "ratio", "", None))
        for side in EXTRA_ARMS:
            if side in med:
                a, label = med[side]["per_second"], _arm_label(side)
                ac, pc = med[side]["proxy_cpu_ms_per_txn"], med["proxy"]["proxy_cpu_ms_per_txn"]
                rows += [Row(f"{family} loop (txn/s), direct | {label}", d, a, a / d, "ratio", "", None),
                         Row(f"{family} loop CPU per transaction (ms), txnguard | {label}", pc, ac,
                             ac / max(pc, 1e-9), "ratio", "", None)]
    return rows


def arm_notes(result: dict[str, Any]) -> list[str]:
    """Per-round ratios of the txn and loops parts, so the spread behind each ratio of medians shows."""
    out = []
    if "transactional_producer" in result:
        for name, ratios in result["transactional_producer"]["paired_ratios"].items():
            out.append(f"txn producer per-round {_pair_label(name)}: {_ratios_text(ratios)}")
    if "transaction_loops" in result:
        for family, pairs in result["transaction_loops"]["paired_ratios"].items():
            out.append(f"{family} loop per-round " + "; ".join(
                f"{_pair_label(name)} {_ratios_text(ratios)}" for name, ratios in pairs.items()))
    return out


def _pair_label(name: str) -> str:
    num, den = name.split("/")
    return f"{_arm_label(num)}/{_arm_label(den)}"


def peer_table(result: dict[str, Any]) -> str | None:
    """The side-by-side table (markdown) of the parts run with the Kroxylicious arm or an extra txnguard arm:
    direct's figure, the other arms' ratios to it, and each proxy's CPU (medians). One column per arm the run
    had, so the default run's table (direct, bare relay, txnguard, Kroxylicious) keeps its columns."""
    medians_by_part = [x["median"][kind] for x in result.get("saturation", {}).get("sizes", [])
                       for kind in ("produce", "consume")]
    medians_by_part += [result["transactional_producer"]["median"]] if "transactional_producer" in result else []
    medians_by_part += list(result.get("transaction_loops", {}).get("median", {}).values())
    present = {side for med in medians_by_part for side in med}
    if result.get("transaction_loops", {}).get("peer_failed"):
        present.add(PEER)
    sides = tuple(x for x in ("direct", "relay", "proxy", *EXTRA_ARMS, PEER) if x in present or x == "direct")
    wanted = {PEER, *EXTRA_ARMS}  # the arms this table is for: with none of them, no table
    lines = []

    def row(name: str, by_side: dict[str, dict[str, float]], key: str, unit: str, failed: bool = False) -> None:
        if "direct" not in by_side or not (wanted & set(by_side) or failed):
            return
        d = by_side["direct"][key]
        cells = [f"{_num(d)} {unit}"] + [f"x{by_side[side][key] / d:.3f}" if side in by_side else
                                         ("fails" if side == PEER and failed else "-") for side in sides[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def cpu_row(name: str, by_side: dict[str, dict[str, float]], key: str) -> None:
        if not wanted & set(by_side):
            return
        cells = [""] + [f"{by_side[side][key]:.3f}" if side in by_side else "-" for side in sides[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    for x in result.get("saturation", {}).get("sizes", []):
        n = _size_name(x["record_size"])
        p, c = x["median"]["produce"], x["median"]["consume"]
        row(f"produce at saturation, {n} (MB/s)", p, "mb_per_sec", "MB/s")
        row(f"consume at saturation, {n} (fetch MB/s)", c, "fetch_mb_per_sec", "MB/s")
        cpu_row(f"CPU per MiB produced, {n} (ms)", p, "proxy_cpu_ms_per_mib")
        cpu_row(f"CPU per MiB consumed, {n} (ms)", c, "proxy_cpu_ms_per_mib")
    if "transactional_producer" in result:
        med = result["transactional_producer"]["median"]
        row(f"transactional producer, {TXN_RECORD_SIZE} B, {TXN_DURATION_MS} ms transactions (records/s)", med,
            "records_per_sec", "rec/s")
        cpu_row("CPU per MiB, transactional producer (ms)", med, "proxy_cpu_ms_per_mib")
        cpu_row("CPU per transaction, transactional producer (ms)", med, "proxy_cpu_ms_per_txn")
    failed = result.get("transaction_loops", {}).get("peer_failed", {})
    for family, med in result.get("transaction_loops", {}).get("median", {}).items():
        row(f"one-record transaction loop, {family} (txn/s)", med, "per_second", "txn/s", family in failed)
        cpu_row(f"CPU per transaction, {family} loop (ms)", med, "proxy_cpu_ms_per_txn")
    if not lines:
        return None
    names = [f"Kroxylicious {KROXYLICIOUS_VERSION}" if side == PEER else _arm_label(side) for side in sides]
    return "\n".join(["| | " + " | ".join(names) + " |", "|" + " --- |" * (len(sides) + 1), *lines])


# -- two proxy revisions, one load -------------------------------------------------------------------


def ab_phase(b: Bench, s: Settings) -> dict[str, Any]:
    """ProducerPerformance at saturation (or, `ab_kind` "loops", each family's one-record transaction loop) through
    this proxy and through one of `s.compare_rev`, alternating.

    Both proxies front the same broker in the same run, so the machine's load (on a shared
    machine it moves the CPU per MiB by tens of percent between runs minutes apart) falls on both
    alike; what differs is the code. Each run's proxy CPU is its own process's.
    """
    assert s.compare_rev is not None
    with tempfile.TemporaryDirectory(prefix="txnguard-ab-") as d:
        env, source = proxy_source(s.compare_rev, Path(d))
        listen, admin_port = proxy_ports()
        admin = f"{HOST}:{admin_port}"
        other = ProxyProcess(["--upstream", b.direct_bootstrap, "--listen", f"{HOST}:{listen}",
                              "--admin", admin, "--mode", "gateway"], Path(d) / "compare.log", env=env)
        sides = {"this": b, "compare": Bench(b.cluster, other, listen, admin, b.stamp)}
        runs: list[dict[str, Any]] = []
        try:
            other.start(wait_port=(HOST, listen))
            wait_ready(admin, listen + 2)
            if s.ab_kind == "loops":
                say(f"\n[ab] this proxy vs {source['source']} ({source['commit'][:12]}): one-record transaction "
                    f"loops of {s.loop_transactions}, families {', '.join(s.families)}, {s.rounds} rounds")
                runs = _ab_loops(sides, s)
            else:
                say(f"\n[ab] this proxy vs {source['source']} ({source['commit'][:12]}): ProducerPerformance "
                    f"--throughput -1, {s.sat_mib:g} MiB per run, record sizes "
                    f"{', '.join(str(x) for x in s.record_sizes)} B, {s.rounds} rounds")
                runs = _ab_saturation(sides, s)
        finally:
            if other.proc is not None and other.proc.poll() is None:
                other.terminate(timeout=30)
    out: dict[str, Any] = {"compare": source, "runs": runs, "sizes": {}, "families": {}}
    if s.ab_kind == "loops":
        for family in s.families:
            out["families"][family] = {name: {k: float(statistics.median(
                r[k] for r in runs if r["rev"] == name and r["family"] == family))
                for k in ("proxy_cpu_ms_per_txn", "per_second", "host_busy_pct")} for name in sides}
            cpu = {(r["rev"], r["round"]): r["proxy_cpu_ms_per_txn"] for r in runs if r["family"] == family}
            out["families"][family]["pairs"] = [(cpu["compare", i], cpu["this", i]) for i in range(s.rounds)]
    for size in s.record_sizes if s.ab_kind != "loops" else ():
        med = {name: {k: float(statistics.median(r[k] for r in runs if r["rev"] == name and r["record_size"] == size))
                      for k in ("proxy_cpu_ms_per_mib", "proxy_cpu_us_per_request", "proxy_user_s", "proxy_sys_s",
                                "mb_per_sec", "host_busy_pct")} for name in sides}
        out["sizes"][str(size)] = med
    out["warnings"] = [p for r in runs for p in r["problems"]]
    return out


def _ab_saturation(sides: dict[str, Bench], s: Settings) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for size in s.record_sizes:
        records = max(1000, int(s.sat_mib * MIB / size))
        for name in sides:  # untimed warm-up of each
            sat_produce_run(sides[name], "proxy", size, max(500, int(records * SAT_WARMUP_SHARE)))
        for i in range(s.rounds):
            for name in (("this", "compare") if i % 2 == 0 else ("compare", "this")):
                run = sat_produce_run(sides[name], "proxy", size, records)
                run["problems"] += _route_problems(run, run["payload_mib"])
                runs.append({**run, "rev": name, "round": i})
                say(_sat_line("produce", f"round {i} {name:7}", run))
    return runs


def _ab_loops(sides: dict[str, Bench], s: Settings) -> list[dict[str, Any]]:
    """Each family's loop through either proxy in turn, the order swapped every round; a fresh topic a run."""
    runs: list[dict[str, Any]] = []
    for family in s.families:
        for name in sides:  # untimed warm-up of each
            bench = sides[name]
            loop_run(bench, "proxy", family, bench.topic("ab-loop", name), max(50, s.loop_transactions // 4))
        for i in range(s.rounds):
            for name in (("this", "compare") if i % 2 == 0 else ("compare", "this")):
                bench = sides[name]
                run = loop_run(bench, "proxy", family, bench.topic("ab-loop", name), s.loop_transactions)
                runs.append({**run, "rev": name, "round": i})
                say(f"  {family:16} round {i} {name:7}: {run['per_second']:7.1f} txn/s  proxy CPU "
                    f"{run['proxy_cpu_s']:.2f} s ({run['proxy_cpu_ms_per_txn']:.3f} ms/txn)  host busy "
                    f"{run['host_busy_pct']:.0f}%")
    return runs


def ab_rows(ab: dict[str, Any]) -> list[Row]:
    rev = ab["compare"]["commit"][:7]
    rows = []
    for family, med in ab.get("families", {}).items():
        c, t = med["compare"], med["this"]
        lower = sum(this < compare for compare, this in med["pairs"])
        rows += [
            Row(f"{family} loop: proxy CPU per transaction (ms), {rev} | this", c["proxy_cpu_ms_per_txn"],
                t["proxy_cpu_ms_per_txn"], t["proxy_cpu_ms_per_txn"] / max(c["proxy_cpu_ms_per_txn"], 1e-9),
                "ratio", f"lower in {lower} of {len(med['pairs'])} rounds", None),
            Row(f"{family} loop: transactions a second through each, {rev} | this", c["per_second"],
                t["per_second"], t["per_second"] / max(c["per_second"], 1e-9), "ratio", "", None),
        ]
    for size, med in ab["sizes"].items():
        n, c, t = _size_name(int(size)), med["compare"], med["this"]
        rows += [
            Row(f"{n}: proxy CPU per MiB produced (ms), {rev} | this", c["proxy_cpu_ms_per_mib"],
                t["proxy_cpu_ms_per_mib"], t["proxy_cpu_ms_per_mib"] / c["proxy_cpu_ms_per_mib"], "ratio",
                f"<= {TARGET_SAT_PRODUCE_MS_PER_MIB:g} ms/MiB",
                t["proxy_cpu_ms_per_mib"] <= TARGET_SAT_PRODUCE_MS_PER_MIB),
            Row(f"{n}: proxy CPU per Produce request (us), {rev} | this", c["proxy_cpu_us_per_request"],
                t["proxy_cpu_us_per_request"],
                t["proxy_cpu_us_per_request"] / max(c["proxy_cpu_us_per_request"], 1e-9), "ratio", "", None),
            Row(f"{n}: proxy user CPU per run (s), {rev} | this", c["proxy_user_s"], t["proxy_user_s"],
                t["proxy_user_s"] / max(c["proxy_user_s"], 1e-9), "ratio", "", None),
            Row(f"{n}: proxy kernel CPU per run (s), {rev} | this", c["proxy_sys_s"], t["proxy_sys_s"],
                t["proxy_sys_s"] / max(c["proxy_sys_s"], 1e-9), "ratio", "", None),
            Row(f"{n}: produce MB/s through each, {rev} | this", c["mb_per_sec"], t["mb_per_sec"],
                t["mb_per_sec"] / c["mb_per_sec"], "ratio", "", None),
        ]
    return rows


# -- the proxy's own account -------------------------------------------------------------------------


def proxy_log_findings(log: str) -> dict[str, Any]:
    """Warning and error events in the proxy's JSON log (the first few kept verbatim)."""
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    samples: list[str] = []
    other: list[str] = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if line.strip() and not line.startswith("txnguard "):
                other.append(line)  # tracebacks and anything else not from structlog
            continue
        level = str(entry.get("level", "?"))
        levels[level] += 1
        if level in ("warning", "error", "critical"):
            events[f"{level}:{entry.get('event')}:{entry.get('reason', '')}"] += 1
            if len(samples) < 5:
                samples.append(line)
    return {"levels": dict(levels), "problem_events": dict(events), "samples": samples,
            "non_json_lines": other[:20], "non_json_count": len(other)}


def interesting_metrics(metrics: dict[str, float]) -> dict[str, float]:
    keep = ("txnguard_connection_closes_total", "txnguard_frame_errors_total",
            "txnguard_upstream_connect_failures_total", "txnguard_local_responses_total",
            "txnguard_connections_total", "txnguard_backpressure_paused_seconds_total",
            "txnguard_concurrent_transactions_retries", "txnguard_concurrent_transactions_absorptions")
    return {k: v for k, v in metrics.items() if k.startswith(keep) and "_created{" not in k}


# -- the summary --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    metric: str
    direct: float | None
    proxy: float | None
    change: float | None            # proxy - direct, or proxy / direct for a ratio
    change_kind: str                # "diff" | "ratio" | ""
    target: str
    meets: bool | None


def _diff_row(name: str, d: float, p: float, limit: float | None = None, unit: str = "ms") -> Row:
    added = p - d
    target = f"added <= {limit:g} {unit}" if limit is not None else ""
    return Row(name, d, p, added, "diff", target, None if limit is None else added <= limit)


def perf_rows(perf: dict[str, Any]) -> list[Row]:
    pd, pp = perf["median"]["direct"], perf["median"]["proxy"]
    ratio = pp["records_per_sec"] / pd["records_per_sec"]
    cpu_share = 100 * pp["proxy_cpu_s"] / pp["wall_s"]
    return [
        Row("ProducerPerf throughput (records/s)", pd["records_per_sec"], pp["records_per_sec"], ratio, "ratio",
            f"ratio >= {TARGET_THROUGHPUT_RATIO}", ratio >= TARGET_THROUGHPUT_RATIO),
        Row("ProducerPerf throughput (MB/s)", pd["mb_per_sec"], pp["mb_per_sec"],
            pp["mb_per_sec"] / pd["mb_per_sec"], "ratio", "", None),
        _diff_row("ProducerPerf latency avg (ms)", pd["avg_latency_ms"], pp["avg_latency_ms"]),
        _diff_row("ProducerPerf latency p50 (ms, whole ms)", pd["p50_ms"], pp["p50_ms"], TARGET_ADDED_P50_MS),
        _diff_row("ProducerPerf latency p99 (ms, whole ms)", pd["p99_ms"], pp["p99_ms"], TARGET_ADDED_P99_MS),
        Row("Proxy CPU per MB produced (ms/MB)", None, pp["proxy_cpu_ms_per_mb"], None, "",
            f"<= {TARGET_CPU_MS_PER_MB:g} ms/MB", pp["proxy_cpu_ms_per_mb"] <= TARGET_CPU_MS_PER_MB),
        Row("Proxy CPU during proxied run (% of a core)", None, cpu_share, None, "", "", None),
        Row("Machine busy during ProducerPerf (%)", pd["host_busy_pct"], pp["host_busy_pct"], None, "", "", None),
    ]


def e2e_rows(e2e: dict[str, Any]) -> list[Row]:
    ed, ep = e2e["median"]["direct"], e2e["median"]["proxy"]
    return [
        _diff_row("EndToEnd latency avg (ms)", ed["avg_ms"], ep["avg_ms"]),
        _diff_row("EndToEnd latency p50 (ms, whole ms)", ed["p50_ms"], ep["p50_ms"], TARGET_ADDED_P50_MS),
        _diff_row("EndToEnd latency p99 (ms, whole ms)", ed["p99_ms"], ep["p99_ms"], TARGET_ADDED_P99_MS),
    ]


def rtt_rows(rtt: dict[str, Any]) -> list[Row]:
    rd, rp = rtt["median"]["direct"], rtt["median"]["proxy"]
    return [
        _diff_row("Raw Produce RTT p50 (us)", rd["p50_us"], rp["p50_us"], TARGET_ADDED_P50_MS * 1000, "us"),
        _diff_row("Raw Produce RTT p99 (us)", rd["p99_us"], rp["p99_us"], TARGET_ADDED_P99_MS * 1000, "us"),
    ]


def idle_rows(idle: dict[str, Any]) -> list[Row]:
    rss_mib = idle["rss_after_kib"] / 1024
    return [
        Row(f"Proxy RSS, {idle['opened']} idle conns (MiB)", None, rss_mib, None, "",
            f"<= {TARGET_RSS_MIB:g} MiB", rss_mib <= TARGET_RSS_MIB),
        Row("Proxy RSS before them (MiB)", None, idle["rss_before_kib"] / 1024, None, "", "", None),
        Row("Proxy RSS per idle connection (KiB)", None, idle["kib_per_connection"], None, "", "", None),
        Row("Idle connections failed", None, float(sum(idle["failures"].values())), None, "", "0", None),
    ]


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}"


def format_table(rows: list[Row]) -> str:
    head = ("metric", "direct", "proxy", "change", "target", "meets")
    lines = [head]
    for r in rows:
        change = "-" if r.change is None else (f"x{r.change:.3f}" if r.change_kind == "ratio" else f"{r.change:+.2f}")
        meets = "" if r.meets is None else ("yes" if r.meets else "NO")
        lines.append((r.metric, _num(r.direct), _num(r.proxy), change, r.target, meets))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = [c.ljust(widths[i]) if i in (0, 4, 5) else c.rjust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------------------


def proxy_source(rev: str | None, tmp: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment that makes `python -m txnguard.cli` load the proxy of `rev` (None: this working tree).

    `git archive <rev> src` into the temporary folder, first on PYTHONPATH (ahead of the
    editable install), so a run can measure a commit while others edit the working tree.
    """
    repo = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    if rev is None:
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True, text=True,
                               check=False).stdout.strip()
        return {}, {"source": "working tree", "head": head, "src_modified": bool(dirty)}
    commit = subprocess.run([*git, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True,
                            check=True).stdout.strip()
    root = tmp / f"proxy-src-{commit[:12]}"
    root.mkdir()
    archive = subprocess.run([*git, "archive", commit, "src"], capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True, timeout=60)
    native = build_native(git, commit, root, repo)
    env = {"PYTHONPATH": str(root / "src")}
    where = subprocess.run([sys.executable, "-c", "import txnguard.cli as c; print(c.__file__)"],
                           env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=60).stdout
    if not where.strip().startswith(str(root)):
        raise RuntimeError(f"txnguard.cli loads from {where.strip()}, not from {root}")
    return env, {"source": f"git archive {rev}", "commit": commit, "head": head, "native": native}


def build_native(git: list[str], commit: str, root: Path, repo: Path) -> str:
    """Build the revision's own native module (its native/ crate, if it has one) into the archive's package, as
    `pip install` would: without it that revision's proxy would run the general path for every frame, and the
    comparison would not be of the two revisions' data paths. The cargo build cache lives in the working tree's
    native/target/bench-revisions/<commit>, one per revision: the archive's files carry the commit's time, so
    cargo, which compares times, took one revision's build for another's when they shared a target folder (one
    A/B ran a revision with the other's module)."""
    listed = subprocess.run([*git, "ls-tree", "--name-only", commit, "native/Cargo.toml"], capture_output=True,
                            text=True, check=False).stdout.strip()
    if not listed:
        return "none (the revision has no native crate)"
    archive = subprocess.run([*git, "archive", commit, "native"], capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True, timeout=60)
    target = repo / "native" / "target" / "bench-revisions" / commit
    say(f"building the native module of {commit[:12]} (cargo, release) ...")
    subprocess.run(["cargo", "build", "--release", "--offline", "--features", "extension-module",
                    "--manifest-path", str(root / "native" / "Cargo.toml")],
                   env={**os.environ, "CARGO_TARGET_DIR": str(target)}, check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    shutil.copy(target / "release" / "lib_native.so", root / "src" / "txnguard" / "_native.abi3.so")
    return f"built from {commit[:12]}'s native/"


def native_gauge(admin: str) -> float:
    """A txnguard process's txnguard_native_data_path: 1 with the native data path, 0 on the general path only."""
    value = scrape_metrics(admin).get("txnguard_native_data_path")
    if value is None:
        raise RuntimeError(f"the proxy at {admin} exports no txnguard_native_data_path")
    return value


def start_arm(side: str, b: Bench, tmp: Path, proxy_env: dict[str, str] | None) -> ArmProxy:
    """An extra txnguard arm: `txnguard run` with the bench proxy's flags on ports of its own, started through
    bench/general_path_proxy.py (GENERAL) or with an audit file (AUDIT_ON). Not returned unless it is what
    its side says: a general-path arm whose native data path gauge is not 0 would measure the txnguard arm
    again under another name."""
    listen, admin_port = proxy_ports()
    admin = f"{HOST}:{admin_port}"
    args = ["--upstream", b.direct_bootstrap, "--listen", f"{HOST}:{listen}", "--admin", admin, "--mode", "gateway"]
    log = tmp / f"proxy-{side}.log"
    audit = tmp / "audit-on.jsonl" if side == AUDIT_ON else None
    proxy: ProxyProcess
    if side == GENERAL:
        proxy = LaunchedProxyProcess(GENERAL_LAUNCHER, args, log, env=proxy_env)
    else:
        # The environment, not a config file: the arm's flags stay the bench proxy's, only audit_path (or the
        # follower's idling: never, in practice) differs.
        differs = ({"TXNGUARD_VERIFICATION__TRANSACTION_LOG_IDLE_AFTER_S": "1e9"} if side == FOLLOWER_LIVE
                   else {"TXNGUARD_AUDIT_PATH": str(audit)})
        proxy = ProxyProcess(args, log, env={**(proxy_env or {}), **differs})
    try:
        proxy.start(wait_port=(HOST, listen))
        wait_ready(admin, listen + 2)
        native = native_gauge(admin)
        if side == GENERAL and native != 0:
            raise RuntimeError(f"the general-path arm reports txnguard_native_data_path {native:g}, not 0: the "
                               "native module was not hidden, so the arm would not measure the general path")
        if audit is not None and not audit.exists():  # the audit log opens its file at start
            raise RuntimeError(f"the audit-on arm did not open its audit file {audit}")
    except BaseException:
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.terminate(timeout=10)
        raise
    return ArmProxy(proxy, listen, admin, native, audit)


def start(tmp: Path, proxy_log: Path, proxy_env: dict[str, str] | None = None, relay: bool = False,
          peer: bool = False, arms: tuple[str, ...] = ()) -> Bench:
    say(f"starting Kafka {KAFKA_VERSION} (1 node, sidecar layout) in {tmp} ...")
    cluster = kafka.up(KAFKA_VERSION, 1, tmp / "kafka", sidecars=True)
    listen, admin_port = proxy_ports()
    admin = f"{HOST}:{admin_port}"
    proxy = ProxyProcess(["--upstream", direct_bootstrap(cluster), "--listen", f"{HOST}:{listen}",
                          "--admin", admin, "--mode", "gateway"], proxy_log, env=proxy_env)
    b = Bench(cluster, proxy, listen, admin)
    node = cluster.nodes[0]
    try:
        b.proxy.start(wait_port=(HOST, listen))
        wait_ready(admin, listen + 2)
        if relay:
            assert node.sidecar_port is not None
            b.relay = RelayProcess(node.sidecar_port, node.address, tmp / "relay.log")
        if peer:
            # Kroxylicious's upstream is the BROKER listener too: it rewrites the broker's own address.
            b.peer = KroxyliciousProcess(b.direct_bootstrap, [n.id for n in cluster.nodes], tmp / "kroxylicious")
            b.peer.start()
            # Its route check: its Metadata names its own port for the broker, so a client given only its
            # bootstrap reaches the broker through it alone.
            leader = raw.leader_of(b.peer.bootstrap, b.topic("route", PEER), 0)
            if leader[1:] != (b.peer.host, b.peer.node_port(leader[0])):
                raise RuntimeError(f"Kroxylicious's Metadata names {leader} for the broker, not its own port")
        for side in arms:
            b.arms[side] = start_arm(side, b, tmp, proxy_env)
    except BaseException:
        # The caller only learns of the cluster (through its folder), not of these processes.
        if b.proxy.proc is not None and b.proxy.proc.poll() is None:
            b.proxy.terminate(timeout=10)
        for arm in b.arms.values():
            if arm.proxy.proc is not None and arm.proxy.proc.poll() is None:
                arm.proxy.terminate(timeout=10)
        if b.relay is not None:
            b.relay.stop()
        if b.peer is not None:
            b.peer.stop()
        raise
    say(f"broker: direct {b.direct_bootstrap} (BROKER listener), PLAINTEXT {node.address} advertised as "
        f"{HOST}:{node.sidecar_port}; proxy pid {b.pid} on {HOST}:{listen} (broker 1 via {listen + 2}), admin {admin}"
        + (f"; bare relay pid {b.relay.proc.pid} on {HOST}:{node.sidecar_port} -> {node.address}" if b.relay else "")
        + (f"; Kroxylicious {KROXYLICIOUS_VERSION} pid {b.peer.pid} on {b.peer.bootstrap} (broker {node.id} via "
           f"{b.peer.port + 1}, heap {b.peer.heap})" if b.peer else ""))
    # The txnguard arm is the native one only if its build has the module (`proxy_source` builds a revision's).
    native = native_gauge(admin)
    say(f"txnguard arm: txnguard_native_data_path {native:g}"
        + ("" if native else " (WARNING: no native module in this build: the txnguard arm runs the general path)"))
    for side, arm in b.arms.items():
        say(f"{_arm_label(side)} arm: pid {arm.pid} on {HOST}:{arm.listen} (broker 1 via {arm.listen + 2}), admin "
            f"{arm.admin}, txnguard_native_data_path {arm.native:g}"
            + (f", audit records to {arm.audit_path}" if arm.audit_path else ""))
    return b


def stop(b: Bench | None, cluster_dir: Path) -> None:
    if b is not None and b.proxy.proc is not None and b.proxy.proc.poll() is None:
        code = b.proxy.terminate(timeout=30)
        say(f"proxy stopped (exit {code})")
    for side, arm in (b.arms if b is not None else {}).items():
        if arm.proxy.proc is not None and arm.proxy.proc.poll() is None:
            say(f"{_arm_label(side)} proxy stopped (exit {arm.proxy.terminate(timeout=30)})")
        if arm.audit_path is not None and arm.audit_path.exists():
            with open(arm.audit_path, "rb") as f:
                say(f"{_arm_label(side)}: {sum(1 for _ in f)} audit records written")
    if b is not None and b.relay is not None:
        say(f"bare relay stopped (exit {b.relay.stop()})")
    if b is not None and b.peer is not None:
        problems = [line for line in b.peer.log_tail(200).splitlines() if " WARN " in line or " ERROR " in line]
        say(f"Kroxylicious stopped (exit {b.peer.stop()}); {len(problems)} WARN/ERROR lines in its log"
            + "".join(f"\n  | {line[:300]}" for line in problems[:5]))
    cluster = b.cluster if b is not None else None
    if cluster is None and (cluster_dir / "cluster.json").exists():
        cluster = kafka.Cluster.load(cluster_dir)  # kafka.up failed after writing its folder
    if cluster is not None:
        cluster.down()
        say("Kafka stopped")


# part -> (key in the JSON, the phase, its summary rows); run in this order
PHASES: dict[str, tuple[str, Callable[[Bench, Settings], dict[str, Any]], Callable[[dict[str, Any]], list[Row]]]] = {
    "fixed": ("producer_performance", producer_perf_phase, perf_rows),
    "e2e": ("end_to_end_latency", e2e_phase, e2e_rows),
    "rtt": ("produce_rtt", rtt_phase, rtt_rows),
    "idle": ("idle_connections", idle_phase, idle_rows),
    "saturation": ("saturation", saturation_phase, saturation_rows),
    "txn": ("transactional_producer", txn_phase, txn_rows),
    "loops": ("transaction_loops", loops_phase, loops_rows),
    "ab": ("ab", ab_phase, ab_rows),
}


def measure(b: Bench, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"warnings": []}
    rows: list[Row] = []
    for part in PARTS:
        if part not in s.parts:
            continue
        key, phase, to_rows = PHASES[part]
        result = phase(b, s)
        out[key] = result
        rows += to_rows(result)
        out["warnings"] += result.get("warnings", [])
    out["notes"] = (saturation_notes(out["saturation"]) if "saturation" in out else []) + arm_notes(out)
    out["peer_table"] = peer_table(out)
    out.update(summary=[asdict(r) for r in rows], table=format_table(rows),
               proxy_metrics=interesting_metrics(scrape_metrics(b.admin)))
    return out


def verification_times(audit: Path) -> dict[str, dict[str, float]]:
    """VerificationTimeMs by evidence, exact, from an audit file's decision records, read and ranked as
    bench/verification_overhead.py does: n, p50, p99, max. The audit-on arm measures each decision's thread CPU time
    too (a clock read that is a system call, inside the timed span): an upper bound on the arm without audit."""
    latencies, _, _ = audit_decisions(audit)
    return {e: {"n": len(v), "p50": round(pct(v, 0.5), 4), "p99": round(pct(v, 0.99), 4), "max": round(max(v), 4)}
            for e, v in sorted(latencies.items())}


def report(result: dict[str, Any], stamp: str, proxy_log: Path, arm_logs: dict[str, Path] | None = None) -> None:
    log = proxy_log_findings(proxy_log.read_text(errors="replace"))
    result["proxy_log"] = log
    # The extra txnguard arms' own logs: the same account, kept beside the main one.
    result["arm_proxy_logs"] = {side: proxy_log_findings(path.read_text(errors="replace"))
                                for side, path in (arm_logs or {}).items() if path.exists()}
    say("\n=== proxy overhead: medians, direct vs through txnguard (targets are information only) ===")
    say(result["table"])
    say("(Java tool percentiles are truncated to whole ms; the raw RTT rows resolve microseconds.)")
    for note in result.get("notes", []):
        say(note)
    if result.get("peer_table"):
        say("\nSide by side (medians; ratios to direct; CPU of each relay's or proxy's own process):")
        say(result["peer_table"])
    for evidence, t in result.get("audit_on_verification_time_ms", {}).items():
        say(f"VerificationTimeMs, {evidence} evidence (the audit-on arm's records, every part it ran): p50 {t['p50']} "
            f"p99 {t['p99']} max {t['max']} ms over {t['n']} decisions")
    for w in result["warnings"]:
        say(f"WARNING: {w}")
    say(f"\nproxy log levels {log['levels']}; warnings/errors {log['problem_events'] or 'none'}; "
        f"non-JSON lines {log['non_json_count']}")
    for line in log["samples"] + log["non_json_lines"][:5]:
        say(f"  | {line[:300]}")
    for side, found in result["arm_proxy_logs"].items():
        say(f"{_arm_label(side)} proxy log levels {found['levels']}; warnings/errors "
            f"{found['problem_events'] or 'none'}; non-JSON lines {found['non_json_count']}")
    say(f"proxy counters at the end: {result['proxy_metrics']}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"proxy_overhead-{stamp}.json"
    out.write_text(json.dumps({k: v for k, v in result.items() if k != "table"}, indent=2, default=str))
    kept_log = RESULTS / f"proxy_overhead-{stamp}.proxy.log"
    shutil.copyfile(proxy_log, kept_log)
    for side, path in (arm_logs or {}).items():
        if path.exists():
            shutil.copyfile(path, RESULTS / f"proxy_overhead-{stamp}.{side}.proxy.log")
    say(f"\nwrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out} "
        f"(proxy log: {kept_log.name})")


def busy_at_start() -> list[str]:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load <= cpus:
        return []
    return [f"load average {load:.1f} on {cpus} CPUs before the bench started: something else is using this "
            "machine, so expect noisy latencies"]


def _sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(143)  # unwinds through the finally blocks that stop Kafka and the proxy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="~3 s runs, 2 pairs: about 2 minutes in all")
    parser.add_argument("--rate", type=int, default=OFFERED_RATE,
                        help=f"ProducerPerformance offered rate in records/s (default {OFFERED_RATE}); "
                             "lower it if the direct runs do not reach it")
    parser.add_argument("--only", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: "
                             f"{','.join(DEFAULT_PARTS)}); "
                             "'fixed' is the fixed-rate ProducerPerformance; 'ab' compares this proxy with the one "
                             "of --compare-rev at saturation (produce), alternating in one run")
    parser.add_argument("--records", default=",".join(str(x) for x in SAT_RECORD_SIZES),
                        help="saturation record sizes in bytes, comma-separated (default 1024,16384)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="saturation, txn and loops rounds (one run of each arm each) per record size or "
                             "family (default 3; 2 with --quick)")
    parser.add_argument("--sat-mib", type=float, default=None,
                        help=f"saturation payload per run in MiB (default {SAT_MIB}; 50 with --quick)")
    parser.add_argument("--no-floor", action="store_true",
                        help="saturation, txn and loops without the bare relay arm (bench/bare_relay.py)")
    parser.add_argument("--no-peer", action="store_true",
                        help=f"saturation, txn and loops without the Kroxylicious {KROXYLICIOUS_VERSION} arm "
                             "(make kroxylicious fetches it)")
    parser.add_argument("--general-path", action="store_true",
                        help="saturation, txn and loops with one more arm: txnguard with its native module hidden "
                             "(bench/general_path_proxy.py), every frame on the general (kio) path; refused at "
                             "start unless its txnguard_native_data_path reads 0")
    parser.add_argument("--follower-live", action="store_true",
                        help="an extra txnguard arm whose follower of the coordinator's log long-polls throughout "
                             "(the txnguard arm's idles 30 s after the last write that asked the log: "
                             "verification.transaction_log_idle_after_s)")
    parser.add_argument("--audit-on", action="store_true",
                        help="saturation, txn and loops with one more arm: txnguard writing its audit records to a "
                             "file (audit_path; the txnguard arm runs with audit off, the default)")
    parser.add_argument("--txn-records", type=int, default=None,
                        help=f"txn: records of {TXN_RECORD_SIZE} B per transactional ProducerPerformance run "
                             f"(default {TXN_RECORDS:,}; {QUICK.txn_records:,} with --quick)")
    parser.add_argument("--loop-transactions", type=int, default=None,
                        help=f"loops: one-record transactions per loop run (default {LOOP_TRANSACTIONS}; "
                             f"{QUICK.loop_transactions} with --quick)")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help=f"loops: client families, comma-separated (default {','.join(FAMILIES)})")
    parser.add_argument("--proxy-rev", default=None,
                        help="run the proxy of this git revision (git archive into the temporary folder, its native "
                             "module built from its native/ crate) instead of the working tree's src/")
    parser.add_argument("--ab-kind", choices=("saturation", "loops"), default="saturation",
                        help="for --only ab: alternate produce at saturation (default) or each family's one-record "
                             "transaction loop (--families, --loop-transactions, --rounds apply)")
    parser.add_argument("--compare-rev", default=None,
                        help="for --only ab: the git revision whose proxy runs beside this one (e.g. the previous "
                             "commit); --records, --rounds and --sat-mib apply")
    parser.add_argument("--profile-cmd", default=None,
                        help="a profiler attached to the proxy around each proxied saturation run of round 0 and "
                             "an extra untimed txnguard run of the transactional producer and of each loop family, "
                             "with {pid} and {out} filled in, e.g. 'py-spy record --pid {pid} --format raw -o {out}' "
                             "or 'perf record -g -p {pid} -o {out}'; stopped with SIGINT. Output in bench/results/")
    args = parser.parse_args()
    parts = tuple(p.strip() for p in args.only.split(",") if p.strip())
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--only: unknown part(s) {unknown}; choose among {', '.join(PARTS)}")
    base = QUICK if args.quick else DEFAULT
    s = dataclasses.replace(
        base, rate=args.rate, parts=parts, record_sizes=tuple(int(x) for x in args.records.split(",") if x.strip()),
        rounds=args.rounds if args.rounds is not None else base.rounds,
        sat_mib=args.sat_mib if args.sat_mib is not None else base.sat_mib, profile_cmd=args.profile_cmd,
        compare_rev=args.compare_rev, ab_kind=args.ab_kind, floor=not args.no_floor, peer=not args.no_peer,
        arms=tuple(side for side, on in ((GENERAL, args.general_path), (AUDIT_ON, args.audit_on),
                                         (FOLLOWER_LIVE, args.follower_live)) if on),
        txn_records=args.txn_records if args.txn_records is not None else base.txn_records,
        loop_transactions=args.loop_transactions if args.loop_transactions is not None else base.loop_transactions,
        families=tuple(f.strip() for f in args.families.split(",") if f.strip()),
    )
    if ("ab" in parts) != (args.compare_rev is not None):
        parser.error("--only ab and --compare-rev go together")
    if s.rounds < 1 or s.sat_mib <= 0 or not s.record_sizes or min(s.record_sizes) < 1:
        parser.error("--rounds, --sat-mib and --records must be positive")
    if s.txn_records < 1 or s.loop_transactions < 1 or not s.families or set(s.families) - set(FAMILIES):
        parser.error(f"--txn-records and --loop-transactions must be positive; --families among {','.join(FAMILIES)}")
    signal.signal(signal.SIGTERM, _sigterm)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    soft, hard = raise_fd_limit()
    result: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(), "settings": asdict(s),
        "record_size": RECORD_SIZE, "kafka": KAFKA_VERSION, "java_client": JAVA_CLIENT,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": sys.version.split()[0],
                    "nofile": [soft, hard], "loadavg_at_start": os.getloadavg()},
    }
    say(f"proxy_overhead ({s.mode}; parts {', '.join(s.parts)}): RLIMIT_NOFILE {soft}/{hard}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}")
    early = busy_at_start()
    for w in early:
        say(f"WARNING: {w}")
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="txnguard-bench-"))
    proxy_log = tmp / "proxy.log"
    b: Bench | None = None
    try:
        proxy_env, result["proxy_source"] = proxy_source(args.proxy_rev, tmp)
        say(f"proxy code: {result['proxy_source']}")
        arms = bool(set(ARM_PARTS) & set(s.parts))
        b = start(tmp, proxy_log, proxy_env, relay=s.floor and arms, peer=s.peer and arms,
                  arms=s.arms if arms else ())
        b.stamp = stamp
        result.update(measure(b, s))
        result["warnings"] = early + result["warnings"]
    finally:
        stop(b, tmp / "kafka")
        arm_logs = {side: arm.proxy.log_path for side, arm in (b.arms if b is not None else {}).items()}
        audit = b.arms[AUDIT_ON].audit_path if b is not None and AUDIT_ON in b.arms else None
        if audit is not None:
            with contextlib.suppress(OSError), open(audit, "rb") as f:
                result["audit_on_records"] = sum(1 for _ in f)
            with contextlib.suppress(OSError):
                result["audit_on_verification_time_ms"] = verification_times(audit)
        result["elapsed_s"] = time.monotonic() - t0
        result["machine"]["loadavg_at_end"] = os.getloadavg()
        if proxy_log.exists():
            if "table" in result:
                report(result, stamp, proxy_log, arm_logs)
            else:
                shutil.copyfile(proxy_log, _failed_log(stamp))  # the evidence of what went wrong
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"total {result['elapsed_s']:.0f} s; load average at start {result['machine']['loadavg_at_start'][0]:.2f}, "
        f"at end {result['machine']['loadavg_at_end'][0]:.2f} on {os.cpu_count()} CPUs")
    return 0


def _failed_log(stamp: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"proxy_overhead-{stamp}.failed.proxy.log"
    say(f"run failed; proxy log kept in {path}")
    return path


if __name__ == "__main__":
    sys.exit(main())

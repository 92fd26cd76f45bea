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

from txnguard.testing import kafka, raw
from txnguard.testing.clients import java_command, java_producer_performance, run_tool
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess

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

# The targets. Printed next to the figures; never asserted.
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ADDED_P50_MS = 0.3
TARGET_ADDED_P99_MS = 2.0
TARGET_CPU_MS_PER_MB = 15.0
TARGET_RSS_MIB = 200.0


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

    @property
    def records(self) -> int:
        return int(self.rate * self.seconds_per_run)


DEFAULT = Settings("default", seconds_per_run=15, pairs=3, e2e_messages=2000, rtt_requests=2000)
QUICK = Settings("quick", seconds_per_run=3, pairs=2, e2e_messages=500, rtt_requests=500)


def say(text: str) -> None:
    print(text, flush=True)


# -- the proxy process, read from /proc ------------------------------------------------------------


def proxy_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may contain spaces; everything after its ')' is fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    cpu0, t0, (busy0, total0) = proxy_cpu_s(pid), time.monotonic(), host_cpu_ticks()
    yield out
    busy1, total1 = host_cpu_ticks()
    out["proxy_cpu_s"] = proxy_cpu_s(pid) - cpu0
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


@dataclass
class Bench:
    cluster: kafka.Cluster
    proxy: ProxyProcess
    listen: int
    admin: str

    @property
    def pid(self) -> int:
        assert self.proxy.proc is not None
        return self.proxy.proc.pid

    def bootstrap(self, side: str) -> str:
        return self.cluster.bootstrap_servers if side == "direct" else f"{HOST}:{self.listen}"

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
    say(f"\n[1/4] ProducerPerformance: {s.records} x {RECORD_SIZE} B, acks=all, offered {s.rate} records/s, "
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
    say(f"\n[2/4] EndToEndLatency: {s.e2e_messages} x {RECORD_SIZE} B one at a time, acks=all, {s.pairs} pairs")
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
    say(f"\n[3/4] raw Produce round trip: {s.rtt_requests} sequential 1-record requests of {RECORD_SIZE} B, "
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
    header = header_cls(request_api_key=i16(18), request_api_version=i16(3), correlation_id=i32(1),
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
    say(f"\n[4/4] idle connections: {s.idle_connections} clients on the bootstrap listener, one ApiVersions each")
    out = asyncio.run(_idle_connections(b, s))
    say(f"  opened {out['opened']} in {out['open_s']:.1f} s (proxy CPU {out['open_proxy_cpu_s']:.2f} s, "
        f"host busy {out['open_host_busy_pct']:.0f}%), failures {out['failures'] or 'none'}; "
        f"proxy reports {out['active_reported']:.0f} active, fds {out['fds_before']} -> {out['fds_after']}")
    say(f"  proxy RSS {out['rss_before_kib'] / 1024:.1f} MiB -> {out['rss_after_kib'] / 1024:.1f} MiB "
        f"({out['kib_per_connection']:.1f} KiB per connection); after closing all: "
        f"{out['rss_after_close_kib'] / 1024:.1f} MiB, {out['active_after_close']:.0f} active, "
        f"fds {out['fds_after_close']}")
    return out


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
            "txnguard_connections_total", "txnguard_backpressure_paused_seconds_total")
    return {k: v for k, v in metrics.items() if k.startswith(keep)}


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


def summary_rows(perf: dict[str, Any], e2e: dict[str, Any], rtt: dict[str, Any], idle: dict[str, Any]) -> list[Row]:
    pd, pp = perf["median"]["direct"], perf["median"]["proxy"]
    ed, ep = e2e["median"]["direct"], e2e["median"]["proxy"]
    rd, rp = rtt["median"]["direct"], rtt["median"]["proxy"]
    ratio = pp["records_per_sec"] / pd["records_per_sec"]
    cpu_share = 100 * pp["proxy_cpu_s"] / pp["wall_s"]
    rss_mib = idle["rss_after_kib"] / 1024
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
        _diff_row("EndToEnd latency avg (ms)", ed["avg_ms"], ep["avg_ms"]),
        _diff_row("EndToEnd latency p50 (ms, whole ms)", ed["p50_ms"], ep["p50_ms"], TARGET_ADDED_P50_MS),
        _diff_row("EndToEnd latency p99 (ms, whole ms)", ed["p99_ms"], ep["p99_ms"], TARGET_ADDED_P99_MS),
        _diff_row("Raw Produce RTT p50 (us)", rd["p50_us"], rp["p50_us"], TARGET_ADDED_P50_MS * 1000, "us"),
        _diff_row("Raw Produce RTT p99 (us)", rd["p99_us"], rp["p99_us"], TARGET_ADDED_P99_MS * 1000, "us"),
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


def start(tmp: Path, proxy_log: Path) -> Bench:
    say(f"starting Kafka {KAFKA_VERSION} (1 node) in {tmp} ...")
    cluster = kafka.up(KAFKA_VERSION, 1, tmp / "kafka")
    listen, admin_port = proxy_ports()
    admin = f"{HOST}:{admin_port}"
    proxy = ProxyProcess(["--upstream", cluster.bootstrap_servers, "--listen", f"{HOST}:{listen}",
                          "--admin", admin, "--mode", "gateway"], proxy_log)
    b = Bench(cluster, proxy, listen, admin)
    try:
        proxy.start(wait_port=(HOST, listen))
        wait_ready(admin, listen + 2)
    except BaseException:
        # The caller only learns of the cluster (through its folder), not of this process.
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.terminate(timeout=10)
        raise
    say(f"broker {cluster.bootstrap_servers}; proxy pid {b.pid} on {HOST}:{listen} (broker 1 via {listen + 2}), "
        f"admin {admin}")
    return b


def stop(b: Bench | None, cluster_dir: Path) -> None:
    if b is not None and b.proxy.proc is not None and b.proxy.proc.poll() is None:
        code = b.proxy.terminate(timeout=30)
        say(f"proxy stopped (exit {code})")
    cluster = b.cluster if b is not None else None
    if cluster is None and (cluster_dir / "cluster.json").exists():
        cluster = kafka.Cluster.load(cluster_dir)  # kafka.up failed after writing its folder
    if cluster is not None:
        cluster.down()
        say("Kafka stopped")


def measure(b: Bench, s: Settings) -> dict[str, Any]:
    perf = producer_perf_phase(b, s)
    e2e = e2e_phase(b, s)
    rtt = rtt_phase(b, s)
    idle = idle_phase(b, s)
    rows = summary_rows(perf, e2e, rtt, idle)
    return {"producer_performance": perf, "end_to_end_latency": e2e, "produce_rtt": rtt, "idle_connections": idle,
            "summary": [asdict(r) for r in rows], "table": format_table(rows),
            "warnings": perf["warnings"] + e2e["warnings"] + rtt["warnings"],
            "proxy_metrics": interesting_metrics(scrape_metrics(b.admin))}


def report(result: dict[str, Any], stamp: str, proxy_log: Path) -> None:
    log = proxy_log_findings(proxy_log.read_text(errors="replace"))
    result["proxy_log"] = log
    say("\n=== proxy overhead: medians, direct vs through txnguard (targets are information only) ===")
    say(result["table"])
    say("(Java tool percentiles are truncated to whole ms; the raw RTT rows resolve microseconds.)")
    for w in result["warnings"]:
        say(f"WARNING: {w}")
    say(f"\nproxy log levels {log['levels']}; warnings/errors {log['problem_events'] or 'none'}; "
        f"non-JSON lines {log['non_json_count']}")
    for line in log["samples"] + log["non_json_lines"][:5]:
        say(f"  | {line[:300]}")
    say(f"proxy counters at the end: {result['proxy_metrics']}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"proxy_overhead-{stamp}.json"
    out.write_text(json.dumps({k: v for k, v in result.items() if k != "table"}, indent=2, default=str))
    kept_log = RESULTS / f"proxy_overhead-{stamp}.proxy.log"
    shutil.copyfile(proxy_log, kept_log)
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
    args = parser.parse_args()
    s = dataclasses.replace(QUICK if args.quick else DEFAULT, rate=args.rate)
    signal.signal(signal.SIGTERM, _sigterm)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    soft, hard = raise_fd_limit()
    result: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(), "settings": asdict(s),
        "record_size": RECORD_SIZE, "kafka": KAFKA_VERSION, "java_client": JAVA_CLIENT,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": sys.version.split()[0],
                    "nofile": [soft, hard], "loadavg_at_start": os.getloadavg()},
    }
    say(f"proxy_overhead ({s.mode}): RLIMIT_NOFILE {soft}/{hard}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}")
    early = busy_at_start()
    for w in early:
        say(f"WARNING: {w}")
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="txnguard-bench-"))
    proxy_log = tmp / "proxy.log"
    b: Bench | None = None
    try:
        b = start(tmp, proxy_log)
        result.update(measure(b, s))
        result["warnings"] = early + result["warnings"]
    finally:
        stop(b, tmp / "kafka")
        result["elapsed_s"] = time.monotonic() - t0
        result["machine"]["loadavg_at_end"] = os.getloadavg()
        if proxy_log.exists():
            if "table" in result:
                report(result, stamp, proxy_log)
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

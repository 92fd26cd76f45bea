"""Long structure-aware fuzz runs against a live txnguard process in front of a real Kafka.

    .venv/bin/python bench/fuzz.py --cases 20000                 # a few minutes
    .venv/bin/python bench/fuzz.py --cases 1000000 --parallel 48  # the acceptance run
    .venv/bin/python bench/fuzz.py --duration 600 --seed 3        # time-bounded
    .venv/bin/python bench/fuzz.py --replay bench/results/fuzz-....suspects.json   # re-send suspects one by one

Layout (all loopback): a 1-node Kafka (3.5.2 by default) whose broker advertises a
"sidecar" port where this bench runs a relay; `txnguard run --mode gateway` as its
own OS process (so an abort is a death the bench sees, not a failed test). Its
bootstrap listener forwards to the broker directly; its broker listener (and its
own verification connections) reach the broker through the relay.

* Request cases: a seed request (tests/data/frames) mutated by
  txnguard.testing.fuzz, sent on a fresh connection to the bootstrap listener, then an
  ApiVersions v0 probe. Outcome: answered (the probe came back), closed, timeout. Every other request
  case goes on a connection whose client is identified first (an ApiVersions, answered), so that it reaches
  the relay's fast path and its native readers, not only the general path that reads a first request.
* Response cases (`--response-share`): a valid seed request whose client id names
  the case, sent to the broker listener; the relay replaces the broker's real answer to it with a mutation of
  that answer (the walker parses the live response), so the proxy's response
  decoding is fuzzed with fresh broker frames.
* A well-behaved client runs alongside in its own process (confluent-kafka:
  committed and aborted transactions, a plain produce, a read_committed consume of
  everything so far, checked) and must see no error.
* The proxy's VmRSS (/proc/PID/status) is sampled every second; its
  `txnguard_connection_closes_total` and `txnguard_frame_errors_total` are read from
  /metrics at the end.

If the proxy dies, the cases in flight at that moment are written to
`bench/results/fuzz-<ts>.suspects.json` (hex, mutation) and printed; `--replay`
re-sends them one at a time to a fresh proxy to find the one that kills it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import os
import random
import resource
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import fuzz, kafka
from txnguard.testing.proxy import ProxyProcess

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SEEDS = ROOT / "tests" / "data" / "frames"
PROBE_CORRELATION = 0x7FFF0000
PROBE = struct.pack(">ihhih", 2 + 2 + 4 + 2 + 5, ApiKey.API_VERSIONS, 0, PROBE_CORRELATION, 5) + b"probe"
# Sent first, and answered, on every other request case's connection: the client is then identified and the
# case reaches the relay's fast path (the native readers) rather than the general path that reads a
# connection's first request.
IDENTIFY_CORRELATION = PROBE_CORRELATION + 1
IDENTIFY = struct.pack(">ihhih", 2 + 2 + 4 + 2 + 5, ApiKey.API_VERSIONS, 0, IDENTIFY_CORRELATION, 5) + b"ident"
RESPONSE_MARK = "fuzz-r:"
# Responses the proxy decodes on a client's connection (Produce v10+ and Fetch v16+ for KIP-951 endpoints).
DECODED_RESPONSES = {ApiKey.API_VERSIONS: 0, ApiKey.METADATA: 0, ApiKey.FIND_COORDINATOR: 0,
                     ApiKey.DESCRIBE_CLUSTER: 0, ApiKey.PRODUCE: 10, ApiKey.FETCH: 16}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/PID/stat, in clock ticks)."""
    try:
        parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


# -- the relay between the proxy and the broker: mutates answers to marked requests -----------


class MutatingRelay:
    def __init__(self, cluster: kafka.Cluster, mutator: fuzz.Mutator, seed: int) -> None:
        self.cluster, self.mutator, self.seed = cluster, mutator, seed
        self.loop = uvloop.new_event_loop()  # the relay shares this process's one core with the fuzzer
        self.thread = threading.Thread(target=self.loop.run_forever, name="relay", daemon=True)
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=512)
        self.mutated = 0
        self.unparsable = 0

    def start(self) -> MutatingRelay:
        self.thread.start()
        for n in self.cluster.nodes:
            assert n.sidecar_port is not None
            asyncio.run_coroutine_threadsafe(
                asyncio.start_server(self._handler(n.host, n.port), n.host, n.sidecar_port, limit=2**20),
                self.loop).result(10)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _handler(self, host: str, port: int) -> Any:
        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            try:
                broker_r, broker_w = await asyncio.open_connection(host, port, limit=2**20)
            except OSError:
                client_w.close()
                return
            marked: dict[int, tuple[int, int, int]] = {}
            await asyncio.gather(self._requests(client_r, broker_w, marked),
                                 self._responses(broker_r, client_w, marked), return_exceptions=True)

        return handle

    async def _requests(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                        marked: dict[int, tuple[int, int, int]]) -> None:
        try:
            while True:
                prefix = await r.readexactly(4)
                body = await r.readexactly(struct.unpack(">i", prefix)[0])
                if len(body) >= 10:
                    key, version, correlation, n = struct.unpack_from(">hhih", body, 0)
                    client_id = body[10:10 + max(n, 0)].decode("utf-8", "replace")
                    if client_id.startswith(RESPONSE_MARK):
                        marked[correlation] = (key, version, int(client_id[len(RESPONSE_MARK):]))
                w.write(prefix + body)
                await w.drain()
        except (asyncio.IncompleteReadError, OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                w.close()

    async def _responses(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                         marked: dict[int, tuple[int, int, int]]) -> None:
        try:
            while True:
                prefix = await r.readexactly(4)
                body = await r.readexactly(struct.unpack(">i", prefix)[0])
                target = marked.pop(struct.unpack_from(">i", body, 0)[0], None)
                w.write(prefix + body if target is None else self._mutate(body, *target))
                await w.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                w.close()

    def _mutate(self, body: bytes, key: int, version: int, index: int) -> bytes:
        seed = fuzz.Seed(f"live-{key}-v{version}", key, version, "response", body)
        try:
            structure = fuzz.structure(seed)
        except (fuzz.SeedParseError, ValueError):
            self.unparsable += 1
            return struct.pack(">i", len(body)) + body
        case = self.mutator.mutate(seed, structure, random.Random(f"{self.seed}:r:{index}"))
        self.mutated += 1
        self.recent.append({"index": index, "sent_at": time.time(), "case": json.loads(case.describe())})
        return case.stream


# -- the well-behaved client alongside ---------------------------------------------------------


def alongside(bootstrap: str, stop: Any, out: Any) -> None:
    """confluent-kafka through the proxy: transactions, a plain produce, a checked read_committed consume."""
    from txnguard.testing.clients import PYTHON_CLIENTS

    client = PYTHON_CLIENTS["confluent-kafka"]
    topic = f"alongside-{os.getpid()}"
    expected: list[bytes] = []
    i = errors = 0
    try:
        client.create_topic(bootstrap, topic, 1, 1)
    except Exception as e:  # noqa: BLE001 - every failure is an error the report counts
        out.put({"error": f"create_topic: {e!r}"[:400]})
    while not stop.is_set():
        committed, aborted, plain = b"c-%d" % i, b"a-%d" % i, b"p-%d" % i
        try:
            client.run_transaction(bootstrap, topic, "alongside-txn", [committed], True, partition=0)
            expected.append(committed)
            client.run_transaction(bootstrap, topic, "alongside-txn", [aborted], False, partition=0)
            client.produce(bootstrap, topic, [plain], partition=0)
            expected.append(plain)
            got = client.consume_committed(bootstrap, topic, [0])
            if got != expected:
                raise AssertionError(f"read_committed saw {len(got)} values, expected {len(expected)}: "
                                     f"{got[-4:]} vs {expected[-4:]}")
            out.put({"ok": i})
        except Exception as e:  # noqa: BLE001 - every failure is an error the report counts
            errors += 1
            out.put({"error": f"iteration {i}: {e!r}"[:400]})
            expected = client.consume_committed(bootstrap, topic, [0]) if errors < 50 else expected
        i += 1


# -- the fuzzing client ------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    by_api: collections.Counter[str] = field(default_factory=collections.Counter)
    in_flight: dict[int, dict[str, Any]] = field(default_factory=dict)
    timeouts: list[int] = field(default_factory=list)  # the first few, to look at
    done: int = 0


def _marked_request(seed: fuzz.Seed, index: int) -> bytes:
    """A valid seed request whose client id tells the relay which case's mutation to answer with."""
    (n,) = struct.unpack_from(">h", seed.frame, 8)
    mark = f"{RESPONSE_MARK}{index}".encode()
    frame = seed.frame[:8] + struct.pack(">h", len(mark)) + mark + seed.frame[10 + max(n, 0):]
    return struct.pack(">i", len(frame)) + frame


class Fuzzer:
    def __init__(self, mutator: fuzz.Mutator, args: argparse.Namespace, ports: list[int]) -> None:
        self.mutator, self.args, self.ports = mutator, args, ports
        self.tally = Tally()
        self.next_index = args.start
        self.response_seeds = [s for s, _ in mutator.seeds if s.is_request and s.api_key in DECODED_RESPONSES
                               and s.api_version >= DECODED_RESPONSES[s.api_key]]
        self.deadline = time.monotonic() + args.duration if args.duration else None
        self.stopped = False

    def _take(self) -> int | None:
        if self.stopped or self.next_index >= self.args.start + self.args.cases:
            return None
        if self.deadline is not None and time.monotonic() > self.deadline:
            return None
        i, self.next_index = self.next_index, self.next_index + 1
        return i

    def build(self, index: int) -> tuple[bytes, str, int]:
        """Case `index` of this run: a mutated request, or a marked request whose answer the relay mutates."""
        rng = random.Random(f"{self.args.seed}:pick:{index}")
        if self.response_seeds and rng.random() < self.args.response_share:
            seed = rng.choice(self.response_seeds)
            return _marked_request(seed, index), "response", seed.api_key
        case = self.mutator.case(index)
        return case.stream, "request", case.api_key

    def describe(self, index: int, kind: str) -> dict[str, Any]:
        """What a suspect case was, rebuilt from its index (cheaper than keeping it for every case)."""
        if kind == "response":
            return {"index": index, "kind": kind, "note": "the mutated response is in recent_mutated_responses"}
        return {"index": index, "kind": kind, **json.loads(self.mutator.case(index).describe())}

    async def worker(self) -> None:
        while (index := self._take()) is not None:
            stream, kind, api_key = self.build(index)
            self.tally.in_flight[index] = {"index": index, "kind": kind}
            outcome = await self._send(stream, self.ports[-1] if kind == "response" else self.ports[0],
                                       identified=kind == "request" and index % 2 == 1)
            del self.tally.in_flight[index]
            self.tally.outcomes[outcome] += 1
            self.tally.by_kind[f"{kind}:{outcome}"] += 1
            self.tally.by_api[f"{api_key}:{outcome}"] += 1
            if outcome == "timeout" and len(self.tally.timeouts) < 50:
                self.tally.timeouts.append(index)
            self.tally.done += 1

    async def _send(self, stream: bytes, port: int, identified: bool = False) -> str:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        except (OSError, TimeoutError):
            return "connect_failed"
        try:
            if identified:
                w.write(IDENTIFY)
                if await asyncio.wait_for(self._until_probe(r, IDENTIFY_CORRELATION), self.args.case_timeout) \
                        != "answered":
                    return "identify_failed"
            w.write(stream + PROBE)
            return await asyncio.wait_for(self._until_probe(r), self.args.case_timeout)
        except TimeoutError:
            return "timeout"
        except OSError:
            return "closed"
        finally:
            w.transport.abort()

    @staticmethod
    async def _until_probe(r: asyncio.StreamReader, correlation: int = PROBE_CORRELATION) -> str:
        try:
            while True:
                (size,) = struct.unpack(">i", await r.readexactly(4))
                body = await r.readexactly(size)
                if struct.unpack_from(">i", body, 0)[0] == correlation:
                    return "answered"
        except asyncio.IncompleteReadError:
            return "closed"


# -- running it all ------------------------------------------------------------------------------


def _metrics(admin: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("txnguard_connection_closes_total{", "txnguard_frame_errors_total{",
                            "txnguard_connections_total{")):
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
    return out


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(name="rss", daemon=True)
        self.pid, self.halt = pid, threading.Event()
        self.samples: list[tuple[float, int]] = []
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            rss = _rss_kib(self.pid)
            if rss is None:
                return
            self.samples.append((time.monotonic() - self.started, rss))


def _quiet_cluster(version: str, directory: Path) -> kafka.Cluster:
    """kafka.up, except that the broker does not log a stack trace for every malformed request.

    The broker's kafka.network.Processor logs each refused request at ERROR with its stack trace:
    at ~100 cases/s that is ~40,000 log lines a minute, as much CPU as the proxy itself spends.
    The broker still closes those connections; the proxy's own metrics say why.
    """
    cluster = kafka.create(version, 1, directory, sidecars=True)
    cluster.die_with_parent = True
    for n in cluster.nodes:
        for name, line in (("log4j.properties", "log4j.logger.kafka.network.Processor=FATAL\n"),
                           ("log4j2.properties", "logger.processor.name=kafka.network.Processor\n"
                                                 "logger.processor.level=FATAL\n")):
            with (cluster.node_dir(n.id) / name).open("a") as f:
                f.write(line)
    try:
        for n in cluster.nodes:
            cluster.start_node(n.id)
        cluster.wait_ready()
    except BaseException:
        cluster.down()
        raise
    return cluster


def start_stack(args: argparse.Namespace, workdir: Path, mutator: fuzz.Mutator, log: Path,
                ) -> tuple[kafka.Cluster, MutatingRelay, ProxyProcess, str, list[int]]:
    cluster = _quiet_cluster(args.kafka, workdir / "kafka")
    relay = MutatingRelay(cluster, mutator, args.seed).start()
    listen, admin = _free_port(), f"127.0.0.1:{_free_port()}"
    # The bootstrap listener forwards straight to the broker (request cases need no relay: it costs this
    # process CPU per connection); the broker listener reaches the broker through the relay, because
    # the broker advertises the relay's port (response cases go there).
    proxy = ProxyProcess(["--mode", "gateway", "--upstream", cluster.bootstrap_servers,
                          "--listen", f"127.0.0.1:{listen}", "--admin", admin, "--log-level", "warning"],
                         log).start(wait_port=("127.0.0.1", listen))
    # Gateway broker listeners (bootstrap port + 1 + node id) open once metadata names the broker.
    broker_port = listen + 1 + cluster.nodes[0].id
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen), 2) as s:
            s.sendall(PROBE)
            s.recv(4)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", broker_port), 1):
            return cluster, relay, proxy, admin, [listen, broker_port]
        time.sleep(0.2)
    return cluster, relay, proxy, admin, [listen]


def _summary(args: argparse.Namespace, tally: Tally, elapsed: float, sampler: Sampler, alive: bool,
             exit_code: int | None, metrics: dict[str, float], along: dict[str, Any], relay: MutatingRelay,
             ) -> dict[str, Any]:
    rss = [kib for _, kib in sampler.samples]
    step = max(1, len(sampler.samples) // 12)
    return {
        "cases": tally.done, "seconds": round(elapsed, 1), "cases_per_s": round(tally.done / max(elapsed, 1e-9), 1),
        "seed": args.seed, "parallel": args.parallel, "kafka": args.kafka,
        "outcomes": dict(tally.outcomes), "by_kind": dict(tally.by_kind), "by_api": dict(sorted(tally.by_api.items())),
        "relay_mutated_responses": relay.mutated, "relay_unparsable_responses": relay.unparsable,
        "proxy_alive": alive, "proxy_exit_code": exit_code,
        "rss_kib": {"min": min(rss, default=0), "max": max(rss, default=0),
                    "median": int(statistics.median(rss)) if rss else 0,
                    "first": rss[0] if rss else 0, "last": rss[-1] if rss else 0},
        "rss_over_time": [(round(t), kib) for t, kib in sampler.samples[::step]],
        "metrics": metrics, "alongside": along,
    }


def _print(summary: dict[str, Any]) -> None:
    rows = [("cases", summary["cases"]), ("cases/s", summary["cases_per_s"]), ("seconds", summary["seconds"]),
            ("proxy alive", summary["proxy_alive"]), ("proxy exit code", summary["proxy_exit_code"])]
    rows += [(f"outcome {k}", v) for k, v in sorted(summary["outcomes"].items())]
    rows += [(f"  {k}", v) for k, v in sorted(summary["by_kind"].items())]
    rows += [("relay mutated responses", summary["relay_mutated_responses"]),
             ("relay unparsable responses", summary["relay_unparsable_responses"])]
    r = summary["rss_kib"]
    rows += [("proxy RSS MiB min/median/max", f"{r['min'] / 1024:.1f} / {r['median'] / 1024:.1f} / "
                                              f"{r['max'] / 1024:.1f}"),
             ("proxy RSS MiB first/last", f"{r['first'] / 1024:.1f} / {r['last'] / 1024:.1f}")]
    rows += [(f"CPU s {k}", v) for k, v in summary["cpu_seconds"].items()]
    rows += [("load average", " ".join(f"{x:.1f}" for x in summary["load_average"]))]
    rows += [(k.replace("txnguard_", ""), int(v)) for k, v in sorted(summary["metrics"].items())]
    a = summary["alongside"]
    rows += [("alongside iterations ok", a["ok"]), ("alongside errors", a["errors"])]
    width = max(len(str(k)) for k, _ in rows)
    print("\n" + "-" * (width + 30))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"decoders: {summary['codecs_fingerprint']}")
    print("RSS over time (s, MiB): " + ", ".join(f"{t}:{kib / 1024:.0f}" for t, kib in summary["rss_over_time"]))
    for e in a["first_errors"]:
        print(f"  alongside error: {e}")


async def _progress(fz: Fuzzer, sampler: Sampler, proxy: ProxyProcess, started: float) -> None:
    last = 0
    while True:
        await asyncio.sleep(60)
        rss = sampler.samples[-1][1] / 1024 if sampler.samples else 0
        rate = (fz.tally.done - last) / 60
        last = fz.tally.done
        print(f"  {time.monotonic() - started:7.0f} s  {fz.tally.done:9d} cases  {rate:7.1f}/s  RSS {rss:.0f} MiB  "
              f"{dict(fz.tally.outcomes)}", flush=True)
        assert proxy.proc is not None
        if proxy.proc.poll() is not None:
            fz.stopped = True
            return


async def _run_fuzzer(fz: Fuzzer, sampler: Sampler, proxy: ProxyProcess) -> list[dict[str, Any]]:
    """Run the workers; if the proxy dies, return the cases that were in flight at that moment."""
    started = time.monotonic()
    progress = asyncio.create_task(_progress(fz, sampler, proxy, started))
    workers = [asyncio.create_task(fz.worker()) for _ in range(fz.args.parallel)]
    suspects: list[dict[str, Any]] = []
    assert proxy.proc is not None
    while not all(w.done() for w in workers):
        await asyncio.sleep(0.05)
        if proxy.proc.poll() is not None and not suspects:
            suspects = [fz.describe(s["index"], s["kind"]) for s in fz.tally.in_flight.values()]
            fz.stopped = True
    progress.cancel()
    return suspects


def _codecs_fingerprint() -> dict[str, str]:
    """Which decoder code the proxy runs: HEAD and a hash of src/txnguard/codecs as it is on disk (edits included)."""
    import hashlib
    import subprocess

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    digest = hashlib.sha256()
    for f in sorted((ROOT / "src" / "txnguard" / "codecs").glob("*.py")):
        digest.update(f.name.encode() + f.read_bytes())
    return {"head": head, "codecs_sha256": digest.hexdigest()[:16]}


def _raise_nofile() -> None:
    """Many connections at once: raise the soft descriptor limit before the broker and proxy inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run(args: argparse.Namespace) -> int:
    _raise_nofile()
    fingerprint = _codecs_fingerprint()
    mutator = fuzz.Mutator(fuzz.load_seeds(args.seeds), seed=args.seed, max_tags=args.max_tags)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = RESULTS / f"fuzz-{stamp}.proxy.log"
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="txnguard-fuzz-") as tmp:
        cluster, relay, proxy, admin, ports = start_stack(args, Path(tmp), mutator, log)
        assert proxy.proc is not None
        print(f"Kafka {args.kafka} at {cluster.bootstrap_servers}, relay {cluster.sidecar_bootstrap}, "
              f"proxy pid {proxy.proc.pid} on ports {ports}, admin {admin}; {len(mutator.seeds)} seeds", flush=True)
        stop, out = ctx.Event(), ctx.Queue()
        helper = ctx.Process(target=alongside, args=(f"127.0.0.1:{ports[0]}", stop, out), daemon=True)
        if not args.no_alongside:
            helper.start()
        sampler = Sampler(proxy.proc.pid)
        sampler.start()
        fz = Fuzzer(mutator, args, ports)
        started = time.monotonic()
        cpu_before = _cpu_seconds(proxy.proc.pid), time.process_time()
        try:
            suspects = uvloop.run(_run_fuzzer(fz, sampler, proxy))
        finally:
            elapsed = time.monotonic() - started
            cpu = (_cpu_seconds(proxy.proc.pid) - cpu_before[0], time.process_time() - cpu_before[1])
            stop.set()
            if not args.no_alongside:
                helper.join(180)
                if helper.is_alive():
                    helper.terminate()
            sampler.halt.set()
        along = _drain(out)
        alive = proxy.proc.poll() is None
        exit_code = proxy.proc.returncode
        metrics = _metrics(admin) if alive else {}
        summary = _summary(args, fz.tally, elapsed, sampler, alive, exit_code, metrics, along, relay)
        summary["cpu_seconds"] = {"proxy": round(cpu[0], 1), "bench (fuzzer + relay)": round(cpu[1], 1)}
        summary["load_average"] = os.getloadavg()
        summary["codecs_fingerprint"] = fingerprint
        summary["first_timeouts"] = [fz.describe(i, "request") for i in fz.tally.timeouts
                                     if fz.build(i)[1] == "request"][:20]
        if not alive:
            summary["suspects"] = suspects
            summary["recent_mutated_responses"] = list(relay.recent)[-64:]
            (RESULTS / f"fuzz-{stamp}.suspects.json").write_text(json.dumps(summary, indent=1))
        (RESULTS / f"fuzz-{stamp}.json").write_text(json.dumps(summary, indent=1))
        if alive:
            proxy.terminate()
        relay.stop()
        cluster.down()
    _print(summary)
    if not alive:
        print(f"\nPROXY DIED (exit {exit_code}); {len(suspects)} cases in flight, written to "
              f"{RESULTS}/fuzz-{stamp}.suspects.json; log {log}")
        for s in suspects[:20]:
            print(json.dumps(s)[:2000])
    print(f"results: {RESULTS}/fuzz-{stamp}.json")
    return 0 if alive and along["errors"] == 0 else 1


def _drain(out: Any) -> dict[str, Any]:
    ok, errors = 0, []
    while True:
        try:
            item = out.get(timeout=0.5)
        except Exception:  # noqa: BLE001 - queue.Empty from a multiprocessing queue
            break
        if "ok" in item:
            ok += 1
        else:
            errors.append(item["error"])
    return {"ok": ok, "errors": len(errors), "first_errors": errors[:10]}


def replay(args: argparse.Namespace) -> int:
    """Re-send each suspect request case alone to a fresh stack; report the first that kills the proxy."""
    doc = json.loads(Path(args.replay).read_text())
    suspects = [s for s in doc.get("suspects", []) if s.get("kind") == "request"]
    mutator = fuzz.Mutator(fuzz.load_seeds(args.seeds), seed=doc["seed"], max_tags=args.max_tags)
    with tempfile.TemporaryDirectory(prefix="txnguard-replay-") as tmp:
        cluster, relay, proxy, _admin, ports = start_stack(args, Path(tmp), mutator, Path(tmp) / "proxy.log")
        assert proxy.proc is not None
        try:
            for s in suspects:
                stream = mutator.case(s["index"]).stream  # the run's seed and the index rebuild it
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", ports[0]), 5) as c:
                    c.sendall(stream + PROBE)
                    c.settimeout(3)
                    with contextlib.suppress(OSError):
                        c.recv(65536)
                time.sleep(1)
                if proxy.proc.poll() is not None:
                    print(f"KILLER (exit {proxy.proc.returncode}): {json.dumps(s)}")
                    print(Path(tmp, "proxy.log").read_text()[-3000:])
                    return 1
            print(f"none of {len(suspects)} suspects killed the proxy alone")
            proxy.terminate()
            return 0
        finally:
            relay.stop()
            cluster.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0, help="the run's seed: case i is reproducible from (seed, i)")
    p.add_argument("--start", type=int, default=0, help="first case index (to resume or re-run a range)")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: no limit)")
    p.add_argument("--parallel", type=int, default=32, help="connections in flight at once")
    p.add_argument("--response-share", type=float, default=0.1, help="share of cases that fuzz a response")
    p.add_argument("--case-timeout", type=float, default=1.0, help="seconds to wait for the probe's answer")
    p.add_argument("--max-tags", type=int, default=2_000_000, help="largest tagged-field flood")
    p.add_argument("--kafka", default="3.5.2")
    p.add_argument("--seeds", type=Path, default=SEEDS)
    p.add_argument("--no-alongside", action="store_true")
    p.add_argument("--replay", type=Path, help="a suspects.json from a run in which the proxy died")
    args = p.parse_args(argv)
    return replay(args) if args.replay else run(args)


if __name__ == "__main__":
    sys.exit(main())

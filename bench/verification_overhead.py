"""What does verification cost? Transactional ProducerPerformance direct vs proxy (enforce) vs proxy (monitor).

Run: `.venv/bin/python bench/verification_overhead.py [--quick]`

At saturation, this proxy beside another revision's, audit on and off, no sidecar phase (issue 22):
`.venv/bin/python bench/verification_overhead.py --rate -1 --record-size 512 --records 30000 --rounds 5
--arms direct,enforce,noaudit,base --compare-rev main --no-sidecar` (`base`: the proxy of --compare-rev,
enforce, audit on; `noaudit`: this proxy, enforce, no audit log). Each proxy's CPU comes from its own pid.

One run starts a 1-node Kafka 3.5.2 cluster, two `txnguard run` processes in gateway mode in
front of it (one with `policy.mode: enforce`, one with `monitor`), and runs Kafka's own Java
ProducerPerformance (3.5.2) with `--transactional-id` and short transactions through each
side in turn, rounds alternating the order. Then it starts a 1-node cluster laid out for a
sidecar and runs the same load through a sidecar, where every first write of a transaction
is checked with the coordinator and later ones with the leader.

It prints, as figures (nothing is asserted):
* throughput of each side and the ratios proxy/direct;
* VerificationTimeMs p50/p99 per evidence path, exact, from the proxy's audit records, and for
  decisions taken without waiting the proxy thread's CPU time (audit `cpu_ms`);
* coordinator requests per transaction (EndTxn requests count the transactions);
* in the sidecar run, one broker round trip (a DescribeTransactions sampled every 20 ms under the
  same load), the yardstick of the coordinator-evidence target;
* the check-to-append window (txnguard_verification_window_ms) per evidence path, the measured
  upper bound of the time in which a change at the coordinator could slip between check and write.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from txnguard.testing import kafka
from txnguard.testing.clients import java_producer_performance
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.raw import RawClient

KAFKA_VERSION = "3.5.2"
RECORD_SIZE = 100
TRANSACTION_MS = 50          # short transactions: many verifications per second
RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(admin: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("txnguard_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def window_quantile(metrics: dict[str, float], evidence: str, q: float) -> float | None:
    """histogram_quantile over one label set of txnguard_verification_window_ms (bucket resolution)."""
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0].replace("+Inf", "inf")), v)
        for k, v in metrics.items()
        if k.startswith("txnguard_verification_window_ms_bucket") and f'evidence="{evidence}"' in k
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / max(count - prev_count, 1e-9))
        prev_le, prev_count = le, count
    return None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Side:
    def __init__(self, name: str, bootstrap: str, proc: ProxyProcess | None = None, admin: str | None = None,
                 audit: Path | None = None) -> None:
        self.name, self.bootstrap, self.proc, self.admin, self.audit = name, bootstrap, proc, admin, audit
        self.runs: list[Any] = []
        self.cpu_s: list[float] = []  # the proxy process's CPU seconds per run (/proc/<pid>/stat)


def cpu_seconds(side: Side) -> float:
    if side.proc is None or side.proc.proc is None:
        return 0.0
    fields = Path(f"/proc/{side.proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LOAD = {"record_size": RECORD_SIZE}  # --record-size
PROXY_ENV: dict[str, str] = {}  # --proxy-rev: PYTHONPATH to that revision's src/ (proxy_overhead.proxy_source)


def start_proxy(name: str, upstream: str, tmp: Path, mode: str = "gateway", policy_mode: str = "enforce",
                listen: str | None = None, audit_on: bool = True, env: dict[str, str] | None = None,
                verification: dict[str, Any] | None = None) -> Side:
    port = free_port() if listen is None else int(listen.rsplit(":", 1)[1])
    admin = f"127.0.0.1:{free_port()}"
    audit = tmp / f"{name}-audit.jsonl"
    config = tmp / f"{name}.yaml"
    config.write_text(json.dumps({
        "mode": mode, "upstream": upstream, "listen": listen or f"127.0.0.1:{port}", "admin": admin,
        **({"audit_path": str(audit)} if audit_on else {}), "policy": {"mode": policy_mode}, "log_level": "warning",
        **({"verification": verification} if verification else {}),
    }))
    proc = ProxyProcess(["--config", str(config)], tmp / f"{name}.log",
                        env=(PROXY_ENV if env is None else env) or None).start(wait_port=("127.0.0.1", port))
    return Side(name, f"127.0.0.1:{port}", proc, admin, audit if audit_on else None)


def run_load(side: Side, cluster: kafka.Cluster, records: int, rate: int) -> Any:
    topic = fresh_topic(cluster, f"bench-{side.name}-{uuid.uuid4().hex[:6]}")
    cpu = cpu_seconds(side)
    result = java_producer_performance(side.bootstrap, topic, records, "3.5.2", record_size=LOAD["record_size"],
                                       throughput=rate, transactional_id=f"bench-{uuid.uuid4().hex[:8]}",
                                       transaction_duration_ms=TRANSACTION_MS, timeout_s=300)
    side.runs.append(result)
    side.cpu_s.append(cpu_seconds(side) - cpu)
    return result


def audit_decisions(audit: Path) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """An audit file's decision records: VerificationTimeMs and thread CPU time by evidence, and the outcomes."""
    latencies: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    outcomes: dict[str, int] = {}
    for line in audit.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind", "decision") != "decision":
            continue  # schema_version 2 also has a record per closed client connection
        latencies.setdefault(r["evidence"], []).append(r["latency_ms"])
        if r.get("cpu_ms") is not None:
            cpu.setdefault(r["evidence"], []).append(r["cpu_ms"])
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    return latencies, cpu, outcomes


def verification_figures(side: Side) -> dict[str, Any]:
    assert side.audit is not None and side.admin is not None
    latencies, cpu, outcomes = audit_decisions(side.audit)
    m = scrape(side.admin)
    transactions = total(m, 'txnguard_frames_total{api="end_txn",direction="client_to_broker"')
    coordinator = total(m, "txnguard_coordinator_requests_total")
    return {
        "verifications": sum(len(v) for v in latencies.values()),
        "outcomes": outcomes,
        "verification_time_ms": {e: {"n": len(v), "p50": round(pct(v, 0.5), 4), "p99": round(pct(v, 0.99), 4)}
                                 for e, v in sorted(latencies.items())},
        # The proxy thread's own CPU time for decisions taken without waiting: the wall-clock
        # figures above also hold the time the host's scheduler gave the broker and the producer.
        "verification_cpu_ms": {e: {"n": len(v), "p50": round(pct(v, 0.5), 4), "p99": round(pct(v, 0.99), 4)}
                                for e, v in sorted(cpu.items())},
        "transactions": int(transactions),
        "coordinator_requests": int(coordinator),
        "coordinator_requests_per_transaction": round(coordinator / transactions, 3) if transactions else None,
        "describe_transactions_per_transaction": round(total(
            m, 'txnguard_coordinator_requests_total{api="describe_transactions"') / transactions, 3)
        if transactions else None,
        "window_ms": {e: {"p50": _r(window_quantile(m, e, 0.5)), "p99": _r(window_quantile(m, e, 0.99))}
                      for e in latencies},
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def gateway_phase(tmp: Path, rounds: int, records: int, rate: int, arms: list[str],
                  base_env: dict[str, str] | None) -> dict[str, Any]:
    cluster = kafka.up(KAFKA_VERSION, 1, tmp / "kafka-gateway")
    sides = []
    try:
        for arm in arms:
            if arm == "direct":
                sides.append(Side("direct", cluster.bootstrap_servers))
            elif arm in ("enforce", "monitor"):
                sides.append(start_proxy(arm, cluster.bootstrap_servers, tmp, policy_mode=arm))
            elif arm == "noaudit":
                sides.append(start_proxy(arm, cluster.bootstrap_servers, tmp, audit_on=False))
            else:  # base: the proxy of --compare-rev
                sides.append(start_proxy(arm, cluster.bootstrap_servers, tmp, env=base_env))
        for r in range(rounds):
            # Rotated: each arm takes each place in the order in turn.
            for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                res = run_load(side, cluster, records, rate)
                cpu = f"  proxy CPU {side.cpu_s[-1] * 1e6 / res.records:6.1f} us/record" if side.proc else ""
                print(f"  round {r + 1} {side.name:8s} {res.records_per_sec:9.1f} rec/s  "
                      f"avg {res.avg_latency_ms:6.2f} ms  p99 {res.p99_ms} ms{cpu}", flush=True)
        med = {s.name: statistics.median(x.records_per_sec for x in s.runs) for s in sides}
        lat = {s.name: statistics.median(x.avg_latency_ms for x in s.runs) for s in sides}
        cpu_us = {s.name: round(statistics.median(c * 1e6 / x.records for c, x in zip(s.cpu_s, s.runs, strict=True)), 2)
                  for s in sides if s.proc is not None}
        out: dict[str, Any] = {"throughput_records_per_sec": med, "avg_latency_ms": lat,
                               "proxy_cpu_us_per_record": cpu_us}
        direct = [s for s in sides if s.name == "direct"]
        for s in sides:
            if direct and s is not direct[0]:
                out[f"ratio_{s.name}_vs_direct"] = round(med[s.name] / med["direct"], 4)
                # Per round: the arm's rate over the direct run of the same round.
                out[f"ratios_{s.name}_per_round"] = [round(x.records_per_sec / d.records_per_sec, 3)
                                                     for x, d in zip(s.runs, direct[0].runs, strict=True)]
            if s.audit is not None:
                out[s.name] = verification_figures(s)
        return out
    finally:
        for s in sides:
            if s.proc is not None:
                s.proc.terminate()
        cluster.down()


class RoundTrips(threading.Thread):
    """One broker round trip, sampled under the same load: a DescribeTransactions every 20 ms.

    The coordinator-evidence target is "one broker round trip + 1 ms"; this is that round trip,
    measured by a client on the same machine at the same time as the verifications.
    """

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.samples: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with RawClient.connect(self.address) as c:
            while not self.stopping.wait(0.02):
                t0 = time.perf_counter()
                c.describe_transactions("bench-round-trip-probe")
                self.samples.append((time.perf_counter() - t0) * 1000)

    def figures(self) -> dict[str, Any]:
        self.stopping.set()
        self.join(10)
        v = self.samples
        return {"n": len(v), "p50": round(pct(v, 0.5), 3), "p99": round(pct(v, 0.99), 3)} if v else {"n": 0}


def sidecar_phase(tmp: Path, records: int, rate: int) -> dict[str, Any]:
    """The same load through a sidecar, following the coordinator's log and not (one cluster, log off first)."""
    cluster = kafka.up(KAFKA_VERSION, 1, tmp / "kafka-sidecar", sidecars=True)
    node = cluster.nodes[0]
    out: dict[str, Any] = {}
    try:
        for log in (False, True):
            name = f"sidecar-log-{'on' if log else 'off'}"
            side = start_proxy(name, f"{node.host}:{node.port}", tmp, mode="sidecar",
                               listen=f"{node.host}:{node.sidecar_port}", verification={"transaction_log": log})
            try:
                probe = RoundTrips(f"{node.host}:{node.port}")
                probe.start()
                res = run_load(side, cluster, records, rate)
                rtt = probe.figures()
                print(f"  {name}  {res.records_per_sec:9.1f} rec/s  avg {res.avg_latency_ms:6.2f} ms  "
                      f"broker round trip p50 {rtt.get('p50')} / p99 {rtt.get('p99')} ms", flush=True)
                figures = verification_figures(side)
                shown = ("describe_transactions_per_transaction", "coordinator_requests_per_transaction",
                         "window_ms", "verification_time_ms")
                print("    " + json.dumps({k: figures.get(k) for k in shown}), flush=True)
                out[name] = {"throughput_records_per_sec": res.records_per_sec, "broker_round_trip_ms": rtt,
                             **figures}
            finally:
                if side.proc is not None:
                    side.proc.terminate()
        return out
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round (~1 minute)")
    parser.add_argument("--proxy-rev", default=None,
                        help="run the proxies of this git revision (git archive) instead of the working tree's src/")
    parser.add_argument("--compare-rev", default=None, help="the revision of the `base` arm")
    parser.add_argument("--arms", default="direct,enforce,monitor",
                        help="gateway arms, of direct, enforce, monitor, noaudit (enforce, no audit log) and base "
                             "(enforce, the proxy of --compare-rev); default direct,enforce,monitor")
    parser.add_argument("--rate", type=int, default=None, help="offered records/s (-1: as fast as it goes)")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--record-size", type=int, default=RECORD_SIZE)
    parser.add_argument("--no-sidecar", action="store_true", help="the gateway phase only")
    args = parser.parse_args()
    rounds, records, rate = (1, 5000, 2500) if args.quick else (3, 20000, 2500)
    rounds = args.rounds if args.rounds is not None else rounds
    records = args.records if args.records is not None else records
    rate = args.rate if args.rate is not None else rate
    LOAD["record_size"] = args.record_size
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not set(arms) <= {"direct", "enforce", "monitor", "noaudit", "base"} or \
            ("base" in arms) != bool(args.compare_rev):
        parser.error("--arms: of direct, enforce, monitor, noaudit, base; base goes with --compare-rev")
    source: dict[str, Any] = {"source": "working tree"}
    sidecar: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="txnguard-bench-") as d:
        tmp = Path(d)
        from proxy_overhead import proxy_source  # the same git archive as proxy_overhead --proxy-rev

        if args.proxy_rev is not None:
            env, source = proxy_source(args.proxy_rev, tmp)
            PROXY_ENV.update(env)
        base_env = None
        if args.compare_rev is not None:
            base_env, source["base"] = proxy_source(args.compare_rev, tmp)
        print(f"proxy code: {source}", flush=True)
        print(f"gateway: {rounds} round(s) of {records} records of {LOAD['record_size']} B at {rate}/s, "
              f"{TRANSACTION_MS} ms transactions, arms {arms}", flush=True)
        gateway = gateway_phase(tmp, rounds, records, rate, arms, base_env)
        if not args.no_sidecar:
            print("sidecar: one run", flush=True)
            sidecar = sidecar_phase(tmp, records, rate)
    summary = {"kafka": KAFKA_VERSION, "records": records, "record_size": LOAD["record_size"], "arms": arms,
               "offered_rate": rate, "rounds": rounds,
               "transaction_ms": TRANSACTION_MS, "gateway": gateway, "sidecar": sidecar, "proxy_source": source,
               "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(json.dumps(summary, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"verification_overhead-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

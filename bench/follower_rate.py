"""What following the coordinator's log costs a proxy per transaction of the cluster, at several transaction rates.

Run: `.venv/bin/python bench/follower_rate.py [--producers 1,4,16] [--seconds 20]`

A 1-node Kafka 3.5.2 and a gateway following its `__transaction_state`. No client goes through the gateway:
the load (a child process, `--producers` confluent-kafka transactional producers in threads, each committing
one-record transactions back to back) goes straight to the broker, so all the gateway's CPU in a step is its
follower's. Per step: the transactions committed, the records the follower read
(`txnguard_transaction_log_records_total`), the gateway's CPU (/proc, user + system) minus what it spent idle
over as long, and so its CPU per cluster transaction and its share of a core. A long poll carries every record
appended while the previous one was on its way, so the cost per transaction falls as the rate rises; the
sequential loop of `bench/proxy_overhead.py --only loops` is the follower's worst case.

The gateway's follower long-polls throughout (`verification.transaction_log_idle_after_s` unset): no write asks
it here, so by default it would idle 30 s after its start; `--idle` lets it, to measure the idle follower.

`--compare-rev REV`: a second gateway, the proxy of git revision REV (its native module built), follows the same
log beside it; both are measured in the same steps, under the same load (an A/B in one run).

Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from txnguard.testing import kafka
from txnguard.testing.bounce import free_port
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import metric_sum, proxy_cpu_s, proxy_cpu_times, proxy_source, scrape_metrics

_LOAD = textwrap.dedent("""
    import sys, threading, time
    from confluent_kafka import Producer
    bootstrap, topic, tag = sys.argv[1], sys.argv[2], sys.argv[5]
    producers, seconds = int(sys.argv[3]), float(sys.argv[4])
    counts = [0] * producers
    ready = threading.Barrier(producers + 1)
    stop_at = [0.0]
    def run(i):
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{tag}-{i}", "linger.ms": 0})
        p.init_transactions(30)
        ready.wait()
        while time.monotonic() < stop_at[0]:
            p.begin_transaction()
            p.produce(topic, b"x", partition=i % 4)
            p.commit_transaction(30)
            counts[i] += 1
    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + 3600
    ready.wait()
    print("started", flush=True)
    sys.stdin.readline()  # the parent measures from here
    stop_at[0] = time.monotonic() + seconds
    started = time.monotonic()
    for t in threads:
        t.join()
    print(sum(counts), time.monotonic() - started, flush=True)
""")


def read_so_far(admin: str) -> tuple[float, float]:
    """(records read, Fetch requests sent) by the gateway's follower; Fetches NaN for a revision without the count."""
    metrics = scrape_metrics(admin)
    fetches = metrics.get("txnguard_transaction_log_fetches_total", float("nan"))
    return metric_sum(metrics, "txnguard_transaction_log_records_total"), fetches


def _has_idling(rev: str) -> bool:
    """Whether revision `rev`'s config knows `verification.transaction_log_idle_after_s`."""
    found = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent.parent), "grep", "-q",
                            "transaction_log_idle_after_s", rev, "--", "src/txnguard/proxy/config.py"], check=False)
    return found.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--producers", default="1,4,16", help="concurrent transactional producers per step")
    parser.add_argument("--seconds", type=float, default=20.0, help="each step's length")
    parser.add_argument("--idle", action="store_true",
                        help="let this gateway's follower idle as configured by default (30 s after the last write "
                             "that asked the log: here, 30 s after its start), instead of long-polling throughout")
    parser.add_argument("--compare-rev", help="a second gateway of this git revision, measured beside this one")
    parser.add_argument("--profile-cmd", help="a profiler attached to the gateway around each step, {pid} and {out} "
                        "filled in, e.g. 'py-spy record --pid {pid} --format raw -o {out}'; stopped with SIGINT")
    args = parser.parse_args()
    steps = [int(n) for n in args.producers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="txnguard-follower-rate-"))
    started = time.monotonic()
    cluster = kafka.up("3.5.2", 1, tmp / "kafka")
    gateways: dict[str, tuple[ProxyProcess, int, str]] = {}
    arms = [("this", None)] + ([(f"rev {args.compare_rev}", args.compare_rev)] if args.compare_rev else [])
    rows = []
    try:
        for name, rev in arms:
            env = proxy_source(rev, tmp)[0] if rev else {}
            port, admin_port = free_port(), free_port()
            config = tmp / f"gateway-{len(gateways)}.yaml"
            settings: dict[str, object] = {"mode": "gateway", "upstream": cluster.bootstrap_servers,
                                           "listen": f"127.0.0.1:{port}", "admin": f"127.0.0.1:{admin_port}",
                                           "log_level": "warning"}
            if not args.idle and (rev is None or _has_idling(rev)):
                # No write asks this gateway's log (no client goes through it): it would idle after 30 s. This
                # bench sizes the long poll, so it long-polls throughout (a revision before idling always does,
                # and its config would refuse the setting). Both gateways alike: an A/B of a long poll against an
                # idle follower measures nothing.
                settings["verification"] = {"transaction_log_idle_after_s": None}
            config.write_text(json.dumps(settings))
            proxy = ProxyProcess(["--config", str(config)], tmp / f"gateway-{len(gateways)}.log", env=env)
            proxy.start(wait_port=("127.0.0.1", port))
            assert proxy.proc is not None
            gateways[name] = (proxy, proxy.proc.pid, f"127.0.0.1:{admin_port}")
        topic = fresh_topic(cluster, "rate", partitions=4)
        time.sleep(3)
        idle0, t0 = {n: proxy_cpu_s(pid) for n, (_, pid, _) in gateways.items()}, time.monotonic()
        time.sleep(args.seconds)
        idle_per_s = {n: (proxy_cpu_s(pid) - idle0[n]) / (time.monotonic() - t0) for n, (_, pid, _) in gateways.items()}
        for n, idle in idle_per_s.items():
            print(f"idle gateway ({n}): {idle * 1000:.1f} ms of CPU a second", flush=True)
        for n in steps:
            load = subprocess.Popen([sys.executable, "-c", _LOAD, cluster.bootstrap_servers, topic, str(n),
                                     str(args.seconds), f"rate{n}-{time.monotonic_ns()}"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert load.stdin is not None and load.stdout is not None
            if load.stdout.readline().strip() != "started":
                raise RuntimeError("the load did not start")
            time.sleep(1)  # the producers' first coordinator lookups out of the way
            c0 = {g: proxy_cpu_s(pid) for g, (_, pid, _) in gateways.items()}
            k0 = {g: proxy_cpu_times(pid)[1] for g, (_, pid, _) in gateways.items()}
            r0 = {g: read_so_far(admin) for g, (_, _, admin) in gateways.items()}
            w0 = time.monotonic()
            profiler = None
            if args.profile_cmd:
                out = Path(__file__).parent / "results" / f"profile-follower-{n}-{time.strftime('%Y%m%dT%H%M%S')}"
                pid = gateways["this"][1]
                profiler = subprocess.Popen(shlex.split(args.profile_cmd.format(pid=pid, out=out)))
            load.stdin.write("go\n")
            load.stdin.flush()
            done, elapsed = load.stdout.readline().split()
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(30)
            load.wait(60)
            time.sleep(0.5)  # the last records read
            wall = time.monotonic() - w0
            txns = int(done)
            for g, (_, pid, admin) in gateways.items():
                cpu = proxy_cpu_s(pid) - c0[g] - idle_per_s[g] * wall
                kernel = proxy_cpu_times(pid)[1] - k0[g]
                records, fetches = (b - a for a, b in zip(r0[g], read_so_far(admin), strict=True))
                row = {"gateway": g, "producers": n, "transactions": txns, "txn_per_s": txns / float(elapsed),
                       "records_per_txn": records / max(1, txns), "fetches_per_txn": fetches / max(1, txns),
                       "cpu_ms_per_txn": 1000 * cpu / max(1, txns), "cpu_us_per_fetch": 1e6 * cpu / fetches,
                       "cores": cpu / wall, "kernel_share": kernel / max(cpu, 1e-9)}
                rows.append(row)
                print(f"{n:3d} producers: {row['txn_per_s']:7.1f} txn/s, {row['records_per_txn']:.2f} log records "
                      f"and {row['fetches_per_txn']:.2f} Fetches a transaction; follower ({g}) "
                      f"{row['cpu_ms_per_txn']:.3f} ms of CPU per transaction ({row['cpu_us_per_fetch']:.0f} us per "
                      f"Fetch, {100 * row['kernel_share']:.0f} % in the kernel), {row['cores']:.3f} of a core",
                      flush=True)
    finally:
        for proxy, _, _ in gateways.values():
            proxy.terminate()
        cluster.down()
    out = Path(__file__).parent / "results" / f"follower_rate-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"idle_cpu_ms_per_s": {g: v * 1000 for g, v in idle_per_s.items()}, "steps": rows},
                              indent=1))
    print(f"wrote {out}; total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

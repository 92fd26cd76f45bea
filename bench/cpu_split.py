"""Where a live proxy's CPU goes, stage by stage, per call and per transaction: on-CPU time, not samples.

Run: `python bench/cpu_split.py [--families java-3.5.2,confluent-kafka] [--transactions 2000]`

Why. A sampling profiler (py-spy) samples wall time: on two cores shared with the broker's and the client's JVMs,
a `write` the scheduler pre-empts looks like half the proxy's time, and the interpreter's share of the rest is
lost among the samples. The bench's own figures split the proxy's CPU into user and system time: system time
is the same for the bare relay, txnguard and Kroxylicious (the sockets), so what separates them is user time,
which here is the interpreter's. This tool says which Python stages it goes to, with each stage's own clock.

How. It starts Kafka 3.5.2 (one broker) and two txnguard gateways in front of it: a plain one, and one started
through this same file as launcher (`python bench/cpu_split.py run <the flags of txnguard run>`), which wraps
the stages below in a pair of `time.thread_time` reads (the thread's on-CPU time, user and system, in ns)
before txnguard runs. For each family: a warm-up loop through each; the measured one-record transaction loop
(txnguard.testing.short_transactions) through the plain one (its process CPU: the figure without wrappers);
then the same loop through the wrapped one, between two requests for its counters (SIGUSR1: the launcher
writes them to a file). The difference is that loop's; per transaction divides by its transactions.

Stages (inclusive: an outer stage's time includes the inner ones'):
- `from_client` / `from_upstream`: the shell's whole callback for one socket read (Session), the write of
  the bytes to the other side included;
- `relay_requests` / `relay_responses`: the relay's fast path over that read (connection/relay.py);
- `txn_produce`, `life_cycle[key]`, `offset_commit`: the fast path's in-place helpers for one frame;
- `observe_response[key]`: a life-cycle answer read in place and learned from by the rules in Python (only where
  the registry or the EndTxn ledger is the Python one: the relay's native book learns from it with the native ones
  inside `relay_responses`);
- `general_requests` / `general_responses`: the connection core's general path for the rest of a read;
- `execute`: the shell running the commands the general path returned;
- `booked`: the guard's booking of what the fast path recorded.
`process` is the proxy process's CPU over the loop (os.times: every thread, the timers, the follower, the
admin server, and these wrappers' own cost included); the plain proxy's, over the same loop, is printed
beside it.

What it costs. Each wrapped call adds a Python frame and two `thread_time` calls (system calls). The table
prints what one wrapped call of nothing costs warm, and the two proxies' CPU over the same loop (one run each:
their difference is the wrappers' live cost within the noise of a run, which is about 0.1 ms a transaction).
Every per-call figure carries its share of that. The figures are the live, cold-cache costs the relay pays,
several times what the same call costs in a warm loop (bench/cold_cache.py): that ratio is the point of this
tool. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT_ENV = "BENCH_CPU_SPLIT_OUT"  # where the launcher writes its counters on SIGUSR1


# -- the launcher (inside the proxy process) -------------------------------------------------------------------

def _install() -> None:
    """Wrap the stages in the proxy's own process, before any connection exists."""
    from txnguard.connection import core, relay
    from txnguard.proxy import guard, session
    from txnguard.verification import decisions

    tt = time.thread_time_ns
    calls: Counter[str] = Counter()
    ns: Counter[str] = Counter()

    def timed(name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, its on-CPU time and calls counted under `name` (or the label `name` gives its arguments)."""
        fixed = name if isinstance(name, str) else None
        namer = name if not isinstance(name, str) else None

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = tt()
            try:
                return fn(*args, **kwargs)
            finally:
                label = fixed if namer is None else namer(*args)
                ns[label] += tt() - t0
                calls[label] += 1
        return wrapper

    session.Session.from_client = timed("from_client", session.Session.from_client)  # type: ignore[method-assign]
    session.Session.from_upstream = timed("from_upstream", session.Session.from_upstream)  # type: ignore[method-assign]
    session.Session._execute = timed("execute", session.Session._execute)  # type: ignore[method-assign]
    core.Connection.relay_from_client = timed("relay_requests", relay.relay_requests)  # type: ignore[method-assign]
    core.Connection.relay_from_broker = timed("relay_responses", relay.relay_responses)  # type: ignore[method-assign]
    core.Connection.receive_from_client = timed("general_requests",  # type: ignore[method-assign]
                                                core.Connection.receive_from_client)
    core.Connection.receive_from_broker = timed("general_responses",  # type: ignore[method-assign]
                                                core.Connection.receive_from_broker)
    relay._transactional_produce = timed("txn_produce", relay._transactional_produce)
    relay._offset_commit = timed("offset_commit", relay._offset_commit)
    relay._life_cycle = timed(lambda conn, book, data, pos, stop, key, *rest: f"life_cycle[{key}]", relay._life_cycle)
    rules = decisions.TransactionRules
    rules.observe_response_in_place = timed(  # type: ignore[method-assign]
        lambda self, key, *rest: f"observe_response[{key}]", rules.observe_response_in_place)
    guard.TransactionGuard.booked = timed("booked", guard.TransactionGuard.booked)  # type: ignore[method-assign]

    def wrapped_noop() -> None:
        return None

    probe = timed("probe", wrapped_noop)

    def dump(signum: int, frame: object) -> None:
        # What one wrapped call of nothing costs, warm: the floor under every per-call figure.
        before = ns["probe"], calls["probe"]
        for _ in range(1000):
            probe()
        probe_ns = (ns["probe"] - before[0]) / max(1, calls["probe"] - before[1])
        user, system = os.times()[:2]
        out = {"ns": dict(ns), "calls": dict(calls), "user_s": user, "sys_s": system, "probe_ns": probe_ns}
        Path(os.environ[OUT_ENV]).write_text(json.dumps(out))

    signal.signal(signal.SIGUSR1, dump)


def launch() -> int:
    _install()
    from txnguard.cli import main

    return main()  # sys.argv[1:] is `run <flags>`: txnguard's own command line


# -- the bench (outside) -------------------------------------------------------------------------------------

# The follower of the coordinator's log long-polls for 30 s after the start and after any write that asked it;
# no write here asks it (each passes on what the proxy saw), so after a second it only reads the log every 5 s,
# as in a proxy that has run a while. Its long poll's cost is bench/follower_rate.py's to measure.
FOLLOWER_IDLES = {"TXNGUARD_VERIFICATION__TRANSACTION_LOG_IDLE_AFTER_S": "1"}
ORDER = ("from_client", "relay_requests", "txn_produce", "life_cycle[24]", "life_cycle[25]", "life_cycle[26]",
         "life_cycle[22]", "offset_commit", "general_requests", "booked", "from_upstream", "relay_responses",
         "observe_response[24]", "observe_response[25]", "observe_response[26]", "observe_response[22]",
         "general_responses", "execute")


def snapshot(pid: int, out: Path) -> dict[str, Any]:
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if out.exists():
            try:
                return json.loads(out.read_text())  # type: ignore[no-any-return]
            except json.JSONDecodeError:
                pass  # written in part: read again
        time.sleep(0.05)
    raise RuntimeError("the proxy wrote no counters within 10 s")


def table(family: str, before: dict[str, Any], after: dict[str, Any], transactions: int, plain_ms: float) -> None:
    process_s = (after["user_s"] - before["user_s"]) + (after["sys_s"] - before["sys_s"])
    wrapped_ms = 1000 * process_s / transactions
    print(f"\n{family}: {transactions} transactions; proxy process CPU {wrapped_ms:.3f} ms a transaction wrapped "
          f"(user {1000 * (after['user_s'] - before['user_s']) / transactions:.3f}, system "
          f"{1000 * (after['sys_s'] - before['sys_s']) / transactions:.3f}), {plain_ms:.3f} ms plain: the wrappers "
          f"cost {1000 * (wrapped_ms - plain_ms):.0f} us a transaction; one wrapped call of nothing "
          f"{after['probe_ns'] / 1000:.2f} us warm")
    print(f"  {'stage':22} {'calls/txn':>9} {'us/call':>8} {'us/txn':>8} {'of process':>10}")
    names = [n for n in ORDER if n in after["calls"]] + sorted(set(after["calls"]) - set(ORDER) - {"probe"})
    for name in names:
        calls = after["calls"].get(name, 0) - before["calls"].get(name, 0)
        spent = (after["ns"].get(name, 0) - before["ns"].get(name, 0)) / 1e3  # us
        if calls <= 0:
            continue
        share = spent / 1e6 / process_s if process_s > 0 else 0.0
        print(f"  {name:22} {calls / transactions:9.2f} {spent / calls:8.1f} {spent / transactions:8.1f} "
              f"{100 * share:9.1f}%")


def bench(families: list[str], transactions: int) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from proxy_overhead import LaunchedProxyProcess, cpu_meter, proxy_ports, wait_ready

    from txnguard.testing import kafka
    from txnguard.testing.fixtures import fresh_topic
    from txnguard.testing.proxy import ProxyProcess, direct_bootstrap
    from txnguard.testing.short_transactions import run_loop

    tmp = Path(tempfile.mkdtemp(prefix="txnguard-cpu-split-"))
    out = tmp / "split.json"
    cluster = kafka.up("3.5.2", 1, tmp / "kafka")
    proxies: list[Any] = []
    try:
        ports = []
        for launcher in (Path(__file__).resolve(), None):  # the wrapped proxy, and a plain one beside it
            listen, admin_port = proxy_ports()
            admin = f"127.0.0.1:{admin_port}"
            args = ["--upstream", direct_bootstrap(cluster), "--listen", f"127.0.0.1:{listen}", "--admin", admin,
                    "--mode", "gateway"]
            env = {OUT_ENV: str(out), **FOLLOWER_IDLES}
            log = tmp / f"proxy-{len(proxies)}.log"
            proxy = LaunchedProxyProcess(launcher, args, log, env=env) if launcher else ProxyProcess(args, log, env=env)
            proxies.append(proxy)
            proxy.start(wait_port=("127.0.0.1", listen))
            wait_ready(admin, listen + 2)
            ports.append(listen)
        wrapped, plain = proxies
        assert wrapped.proc is not None and plain.proc is not None
        time.sleep(2)  # the follower idle (FOLLOWER_IDLES)
        for family in families:
            topic = fresh_topic(cluster, f"cpu-split-{family}")
            for port in ports:
                run_loop(family, f"127.0.0.1:{port}", topic, f"split-warm-{family}-{uuid.uuid4().hex[:6]}",
                         max(50, transactions // 5))
            # The plain proxy first, then the wrapped one: the same loop, the wrappers' cost the difference.
            with cpu_meter(plain.proc.pid) as cpu:
                plain_result = run_loop(family, f"127.0.0.1:{ports[1]}", topic,
                                        f"split-plain-{family}-{uuid.uuid4().hex[:6]}", transactions)
            before = snapshot(wrapped.proc.pid, out)
            result = run_loop(family, f"127.0.0.1:{ports[0]}", topic, f"split-{family}-{uuid.uuid4().hex[:6]}",
                              transactions)
            after = snapshot(wrapped.proc.pid, out)
            table(family, before, after, result.transactions, 1000 * cpu["proxy_cpu_s"] / plain_result.transactions)
    finally:
        for proxy in proxies:
            if proxy.proc is not None and proxy.proc.poll() is None:
                proxy.terminate(timeout=30)
        cluster.down()
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        return launch()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--families", default="java-3.5.2,confluent-kafka")
    parser.add_argument("--transactions", type=int, default=2000)
    args = parser.parse_args()
    return bench(args.families.split(","), args.transactions)


if __name__ == "__main__":
    sys.exit(main())

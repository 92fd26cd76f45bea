"""Memory for sizing a gateway: per client connection, per transactional id (registry and the log's view).

Run: `.venv/bin/python bench/sizing.py [--connections 2000,9000] [--ids 100000]`

* connections: a 1-node Kafka 3.5.2 and a `txnguard run` gateway process; N client connections opened in
  steps, each sending one ApiVersions and Metadata (so the proxy holds its upstream connection for it too),
  then left idle; the proxy's resident memory (VmRSS) before and after, per connection. Each client connection
  costs the proxy two sockets (client and broker): with a limit of 20,000 open files a process, about 9,900
  connections are the most one process here can hold (`limits.max_connections` defaults to 10,000);
* ids: the registry (what a gateway saw: InitProducerId, AddPartitionsToTxn of two partitions), native and
  Python, each in a process of its own (resident memory: tracemalloc does not see Rust's allocations), and the
  follower's view of the coordinator's log (tracemalloc), each filled with `--ids` transactional ids.

Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from txnguard.codecs.transaction_log import LogRecord, TxnLogValue
from txnguard.testing import kafka
from txnguard.testing.bounce import free_port
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.raw import RawClient
from txnguard.testing.transaction_log_writer import key, value
from txnguard.verification.transaction_log_view import TransactionLogView


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def connections(steps: list[int]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="txnguard-sizing-"))
    cluster = kafka.up("3.5.2", 1, tmp / "kafka")
    port, admin = free_port(), free_port()
    config = tmp / "gateway.yaml"
    config.write_text(json.dumps({"mode": "gateway", "upstream": cluster.bootstrap_servers,
                                  "listen": f"127.0.0.1:{port}", "admin": f"127.0.0.1:{admin}",
                                  "log_level": "warning"}))
    proxy = ProxyProcess(["--config", str(config)], tmp / "gateway.log").start(wait_port=("127.0.0.1", port))
    assert proxy.proc is not None
    held: list[RawClient] = []
    try:
        with RawClient("127.0.0.1", port) as c:  # warm: the first connection loads the lazy parts
            c.api_versions()
        time.sleep(1)
        base = rss_kib(proxy.proc.pid)
        print(f"connections: idle gateway {base / 1024:.1f} MiB")
        for target in steps:
            while len(held) < target:
                c = RawClient("127.0.0.1", port, timeout=30)
                c.api_versions()
                c.metadata([])
                held.append(c)
            time.sleep(2)
            now = rss_kib(proxy.proc.pid)
            print(f"connections: {target} open: {now / 1024:.1f} MiB, {(now - base) / target:.1f} KiB a connection")
    finally:
        for h in held:
            with contextlib.suppress(OSError):
                h.close()
        proxy.terminate()
        cluster.down()


def fill_registry(kind: str, count: int) -> None:
    """`--fill-registry`: run in a process of its own by `ids`; prints the ids held and the resident bytes they took."""
    from txnguard.verification.registry import NativeRegistry, PythonRegistry, RegistryLimits

    registry = (NativeRegistry if kind == "native" else PythonRegistry)(RegistryLimits(max_entries=count * 2))
    gc.collect()
    before = rss_kib(os.getpid())
    for i in range(count):
        registry.init_producer_id(f"app-{i:08d}", 1000 + i, 0, 60_000, i)
        registry.added(f"app-{i:08d}", 1000 + i, 0, i, partitions={("orders", i % 12), ("payments", i % 7)})
    gc.collect()
    print(len(registry), (rss_kib(os.getpid()) - before) * 1024)


def ids(count: int) -> None:
    # The registry each way, each in a process of its own, by resident memory: tracemalloc does not see the
    # native registry's memory (Rust's allocator is not Python's).
    for kind in ("native", "Python"):
        done = subprocess.run([sys.executable, __file__, "--fill-registry", kind, "--ids", str(count)],
                              capture_output=True, text=True, check=True)
        held, used = map(int, done.stdout.split())
        print(f"ids: the {kind} registry with {held} ids: {used / 2**20:.1f} MiB resident "
              f"({used / count:.0f} bytes an id)")
    gc.collect()
    tracemalloc.start()
    view = TransactionLogView()
    for i in range(count):
        v = TxnLogValue(1000 + i, 0, 60_000, "Ongoing", frozenset({("orders", i % 12), ("payments", i % 7)}),
                        1_700_000_000_000, 1_700_000_000_000)
        view.apply(i % 50, LogRecord(i, key(f"app-{i:08d}"), value(v)))
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"ids: the log's view with {len(view)} ids: {used / 2**20:.1f} MiB ({used / count:.0f} bytes an id)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", default="2000,9000")
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--fill-registry", choices=("native", "Python"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fill_registry:
        fill_registry(args.fill_registry, args.ids)
        return
    ids(args.ids)
    if args.connections:
        connections([int(x) for x in args.connections.split(",")])


if __name__ == "__main__":
    main()

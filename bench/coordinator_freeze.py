"""The coordinator-freeze matrix of issue 13: client x freeze x target, each cell pass or fail.

Run: `.venv/bin/python bench/coordinator_freeze.py [--freezes 2,6,12] [--clients sarama,kafka-python,confluent-kafka]
     [--targets proxy,native,proxy-hold-off] [--runs 1]`

Two 3-node clusters: Kafka 3.5.2 with a gateway proxy in front (every transactional write checked with
the coordinator, each question bounded by 1 s: the S4 setting) and Kafka 3.9.2 alone (its own KIP-890
verification). In each cell a client with a small retry budget (3 retries 100 ms apart; Sarama's
default) runs 3 paced transactions of 10 records, one Produce per record, and the node coordinating
its transactional id is frozen (SIGSTOP) for the cell's length right after an acknowledgement
(txnguard.testing.freezes). A cell passes when no transaction was aborted and read_committed holds
every committed record exactly once. `proxy-hold-off` is the proxy as it was before issue 13
(`hold_share: 0`). Prints a Markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from txnguard.testing.fixtures import ClusterPool
from txnguard.testing.freezes import CellResult, run_cell
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread

VERIFY_WITH_COORDINATOR = {"leader_evidence": False, "evidence_ttl_ms": 0, "timeout_s": 1.0}
TARGETS = {"proxy": ("3.5.2", 0.8), "proxy-hold-off": ("3.5.2", 0.0), "native": ("3.9.2", None)}


def cell(pool: ClusterPool, client: str, freeze_s: float, target: str) -> tuple[CellResult, str]:
    version, share = TARGETS[target]
    cluster = pool.get(version, 3)
    if share is None:
        return run_cell(cluster, lambda c: c.bootstrap_servers, client, freeze_s, f"native {version}"), ""
    proxies: list[ProxyThread] = []

    def front(c: Cluster) -> str:
        proxy = ProxyThread.from_settings(upstream=c.bootstrap_servers, mode="gateway", admin="127.0.0.1:0",
                                          log_level="warning",
                                          verification={**VERIFY_WITH_COORDINATOR, "hold_share": share}).start()
        proxies.append(proxy)
        return str(proxy.bootstrap)

    try:
        result = run_cell(cluster, front, client, freeze_s, f"{target} {version}")
        m = proxies[0].metric
        extra = (f"held {m('txnguard_verification_hold_endings_total', {'ending': 'decided'}):.0f} decided / "
                 f"{m('txnguard_verification_hold_endings_total', {'ending': 'timeout'}):.0f} run out, "
                 f"{m('txnguard_verification_failures_total', {'reason': 'coordinator_unavailable'}):.0f} refused")
        return result, extra
    finally:
        for p in proxies:
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--freezes", default="2,6,12")
    ap.add_argument("--clients", default="sarama,kafka-python,confluent-kafka")
    ap.add_argument("--targets", default="proxy,native,proxy-hold-off")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    freezes = [float(f) for f in args.freezes.split(",")]
    with tempfile.TemporaryDirectory(prefix="txnguard-freeze-") as root:
        pool = ClusterPool(Path(root), max_alive=2)
        try:
            print("| client | freeze | target | result | client's run | proxy |")
            print("| --- | --- | --- | --- | --- | --- |")
            started = time.monotonic()
            for target in args.targets.split(","):
                for client in args.clients.split(","):
                    for freeze_s in freezes:
                        for _ in range(args.runs):
                            result, extra = cell(pool, client, freeze_s, target)
                            first = f" `{result.errors[0][:80]}`" if result.errors else ""
                            verdict = "pass" if result.passed else f"**fail** ({result.aborted} aborted){first}"
                            print(f"| {client} | {freeze_s:g} s | {result.target} | {verdict} | "
                                  f"{result.seconds:.1f} s | {extra} |", flush=True)
            print(f"\n{time.monotonic() - started:.0f} s in all")
        finally:
            pool.close()


if __name__ == "__main__":
    main()

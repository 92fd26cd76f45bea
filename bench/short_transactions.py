"""Short-transaction loops, direct vs through txnguard, side by side (issue 11: CONCURRENT_TRANSACTIONS absorbed).

One Kafka 3.5.2 node in the sidecar layout: the broker advertises a port where a tap
(a FaultRelay with no fault) listens. Direct, the tap forwards to the broker; proxied,
to a `txnguard run --mode sidecar` process in front of the broker; and optionally to
a proxy with absorption off (`--with-off`). Every client sees the same path length
but for the proxy. Per client family and round, the modes alternate; the loop writes
one record to partition 0 per transaction.

Printed per family: transactions/s per mode (median of rounds), the ratio proxied /
direct, the CONCURRENT_TRANSACTIONS answers the client received (the tap's count), and
the proxy's own absorption counters from /metrics.

    .venv/bin/python bench/short_transactions.py --transactions 300 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from txnguard.testing import kafka, raw
from txnguard.testing.bounce import free_port
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.short_transactions import FAMILIES, ConcurrentTap, run_loop

RESULTS = Path(__file__).resolve().parent / "results"


def metric_sum(admin: int, name: str, label: str) -> dict[str, float]:
    """Sum a counter's samples by one label value, from the proxy's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].split("} ")
            found = dict(part.split("=", 1) for part in labels.split(","))
            key = found[label].strip('"')
            out[key] = out.get(key, 0.0) + float(value)
    return out


def start_proxy(node: Any, tmp: Path, budget_ms: float) -> tuple[ProxyProcess, int, int]:
    port, admin = free_port(), free_port()
    config = tmp / f"proxy-{port}.yaml"
    config.write_text(json.dumps({
        "mode": "sidecar", "upstream": f"{node.host}:{node.port}", "listen": f"127.0.0.1:{port}",
        "admin": f"127.0.0.1:{admin}", "log_level": "warning",
        "health": {"concurrent_transactions_budget_ms": budget_ms}}))
    proxy = ProxyProcess(["--config", str(config)], tmp / f"proxy-{port}.log").start(wait_port=("127.0.0.1", port))
    return proxy, port, admin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--with-off", action="store_true", help="also a proxy with absorption off")
    args = ap.parse_args()
    families = args.families.split(",")
    modes = ["direct", "proxied", *(["proxied_off"] if args.with_off else [])]
    tmp = Path(tempfile.mkdtemp(prefix="short-txn-"))
    cluster = kafka.up("3.5.2", 1, tmp / "kafka", sidecars=True, die_with_parent=True)
    node = cluster.nodes[0]
    bootstrap = f"{node.host}:{node.sidecar_port}"
    proxies = {"proxied": start_proxy(node, tmp, 2000)}
    if args.with_off:
        proxies["proxied_off"] = start_proxy(node, tmp, 0)
    rows: list[dict[str, Any]] = []
    try:
        raw.create_topic(cluster.live_bootstrap(), "short", 1, -1, None)
        for family in families:
            for rnd in range(args.rounds):
                for mode in modes:
                    target = (node.host, node.port) if mode == "direct" else ("127.0.0.1", proxies[mode][1])
                    before = metric_sum(proxies[mode][2], "txnguard_concurrent_transactions_absorptions_total",
                                        "ending") if mode != "direct" else {}
                    with ConcurrentTap(target, node.sidecar_port) as tap:  # type: ignore[arg-type]
                        result = run_loop(family, bootstrap, "short", f"short-{family}-{mode}-{rnd}",
                                          args.transactions)
                        time.sleep(0.2)  # the last answers through the tap
                        seen = tap.count
                    after = metric_sum(proxies[mode][2], "txnguard_concurrent_transactions_absorptions_total",
                                       "ending") if mode != "direct" else {}
                    row = {"family": family, "round": rnd, "mode": mode, "transactions": result.transactions,
                           "seconds": round(result.seconds, 3), "per_second": round(result.per_second, 1),
                           "client_saw_concurrent": seen,
                           "absorbed": after.get("absorbed", 0) - before.get("absorbed", 0),
                           "budget_spent": after.get("budget_spent", 0) - before.get("budget_spent", 0)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for proxy, _, _ in proxies.values():
            proxy.terminate()
        cluster.down()
    print()
    print(f"| client | {' | '.join(f'{m} txn/s' for m in modes)} | proxied / direct | "
          f"{' | '.join(f'51 seen by client, {m}' for m in modes)} | absorbed by proxy |")
    print("|" + " --- |" * (2 * len(modes) + 3))
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        rate = {m: statistics.median(r["per_second"] for r in mine if r["mode"] == m) for m in modes}
        seen = {m: sum(r["client_saw_concurrent"] for r in mine if r["mode"] == m) for m in modes}
        absorbed = sum(r["absorbed"] for r in mine if r["mode"] == "proxied")
        print(f"| {family} | {' | '.join(f'{rate[m]:.1f}' for m in modes)} | "
              f"x{rate['proxied'] / rate['direct']:.2f} | {' | '.join(str(seen[m]) for m in modes)} | "
              f"{absorbed:.0f} |")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"short-transactions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"transactions": args.transactions, "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()

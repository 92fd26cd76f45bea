"""Short-transaction loops, direct vs through txnguard, side by side (issue 11: CONCURRENT_TRANSACTIONS absorbed).

One Kafka 3.5.2 node in the sidecar layout: the broker advertises a port where a tap
(a FaultRelay with no fault, counting AddPartitionsToTxn/AddOffsetsToTxn answers that
carry CONCURRENT_TRANSACTIONS) listens in front of the broker. Modes, alternating per
round, each with exactly one tap hop:

    direct    client -> tap -> broker            the tap counts what the client received
    gateway   client -> txnguard gateway -> tap -> broker
              (the deployment the proxy is built for: it sees every request, so local
              evidence decides; the client received a CONCURRENT_TRANSACTIONS only when the
              proxy's budget ran out: its budget_spent counter)
    sidecar   client -> tap -> txnguard sidecar -> broker   the tap counts what the client received
              (a sidecar reuses no evidence by default: every write is checked with the
              coordinator and the leader, so it costs more per transaction)
    kroxylicious  client -> Kroxylicious 0.12.0 (pass-through, no filters) -> tap -> broker
              (with --peer: the peer proxy proxy_overhead.py measures too; the tap counts what
              the client received, since Kroxylicious passes every answer on)

The loop writes one record to partition 0 per transaction, as fast as the client goes.
Printed per family: transactions/s per mode (median of rounds), ratios to direct, the
CONCURRENT_TRANSACTIONS answers the client received, the proxies' absorptions, and the
proxy CPU per transaction (from /proc).

    .venv/bin/python bench/short_transactions.py --transactions 300 --rounds 3 [--peer]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from txnguard.testing import kafka, raw
from txnguard.testing.bounce import free_port
from txnguard.testing.kroxylicious import KroxyliciousProcess
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.short_transactions import FAMILIES, ConcurrentTap, run_loop

RESULTS = Path(__file__).resolve().parent / "results"


def metric_sum(admin: int, name: str, label: str) -> dict[str, float]:
    """Sum a counter's samples by one label value, from the proxy's /metrics (prometheus_client's own parser)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels[label]
                out[key] = out.get(key, 0.0) + sample.value
    return out


def start_gateway(upstream: str, tmp: Path, budget_ms: float,
                  env: dict[str, str] | None = None) -> tuple[ProxyProcess, int, int]:
    port, admin, listener = free_port(), free_port(), free_port()
    config = tmp / f"gateway-{port}.yaml"
    config.write_text(json.dumps({
        "mode": "gateway", "upstream": upstream, "listen": f"127.0.0.1:{port}", "broker_ports": {0: listener},
        "admin": f"127.0.0.1:{admin}", "log_level": "warning",
        "health": {"concurrent_transactions_budget_ms": budget_ms}}))
    proxy = ProxyProcess(["--config", str(config)], tmp / f"gateway-{port}.log", env=env).start(
        wait_port=("127.0.0.1", port))
    return proxy, port, admin


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


ABSORPTIONS = "txnguard_concurrent_transactions_absorptions_total"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--with-off", action="store_true", help="also a gateway with absorption off")
    ap.add_argument("--compare-rev", default=None,
                    help="also a gateway running the proxy of this git revision (mode gateway_base), side by side")
    ap.add_argument("--peer", action="store_true", help="also Kroxylicious (make kroxylicious fetches it)")
    args = ap.parse_args()
    families = args.families.split(",")
    modes = ["direct", "gateway", *(["gateway_off"] if args.with_off else []),
             *(["gateway_base"] if args.compare_rev else []), *(["kroxylicious"] if args.peer else [])]
    tmp = Path(tempfile.mkdtemp(prefix="short-txn-"))
    cluster = kafka.up("3.5.2", 1, tmp / "kafka", sidecars=True, die_with_parent=True)
    node = cluster.nodes[0]
    tapped = f"{node.host}:{node.sidecar_port}"  # what the broker advertises: the tap
    rows: list[dict[str, Any]] = []
    with ConcurrentTap((node.host, node.port), node.sidecar_port) as tap:  # type: ignore[arg-type]
        proxies = {"gateway": start_gateway(tapped, tmp, 2000)}
        if args.with_off:
            proxies["gateway_off"] = start_gateway(tapped, tmp, 0)
        if args.compare_rev:
            from proxy_overhead import proxy_source  # the same git archive as proxy_overhead --proxy-rev

            env, source = proxy_source(args.compare_rev, tmp)
            print(f"gateway_base: {source}", flush=True)
            proxies["gateway_base"] = start_gateway(tapped, tmp, 2000, env)
        peer = KroxyliciousProcess(tapped, [node.id], tmp).start() if args.peer else None
        failed: dict[str, str] = {}  # family -> why it could not run through Kroxylicious
        try:
            raw.create_topic(cluster.live_bootstrap(), "short", 1, -1, None)
            for family in families:
                for rnd in range(args.rounds):
                    for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:  # rotated per round
                        if mode == "kroxylicious" and family in failed:
                            continue
                        proxy = proxies.get(mode)
                        bootstrap = (peer.bootstrap if mode == "kroxylicious" and peer else
                                     tapped if proxy is None else f"127.0.0.1:{proxy[1]}")
                        pid = peer.pid if mode == "kroxylicious" and peer else (
                            proxy[0].proc.pid if proxy and proxy[0].proc else None)
                        before = metric_sum(proxy[2], ABSORPTIONS, "ending") if proxy else {}
                        cpu_before = cpu_seconds(pid) if pid else 0.0
                        tap_before = tap.count
                        try:
                            result = run_loop(family, bootstrap, "short", f"short-{family}-{mode}-{rnd}",
                                              args.transactions)
                        except RuntimeError as e:
                            if mode != "kroxylicious":
                                raise
                            failed[family] = next(x for x in reversed(str(e).splitlines()) if x.strip())[:300]
                            print(f"{family} through Kroxylicious failed: {failed[family]}", flush=True)
                            continue
                        time.sleep(0.2)  # the last answers through the tap
                        broker_said = tap.count - tap_before
                        after = metric_sum(proxy[2], ABSORPTIONS, "ending") if proxy else {}
                        cpu = cpu_seconds(pid) - cpu_before if pid else 0.0
                        spent = sum(after.get(e, 0) - before.get(e, 0) for e in ("budget_spent", "behind_another"))
                        # What the client received: direct and with absorption off, every refusal the
                        # broker sent; through an absorbing gateway, those it gave up on and those it
                        # passed at once because another request of the connection was being asked again.
                        client_saw = spent if mode in ("gateway", "gateway_base") else broker_said
                        row = {"family": family, "round": rnd, "mode": mode, "transactions": result.transactions,
                               "seconds": round(result.seconds, 3), "per_second": round(result.per_second, 1),
                               "broker_said_concurrent": broker_said, "client_saw_concurrent": client_saw,
                               "absorbed": after.get("absorbed", 0) - before.get("absorbed", 0),
                               "proxy_cpu_ms_per_txn": round(cpu * 1000 / result.transactions, 3)}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            for proxy_process, _, _ in proxies.values():
                proxy_process.terminate()
            if peer is not None:
                peer.stop()
            cluster.down()
    print(f"\nload average at the end: {os.getloadavg()}")
    _print_table(rows, modes, families)
    for family, why in failed.items():
        print(f"{family} through Kroxylicious: {why}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"short-transactions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"transactions": args.transactions, "rounds": args.rounds, "rows": rows,
                               "kroxylicious_failed": failed}, indent=1))
    print(f"\nwritten {out}")


def _print_table(rows: list[dict[str, Any]], modes: list[str], families: list[str]) -> None:
    proxied = modes[1:]
    print(f"| client | {' | '.join(f'{m} txn/s' for m in modes)} | "
          f"{' | '.join(f'{m} / direct' for m in proxied)} | "
          f"{' | '.join(f'51 received by client, {m}' for m in modes)} | absorbed by gateway | "
          f"{' | '.join(f'{m} CPU ms/txn' for m in proxied)} |")
    print("|" + " --- |" * (1 + len(modes) + 2 * len(proxied) + len(modes) + 1))
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        ran = [m for m in modes if any(r["mode"] == m for r in mine)]
        rate = {m: statistics.median(r["per_second"] for r in mine if r["mode"] == m) for m in ran}
        seen = {m: str(int(sum(r["client_saw_concurrent"] for r in mine if r["mode"] == m))) for m in ran}
        cpu = {m: f"{statistics.median(r['proxy_cpu_ms_per_txn'] for r in mine if r['mode'] == m):.3f}"
               for m in ran}
        absorbed = sum(r["absorbed"] for r in mine if r["mode"] == "gateway")
        ratios = " | ".join(f"x{rate[m] / rate['direct']:.2f}" if m in rate else "fails" for m in proxied)
        print(f"| {family} | {' | '.join(f'{rate[m]:.1f}' if m in rate else 'fails' for m in modes)} | "
              f"{ratios} | "
              f"{' | '.join(seen.get(m, '-') for m in modes)} | {absorbed:.0f} | "
              f"{' | '.join(cpu.get(m, '-') for m in proxied)} |")


if __name__ == "__main__":
    main()

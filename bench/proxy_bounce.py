"""A txnguard process killed (SIGKILL) and restarted in the middle of exactly-once copies, several runs per cell.

Run: `.venv/bin/python bench/proxy_bounce.py [--copiers java-3.5.2,java-2.8.2,confluent-kafka]
      [--mode gateway,sidecar] [--runs 3] [--records 6000] [--kill-at 1500] [--rdkafka KEY=VALUE]`

Two 3-node Kafka 3.5.2 clusters: one plain (gateway mode), one in sidecar layout (sidecar mode, and the
relay control). Per run a fresh pair of topics, `--records` records, the proxy SIGKILLed once the output
holds `--kill-at` records and restarted 1 s later on the same ports (txnguard.testing.bounce):

* gateway: the gateway process;
* sidecar: of three sidecar processes, the one in front of the transaction coordinator of the copier's
  transactional id (chosen so that this broker does not lead the output partition);
* relay (`--mode relay`, the control, no txnguard at all): plain TCP relays on the sidecar ports, all
  stopped at once (every connection reset, as a gateway SIGKILL does) and started again.

Prints one Markdown row per run, then a summary per copier and mode: runs passed, records lost and
duplicated, find-hanging rows, refusals after the kill with their reasons. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

from txnguard.testing.bounce import COPIERS, HEADER, MODES, BounceResult, run_bounce
from txnguard.testing.fixtures import ClusterPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copiers", default=",".join(COPIERS))
    ap.add_argument("--mode", default="gateway,sidecar", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--records", type=int, default=6000)
    ap.add_argument("--kill-at", type=int, default=1500)
    ap.add_argument("--timeout", type=float, default=240.0, help="the copier's own timeout (s); a copier "
                    "still running 30 s after it is reported as hung")
    ap.add_argument("--rdkafka", action="append", default=[], metavar="KEY=VALUE",
                    help="a confluent-kafka producer setting, e.g. metadata.recovery.strategy=none")
    args = ap.parse_args()
    rdkafka = dict(kv.split("=", 1) for kv in args.rdkafka) or None
    results: list[BounceResult] = []
    with tempfile.TemporaryDirectory(prefix="txnguard-bounce-") as root:
        pool = ClusterPool(Path(root), max_alive=2)
        try:
            print(HEADER, flush=True)
            for mode in args.mode.split(","):
                cluster = pool.get("3.5.2", 3, sidecars=mode != "gateway")
                for copier in args.copiers.split(","):
                    for i in range(args.runs):
                        tmp = Path(root) / f"{mode}-{copier}-{i}"
                        tmp.mkdir()
                        r = run_bounce(cluster, copier, tmp, mode=mode, records=args.records, kill_at=args.kill_at,
                                       timeout_s=args.timeout, rdkafka_config=rdkafka)
                        results.append(r)
                        print(r.row(), flush=True)
        finally:
            pool.close()
    print("\n| copier | mode | runs passed | lost | duplicated | hanging | refused after (unjustified) | reasons |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    cells: dict[tuple[str, str], list[BounceResult]] = {}
    for r in results:
        cells.setdefault((r.copier, r.mode), []).append(r)
    for (copier, mode), rs in cells.items():
        reasons: Counter[str] = Counter()
        for r in rs:
            reasons.update(r.refusals)
        print(f"| {copier} | {mode} | {sum(r.passed for r in rs)}/{len(rs)} | {sum(r.lost for r in rs)} | "
              f"{sum(r.duplicated for r in rs)} | {sum(r.hanging for r in rs)} | "
              f"{sum(r.refused_after for r in rs)} ({sum(r.unjustified for r in rs)}) | "
              f"{'; '.join(f'{n} x {k}' for k, n in reasons.items()) or 'none'} |")


if __name__ == "__main__":
    main()

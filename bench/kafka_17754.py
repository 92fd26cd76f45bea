"""J3 (KAFKA-17754) with real clients: anomaly counts through the proxy with the defence on vs off.

Run: `.venv/bin/python bench/kafka_17754.py [--runs 20] [--clients java,confluent-kafka] [--modes bare,off,on]
     [--release-after 1.0] [--version 3.5.2]`

Each run is txnguard.testing.kafka_17754.run_once on one Kafka node: client -> gateway proxy -> FaultRelay
-> broker; the relay holds T1's EndTxn(COMMIT) past the client's request timeout (2 s), the client retries
it and commits T1, opens T2 on two partitions, the held EndTxn is released `--release-after` seconds
later, then T2 writes once more and commits. Modes: `bare` (the proxy only rewrites addresses:
verification and the defence off, the nearest a real client gets to direct through the relay), `off`
(KIP-890 part 1 verification on, the defence off) and `on` (the default configuration). A release
after more than the hold bound (0.8 x 2 s) exercises the bound: CONCURRENT_TRANSACTIONS, retried by
the client, held again. Prints one line per run and a table of anomaly counts; nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from txnguard.testing.fixtures import ClusterPool
from txnguard.testing.kafka_17754 import run_once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--clients", default="java,confluent-kafka")
    ap.add_argument("--modes", default="bare,off,on")
    ap.add_argument("--release-after", type=float, default=1.0)
    ap.add_argument("--version", default="3.5.2")
    args = ap.parse_args()
    table: dict[tuple[str, str], collections.Counter[str]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txnguard-j3-") as root:
        pool = ClusterPool(Path(root), max_alive=1)
        try:
            cluster = pool.get(args.version)
            for mode in args.modes.split(","):
                for client in args.clients.split(","):
                    counts = table.setdefault((client, mode), collections.Counter())
                    for i in range(args.runs):
                        try:
                            run = run_once(cluster, client, mode=mode, release_after_s=args.release_after)
                        except Exception as e:  # noqa: BLE001 - a run that broke is counted, not hidden
                            counts["runs"] += 1
                            counts["broken"] += 1
                            print(f"{client} {mode} #{i + 1}: BROKEN {e!r:.300}", flush=True)
                            continue
                        counts["runs"] += 1
                        counts["anomalous"] += bool(run.anomalies)
                        counts["holds"] += int(run.holds)
                        counts["hold_timeouts"] += int(run.hold_timeouts)
                        counts["t2_committed"] += run.steps.get("t2_end") == "committed"
                        counts["late_end_txn_landed"] += run.held_answered
                        for a in run.anomalies:
                            counts[a.split(":")[0]] += 1
                        print(f"{client} {mode} #{i + 1}: {run.seconds:.1f} s, T1 {run.steps.get('t1_end')}, "
                              f"T2 {run.steps.get('t2_end')}, state at release {run.state_at_release}, "
                              f"holds {run.holds:.0f} ({run.hold_timeouts:.0f} at the bound), "
                              f"anomalies {run.anomalies or 'none'}", flush=True)
        finally:
            pool.close()
    print(f"\nKafka {args.version}, release {args.release_after:g} s after T2 began, "
          f"{time.monotonic() - started:.0f} s in all\n")
    print("| client | mode | runs | runs with an anomaly | lost write | aborted read | torn | hanging | "
          "T2 committed | requests held (at the bound) | broken runs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (client, mode), c in table.items():
        print(f"| {client} | {mode} | {c['runs']} | {c['anomalous']} | {c['lost write']} | {c['aborted read']} | "
              f"{c['torn transaction']} | {c['hanging']} | {c['t2_committed']} | {c['holds']} ({c['hold_timeouts']})"
              f" | {c['broken']} |")


if __name__ == "__main__":
    main()

"""Upgrades without downtime under a live transactional copier: Kafka and txnguard rolled one process at a time.

Run: `.venv/bin/python bench/rolling_upgrade_zk.py [--variants roll-gateway,roll-sidecars,sidecars,gateways,roll-direct]
      [--per-step 1500] [--commit-every 50] [--pace 0.5]`

Each variant on a fresh 3-broker Kafka 3.4.1 cluster in ZooKeeper mode (txnguard.testing.rolling):

* roll-gateway: a gateway in front; each broker restarted on 3.9.2 (inter.broker.protocol.version=3.4 written
  before its restart), then each again with the protocol raised to 3.9 (Kafka's upgrade notes);
* roll-sidecars: the same roll, a txnguard sidecar in front of each broker (the cluster in sidecar layout);
* roll-direct: the same roll with no txnguard (the control: what the copier sees from Kafka alone);
* sidecars: the three sidecars restarted one at a time (SIGTERM, drain, start on the same port);
* gateways: two gateway replicas (the client bootstraps from both), restarted one at a time.

Each step writes its own `--per-step` input records and ends once the copier has committed them (the roll
drives the copier, txnguard.testing.rolling.run_roll); the copier stops when the roll ends. Per variant, a
table with a row per step (how long it took, the client's errors by kind, the proxies' warning log lines and
refusals), then records lost, duplicated, find-hanging rows and a verdict. Nothing is asserted (`make test`
runs the gateway roll: tests/integration/test_rolling_upgrade_zk.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from txnguard.testing import kafka
from txnguard.testing.rolling import FROM, Direct, Gateways, RollResult, Sidecars, broker_roll, proxy_roll, run_roll

VARIANTS = {
    # name: (sidecar layout, front, steps)
    "roll-gateway": (False, lambda c, t: Gateways(c, t), broker_roll),
    "roll-direct": (False, Direct, broker_roll),
    "roll-sidecars": (True, Sidecars, broker_roll),
    "sidecars": (True, Sidecars, proxy_roll),
    "gateways": (False, lambda c, t: Gateways(c, t, replicas=2), proxy_roll),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="roll-gateway,roll-sidecars,sidecars,gateways,roll-direct")
    ap.add_argument("--per-step", type=int, default=1500, help="input records each step writes and has copied")
    ap.add_argument("--commit-every", type=int, default=50)
    ap.add_argument("--pace", type=float, default=0.5, help="the copier's pause after each commit")
    args = ap.parse_args()
    results: list[RollResult] = []
    with tempfile.TemporaryDirectory(prefix="txnguard-rolling-") as root:
        for name in args.variants.split(","):
            sidecars, make_front, make_steps = VARIANTS[name]
            tmp = Path(root) / name
            tmp.mkdir()
            cluster = kafka.up(FROM, 3, tmp / "kafka", zookeeper=True, sidecars=sidecars, die_with_parent=True)
            try:
                result = run_roll(cluster, make_front(cluster, tmp), make_steps, tmp, variant=name,
                                  per_step=args.per_step, commit_every=args.commit_every, pace_s=args.pace)
            finally:
                cluster.down()
            results.append(result)
            print(result.report(), flush=True)
    print("| variant | records | lost | duplicated | hanging | fatal client errors | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r.variant} | {r.copied}/{r.records} | {r.lost} | {r.duplicated} | {r.hanging} | {r.fatal} | "
              f"{'PASS' if r.passed else 'FAIL'} |")


if __name__ == "__main__":
    main()

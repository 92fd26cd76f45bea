"""The gateway killed (SIGKILL) and restarted in the middle of exactly-once copies, several runs per copier.

Run: `.venv/bin/python bench/proxy_bounce.py [--copiers java-3.5.2,java-2.8.2,confluent-kafka] [--runs 3]`

One 3-node Kafka 3.5.2 cluster; per run a fresh pair of topics, 6,000 records, a gateway process in front,
SIGKILLed once the output holds 1,500 records and restarted 1 s later on the same ports
(txnguard.testing.bounce). Prints one Markdown row per run: pass, where it was killed, exactly once at
read_committed, find-hanging rows, the restarted proxy's decisions and refusals and their evidence.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from txnguard.testing.bounce import COPIERS, run_bounce
from txnguard.testing.fixtures import ClusterPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copiers", default=",".join(COPIERS))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="txnguard-bounce-") as root:
        pool = ClusterPool(Path(root), max_alive=1)
        try:
            cluster = pool.get("3.5.2", 3)
            print("| copier | result | output at the kill | exactly once | hanging | decisions after | refused "
                  "after | evidence after | run | detail |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for copier in args.copiers.split(","):
                for i in range(args.runs):
                    tmp = Path(root) / f"{copier}-{i}"
                    tmp.mkdir()
                    print(run_bounce(cluster, copier, tmp).row(), flush=True)
        finally:
            pool.close()


if __name__ == "__main__":
    main()

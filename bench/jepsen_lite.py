"""J1-lite long runs: the queue workload direct and through the gateway at once, faults rotating, then the check.

Run: `.venv/bin/python bench/jepsen_lite.py [--duration 300] [--period 15] [--seed 1] [--kinds delay,...]`

A fresh 3-node Kafka (3.5.2 unless --version) in the sidecar layout, a FaultRelay on every broker's
advertised port, a gateway process whose upstream is the relays; 3 transactional writers and 2
read_committed readers per mode (txnguard.testing.jepsen). The nemesis rotates through the fault kinds,
one per --period seconds, for --duration seconds; then everything heals, a final read takes every
partition to its last stable offset, and the checker counts anomalies per mode and per fault kind.
Prints the table and the stats, saves the result (and the history's path) as JSON under bench/results/.
Nothing is asserted: tests/integration/test_jepsen_lite.py is the asserting short form.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from txnguard.testing.jepsen.nemesis import KINDS, NemesisConfig
from txnguard.testing.jepsen.run import RunConfig, run
from txnguard.testing.jepsen.workload import WorkloadConfig

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of faults (default 300)")
    ap.add_argument("--period", type=float, default=15.0, help="seconds per fault window (default 15)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--version", default="3.5.2")
    ap.add_argument("--abort-p", type=float, default=1 / 32, help="intentional aborts per transaction (1/32)")
    ap.add_argument("--keep", type=Path, default=None, help="a directory for the history and logs (default: a new "
                    "one under /tmp, printed)")
    args = ap.parse_args()
    cfg = RunConfig(nemesis=NemesisConfig(kinds=args.kinds.split(","), period_s=args.period,
                                          duration_s=args.duration, seed=args.seed),
                    workload=WorkloadConfig(abort_p=args.abort_p), version=args.version)
    # Kept after the run (the history is the evidence behind the counts; too big to commit).
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="txnguard-jepsen-"))
    result = run(cfg, workdir)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"jepsen_lite-{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}.json"
    out.write_text(json.dumps(asdict(result), indent=1))
    print(f"J1-lite, Kafka {args.version}, {args.duration:.0f} s of faults, {args.period:.0f} s per window, "
          f"seed {args.seed}, abort-p {args.abort_p:.4f}, {result.seconds:.0f} s in all; "
          f"windows: {', '.join(result.windows)}")
    print(result.table())
    print()
    print(result.activity())
    for mode, m in result.modes.items():
        print(f"{mode}: {m.check['counts']} stats {m.check['stats']} crashed {m.crashed}")
        for e in m.check["examples"][:5]:
            print(f"    {e}")
    if result.out_of_sync:
        print(f"replicas out of sync after a heal: {result.out_of_sync}")
    if result.nemesis_errors:
        print(f"nemesis errors: {result.nemesis_errors}")
    print(f"saved {out}; history {result.history}")


if __name__ == "__main__":
    main()

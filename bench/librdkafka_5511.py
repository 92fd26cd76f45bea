"""librdkafka #5511/#5456, direct to the brokers (no proxy): does send_offsets_to_transaction still hang?

Run: `.venv/bin/python bench/librdkafka_5511.py [--runs 5] [--version 3.5.2]`

Why the confluent-kafka S6 loop (tests/integration/test_exactly_once.py) picks a group whose coordinator is not
the broker it kills. On three Kafka nodes, per run:

    client ─txn 1: send_offsets_to_transaction─▶ group coordinator X          (cached by librdkafka)
                         ══ SIGKILL X; wait until X is out of the Metadata ══
    client ─Metadata─▶ (without X: librdkafka decommissions X's broker thread)
    client ─txn 2: send_offsets_to_transaction(timeout 10 s)─▶ returns, or is still blocked at 30 s

The outcome is a client race (it depends on when librdkafka refreshes its Metadata and its coordinator), so it
is a report, not a test: it once reproduced in the gate every run and then, on a fresh clone, returned after
0.67 s. This script prints each run's outcome and a tally; it asserts nothing. When no run hangs over many
runs, the S6 loop's choice of group can go.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster

METADATA_WAIT_S = 60.0


def run_once(cluster: Cluster) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    source = fresh_topic(cluster, f"in-5511-{tag}", partitions=3, replication_factor=3)
    sink = fresh_topic(cluster, f"out-5511-{tag}", partitions=3, replication_factor=3)
    for p in range(3):
        clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, [b"v"] * 10, partition=p)
    group = f"group-5511-{tag}"
    victim = cluster.group_coordinator(group)
    txn_id = next(t for t in (f"txn-5511-{tag}-{i}" for i in range(50)) if cluster.transaction_coordinator(t) != victim)
    coordinator = cluster.node(cluster.transaction_coordinator(txn_id))
    child = subprocess.Popen(
        [sys.executable, "-m", "txnguard.testing.client_bugs", "--bootstrap", cluster.bootstrap_servers,
         "--group", group, "--transactional-id", txn_id, "--source", source, "--sink", sink,
         "--coordinator", f"{coordinator.host}:{coordinator.port}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "READY":
            return {"broken": "the first transaction did not complete"}
        cluster.kill_node(victim)
        deadline = time.monotonic() + METADATA_WAIT_S
        while victim in _brokers_in_metadata(cluster, victim):
            if time.monotonic() > deadline:
                return {"broken": f"node {victim} never left the Metadata"}
            time.sleep(0.2)
        child.stdin.write("GO\n")
        child.stdin.flush()
        result: dict[str, Any] = json.loads(child.stdout.readline())
        return result
    finally:
        child.kill()
        child.wait(10)
        cluster.start_node(victim)
        cluster.wait_ready()


def _brokers_in_metadata(cluster: Cluster, dead: int) -> set[int]:
    for n in cluster.nodes:
        if n.id == dead:
            continue
        try:
            with raw.RawClient(n.host, n.port, timeout=5) as c:
                return {int(b.node_id) for b in c.metadata([]).brokers}
        except OSError:
            continue
    return set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--version", default="3.5.2")
    args = ap.parse_args()
    import confluent_kafka

    tally: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="txnguard-5511-") as root:
        pool = ClusterPool(Path(root), max_alive=1)
        try:
            cluster = pool.get(args.version, 3)
            for i in range(args.runs):
                result = run_once(cluster)
                outcome = "broken" if "broken" in result else ("returned" if result["returned"] else "hung")
                tally[outcome] += 1
                print(f"run {i + 1}: {outcome} {result}", flush=True)
        finally:
            pool.close()
    print(f"\nlibrdkafka {confluent_kafka.libversion()[0]}, Kafka {args.version}: "
          f"{tally['hung']} hung, {tally['returned']} returned, {tally['broken']} broken of {args.runs} runs")


if __name__ == "__main__":
    main()

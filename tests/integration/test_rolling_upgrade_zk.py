"""A rolling broker upgrade behind a gateway, under a live transactional copier (issue 21, item 4).

    confluent-kafka copier (paced) ──▶ gateway ──▶ Kafka 3.4.1, ZooKeeper mode, 3 brokers
    broker 1, 2, 3 in turn: SIGTERM ─▶ started on 3.9.2, inter.broker.protocol.version=3.4 ─▶ all in sync
    broker 1, 2, 3 in turn: SIGTERM ─▶ inter.broker.protocol.version=3.9 ─▶ all in sync
    the gateway meets brokers answering ApiVersions as 3.4.1 and as 3.9.2 in the same cluster

    afterwards: every input record once in the output at read_committed; find-hanging (0-minute bound)
                empty; the copier committed during the roll and saw no fatal error (any error it saw
                was retriable or abortable, and it carried on)

The cluster is this test's own: the upgrade changes it (a pooled cluster would be a 3.9.2 one under a 3.4.1
key). bench/rolling_upgrade_zk.py runs the same roll with 12,000 records, with sidecars, without txnguard (the
control), and the proxies' own rolling restarts. Here 9,000 records: the copier is paced (0.5 s after
each commit of 50), so it copies 400-550 records during each of the roll's seven steps on a quiet machine and must
not run dry before the last step when the gate's load makes the steps slower; 12,000 once missed the 240 s bound
under that load (with brokers on the full JIT).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txnguard.testing import kafka
from txnguard.testing.rolling import FROM, TO, Gateways, broker_roll, run_roll

pytestmark = [pytest.mark.integration]


def test_a_rolling_upgrade_3_4_to_3_9_behind_a_gateway_copies_exactly_once_no_error_fatal(tmp_path: Path) -> None:
    cluster = kafka.up(FROM, 3, tmp_path / "kafka", zookeeper=True, die_with_parent=True, quick_jit=True)
    try:
        result = run_roll(cluster, Gateways(cluster, tmp_path), broker_roll, tmp_path, variant="roll-gateway",
                          records=9000, commit_every=50, pace_s=0.5, baseline_s=2,
                          timeout_s=300)
        assert cluster.versions() == {1: TO, 2: TO, 3: TO}
    finally:
        cluster.down()
    print(f"\n{result.report()}")
    assert result.finished and not result.copier_done_early, result.report()
    assert (result.lost, result.duplicated, result.hanging) == (0, 0, 0), result.report()
    assert result.fatal == 0, result.report()
    # The copy went on across the roll (the table says how much during each step: bench/rolling_upgrade_zk.py's
    # roll-direct variant is the same roll without txnguard, for comparison).
    assert sum(row.copied for row in result.steps[1:-1]) > 0, result.report()
    assert result.passed

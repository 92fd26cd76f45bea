"""Coordinator freezes for clients with a small retry budget (issue 13): one cell of the matrix.

A cell is (client, freeze length, target). The client runs paced transactions (one Produce per
record, each acknowledged before the next) with a small retry budget: 3 retries 100 ms apart,
Sarama's default and the setting kafka-python and confluent-kafka are given here. After the 5th
acknowledgement of its 2nd transaction the node that coordinates its transactional id is stopped
(SIGSTOP) for `freeze_s`, so its very next request is a Produce whose check (the proxy's, or the
broker's own KIP-890 one on 3.9.2) needs the frozen coordinator. Kafka fences a frozen node after its
9 s broker session timeout: a 12 s freeze is a failover, 2 and 6 s are pauses.

A cell passes when no transaction had to be aborted and the topic holds every committed record
exactly once at read_committed; it fails on any abort, fatal error or timeout.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txnguard.testing import clients
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kafka import Cluster

# The client library's own names for "3 retries, 100 ms apart" (Sarama's defaults: Producer.Retry.Max 3,
# Producer.Retry.Backoff 100 ms; librdkafka's `retries` bounds an idempotent producer's retries too).
SMALL_RETRY_BUDGET: dict[str, dict[str, Any]] = {
    "kafka-python": {"retries": 3, "retry_backoff_ms": 100},
    "confluent-kafka": {"retries": 3, "retry.backoff.ms": 100},
    "sarama": {},
}
TRANSACTIONS, PER_TRANSACTION, FREEZE_AT = 3, 10, (1, 4)


class Freeze:
    """Freeze a node from inside the client's thread at a chosen acknowledgement, resume it `hold_s` later.

    `hook(transaction, record)` is the paced client's on_ack: it runs after that record's ack and
    before the next send, so when it returns the node is stopped and the client's very next request
    is a Produce of an open transaction whose partition is already added.
    """

    def __init__(self, cluster: Cluster, node_id: int, hold_s: float, at: tuple[int, int] | None = None) -> None:
        self.cluster, self.node_id, self.at, self.hold_s = cluster, node_id, at, hold_s
        self.frozen_at: float | None = None
        self.resumed_at: float | None = None
        self._timer: threading.Timer | None = None

    def hook(self, transaction: int, record: int) -> None:
        if (transaction, record) == self.at and self.frozen_at is None:
            self.freeze()

    def freeze(self) -> None:
        self.cluster.pause_node(self.node_id)
        self.frozen_at = time.monotonic()
        self._timer = threading.Timer(self.hold_s, self._resume)
        self._timer.start()

    def _resume(self) -> None:
        self.cluster.resume_node(self.node_id)  # SIGCONT only: safe from the timer's thread
        self.resumed_at = time.monotonic()

    def release(self) -> None:
        """Teardown: the node resumed whatever happened, and the shared cluster ready again."""
        if self._timer is not None:
            self._timer.cancel()
        self.cluster.resume_node(self.node_id)
        if self.resumed_at is None:
            self.resumed_at = time.monotonic()
        self.cluster.wait_ready()


def txn_id_coordinated_by(cluster: Cluster, prefix: str, accept: Callable[[int], bool]) -> tuple[str, int]:
    for i in range(100):
        txn_id = f"{prefix}-{i}"
        coordinator = cluster.transaction_coordinator(txn_id)
        if accept(coordinator):
            return txn_id, coordinator
    raise AssertionError("no transactional id with a suitable coordinator")


@dataclass
class CellResult:
    client: str
    freeze_s: float
    target: str
    passed: bool
    aborted: int
    seconds: float
    errors: list[str] = field(default_factory=list)
    exactly_once: bool = False   # read_committed holds every committed record once, in order

    def row(self) -> str:
        verdict = "pass" if self.passed else f"FAIL ({self.aborted} aborted)"
        first = f": {self.errors[0][:90]}" if self.errors else ""
        return f"| {self.client} | {self.freeze_s:g} s | {self.target} | {verdict} | {self.seconds:.1f} s |{first}"


def run_cell(cluster: Cluster, bootstrap_of: Callable[[Cluster], str], client: str, freeze_s: float,
             target: str, *, timeout_s: float = 150.0, settings: dict[str, Any] | None = None) -> CellResult:
    """One cell on `cluster` (3 nodes); `bootstrap_of(cluster)` is where the client connects (brokers or proxy).
    `settings` replace the client's small retry budget (SMALL_RETRY_BUDGET)."""
    u = uuid.uuid4().hex[:8]
    topic = fresh_topic(cluster, f"freeze-{u}", replication_factor=3)
    leader = cluster.leader(topic, 0)
    txn_id, coordinator = txn_id_coordinated_by(cluster, f"freeze-tid-{u}", lambda c: c != leader)
    freeze = Freeze(cluster, coordinator, hold_s=freeze_s, at=FREEZE_AT)
    started = time.monotonic()
    try:
        result = clients.paced_transactions(client, bootstrap_of(cluster), topic, txn_id,
                                            transactions=TRANSACTIONS, per_transaction=PER_TRANSACTION,
                                            on_ack=freeze.hook, timeout_s=timeout_s,
                                            settings=(SMALL_RETRY_BUDGET[client] if settings is None
                                                      else settings) or None)
    except Exception as e:  # noqa: BLE001 - a fatal error, or the client library's own (kafka-python's abort can raise)
        return CellResult(client, freeze_s, target, False, -1, time.monotonic() - started, [f"{type(e).__name__}: {e}"])
    finally:
        freeze.release()
    seconds = time.monotonic() - started
    expected = [v for t in range(TRANSACTIONS) for v in clients.paced_values(txn_id, t, PER_TRANSACTION)]
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    read = clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic)
    exactly_once = read == expected == result.committed
    assert freeze.frozen_at is not None, "the client never reached the freeze point"
    return CellResult(client, freeze_s, target, result.aborted == 0 and exactly_once, result.aborted, seconds,
                      result.errors, exactly_once)

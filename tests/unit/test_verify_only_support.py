"""VerifyOnly support is read from the ApiVersions of the connection a question goes on: a coordinator
restarted on another Kafka version (a rolling upgrade, or a downgrade before the protocol is raised) is judged
by what its new connection lists, not by what the address listed first.

    verifier ──connection 1──▶ coordinator on 3.4.1: AddPartitionsToTxn up to v3 ─▶ DescribeTransactions
    (the broker restarts on 3.9.2; the old connection closed, a new one reads ApiVersions again)
    verifier ──connection 2──▶ coordinator on 3.9.2: AddPartitionsToTxn up to v5 ─▶ VerifyOnly (v4)
    (rolled back to 3.4.1)
    verifier ──connection 3──▶ AddPartitionsToTxn up to v3 again ─▶ DescribeTransactions, never v4
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from txnguard.codecs.api_keys import ApiKey
from txnguard.proxy.config import CoordinatorEvidence, HostPort
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.proxy.verifier import Verifier

COORDINATOR = HostPort("127.0.0.1", 9092)
ON_341 = {ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3), ApiKey.DESCRIBE_TRANSACTIONS: (0, 0)}  # what Kafka 3.4.1 lists
ON_392 = {ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5), ApiKey.DESCRIBE_TRANSACTIONS: (0, 0)}  # Kafka 3.9.2


class Connections:
    """The verifier's pool of broker connections, as it sees them: each connection carries the ApiVersions it
    read when it opened; `reconnect` is the broker restarted (a new connection, a new answer)."""

    def __init__(self, ranges: dict[int, tuple[int, int]]) -> None:
        self.conn = SimpleNamespace(api_versions=ranges)
        self.opened = 1

    def reconnect(self, ranges: dict[int, tuple[int, int]]) -> None:
        self.conn = SimpleNamespace(api_versions=ranges)
        self.opened += 1

    async def get(self, _address: HostPort) -> SimpleNamespace:
        return self.conn


def test_verify_only_follows_the_coordinators_version_across_a_roll_and_a_rollback():
    verifier = Verifier((COORDINATOR,), ProxyMetrics(), coordinator_evidence=CoordinatorEvidence.VERIFY_ONLY)
    pool = Connections(ON_341)
    verifier._connections = pool  # type: ignore[assignment]

    def supported() -> bool:
        return asyncio.run(verifier._verify_only_supported(COORDINATOR))

    assert supported() is False
    pool.reconnect(ON_392)
    assert supported() is True
    pool.reconnect(ON_341)
    assert supported() is False


def test_an_unreadable_apiversions_answer_means_describe_transactions():
    verifier = Verifier((COORDINATOR,), ProxyMetrics(), coordinator_evidence=CoordinatorEvidence.VERIFY_ONLY)
    verifier._connections = Connections(None)  # type: ignore[assignment,arg-type]
    assert asyncio.run(verifier._verify_only_supported(COORDINATOR)) is False

"""A broker's ApiVersions decides what the proxy may send it (Kafka 2.8: no DescribeTransactions, no
ListTransactions), and the hanging scan without ListTransactions reports its candidates unconfirmed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.describe_producers.v0.request import DescribeProducersRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.types import TransactionalId

from txnguard.codecs.api_keys import ApiKey
from txnguard.proxy.capability_report import BrokerCapabilities
from txnguard.proxy.kafka_client import BrokerConnection, UnsupportedApi
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.capabilities import lacking
from txnguard.verification.hanging import UNCONFIRMED, HangingScan, MaxTimeout, ProducerState

# ApiVersions of Kafka 2.8.2 (ZooKeeper mode) for the keys that matter here: DescribeProducers 0, no 65/66.
KAFKA_2_8 = {ApiKey.PRODUCE: (0, 9), ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3), ApiKey.END_TXN: (0, 3),
             ApiKey.TXN_OFFSET_COMMIT: (0, 3), ApiKey.DESCRIBE_PRODUCERS: (0, 0)}
KAFKA_3_0 = {**KAFKA_2_8, ApiKey.DESCRIBE_TRANSACTIONS: (0, 0), ApiKey.LIST_TRANSACTIONS: (0, 0)}


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        pass


def test_kafka_2_8_lacks_describe_and_list_transactions_and_3_0_lacks_nothing() -> None:
    assert [lack.api for lack in lacking(KAFKA_2_8)] == ["DescribeTransactions", "ListTransactions"]
    assert lacking(KAFKA_3_0) == ()


def test_an_api_the_broker_does_not_list_is_never_written() -> None:
    async def run() -> tuple[list[bytes], Any]:
        conn = BrokerConnection()
        transport = Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.api_versions = dict(KAFKA_2_8)
        with pytest.raises(UnsupportedApi) as refused:
            await conn.request_raw(DescribeTransactionsRequest(transactional_ids=(TransactionalId("t"),)))
        before = list(transport.written)
        # A listed one goes out (its answer never comes here: the wait is cut short).
        with pytest.raises(Exception):  # noqa: B017 - the no-answer timeout, whatever its type
            await conn.request_raw(DescribeProducersRequest(topics=()), timeout=0.01)
        return before, (refused.value, transport.written)

    before, (refused, after) = asyncio.run(run())
    assert before == []
    assert str(refused) == "the broker's ApiVersions does not list API 65"
    assert len(after) == 1


def test_capabilities_say_it_once_per_broker_answer_and_again_when_the_answer_changes(
        log_lines: Callable[[], list[dict[str, Any]]]) -> None:
    metrics = ProxyMetrics()
    caps = BrokerCapabilities(metrics)
    caps.learned("b:1", KAFKA_2_8)
    caps.learned("b:1", KAFKA_2_8)
    said = [line for line in log_lines() if line["event"] == "broker_lacks_apis"]
    assert [line["lacks"] for line in said] == [["DescribeTransactions", "ListTransactions"]]
    assert caps.lacks("b:1", ApiKey.DESCRIBE_TRANSACTIONS) and not caps.lacks("b:1", ApiKey.DESCRIBE_PRODUCERS)
    gauge = metrics.registry.get_sample_value
    assert gauge("txnguard_broker_api_missing", {"broker": "b:1", "api": "DescribeTransactions"}) == 1
    (detail,) = caps.readiness().notes
    assert detail.startswith("broker b:1 lacks DescribeTransactions (falls back to local")
    caps.learned("b:1", KAFKA_3_0)  # rolled to 3.0
    assert not caps.lacks("b:1", ApiKey.DESCRIBE_TRANSACTIONS) and caps.readiness().notes == ()
    assert gauge("txnguard_broker_api_missing", {"broker": "b:1", "api": "DescribeTransactions"}) == 0


def test_without_list_transactions_the_candidates_are_reported_unconfirmed_and_the_young_are_not() -> None:
    now, max_timeout = 1_000_000, 60_000
    old = ProducerState(7, 0, now - 61_000, current_txn_start_offset=3)
    young = ProducerState(8, 0, now - 30_000, current_txn_start_offset=5)
    closed = ProducerState(9, 0, now - 600_000, current_txn_start_offset=-1)
    scan = HangingScan([("t", 0), ("t", 1), ("t", 2)], MaxTimeout(max_timeout))
    scan.start()
    scan.producers_answered({("t", 0): [old], ("t", 1): [young], ("t", 2): [closed]}, now)
    (finding,) = scan.transactional_ids_unavailable().findings
    assert (finding.topic, finding.partition, finding.producer_id, finding.start_offset, finding.reason) == \
        ("t", 0, 7, 3, UNCONFIRMED)
    assert finding.transactional_id is None and finding.coordinator_state is None

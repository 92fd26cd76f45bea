"""What the guard records of a decision, for each kind of check: the log lines (event and `api`), the
metric samples that moved (name and labels), the audit records (`api`, `decision`, ...).

Dashboards, alerts and the pipeline's incident rules read these names, so they are pinned here, kind by
kind. Each decision is taken by the pure rules from real request frames, then recorded by the guard.

    client ─Produce[orders-0, orders-1]─▶ rules ─ask coordinator (orders-1)─▶ "not in the transaction"
    client ─TxnOffsetCommit(g)─▶ rules (the transaction ended: a late write, local evidence)
    client ─AddPartitionsToTxn / AddOffsetsToTxn─▶ rules ─held behind an EndTxn in doubt─▶ its bound / settled
    client ─EndTxn / InitProducerId─▶ rules ─DescribeTransactions─▶ "aborted at the next epoch": a timeout
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from connection_playbook import (
    EPOCH,
    PID,
    T0,
    T1,
    TXN,
    FakeClock,
    add_offsets,
    add_partitions,
    produce,
    request,
)
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.txn_offset_commit.v3 import request as txn_offset_commit_v3
from kio.schema.types import ProducerId, TransactionalId
from kio.static.primitive import i16, i32, i64

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.policies.families import JAVA
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import (
    Answer,
    EndTxnSettled,
    EndTxnStillInDoubt,
    PartitionVerdicts,
    TransactionDescription,
)
from txnguard.verification.decisions import Decision, PendingCheck
from txnguard.verification.verdicts import Evidence, Outcome, Verdict

CLIENT = ClientInfo("c", None, None, JAVA, "bootstrap", 2)
TIMEOUT_MS = 60_000


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str | None]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw.get("api")))

    warning = info


class _Proxy:
    def __init__(self, tmp: Path) -> None:
        self.clock = FakeClock()
        self.metrics = ProxyMetrics()
        self.audit_path = tmp / "audit.jsonl"
        config = ProxyConfig(upstream=(HostPort("127.0.0.1", 9),), audit_path=str(self.audit_path))
        self.guard = TransactionGuard(config, self.metrics, policy_from_config({"timeout_recovery": True}), None,
                                      clock=self.clock)
        self.rules = self.guard.rules
        self.rules.registry.init_producer_id(TXN, PID, EPOCH, TIMEOUT_MS, self.clock.wall_ms())

    def _samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for m in self.metrics.registry.collect() for s in m.samples
                if not s.name.endswith(("_created", "_bucket", "_sum")) and not s.name.startswith("process_")}

    def record(self, decision: Decision) -> tuple[list[tuple[str, str | None]], list[Any], list[dict[str, Any]]]:
        """(log lines, metric samples that moved, audit records) of recording one decision."""
        log, before = _Log(), self._samples()
        self.guard.record(decision, log)
        self.guard.audit.close()
        after = self._samples()
        moved = [(name, dict(labels)) for (name, labels), v in sorted(after.items()) if before.get((name, labels)) != v]
        keys = ("kind", "api", "api_version", "target", "decision", "outcome", "error_name")
        records = [json.loads(line) for line in self.audit_path.read_text().splitlines()]
        audit = [{k: r[k] for k in keys if k in r} for r in records]
        return log.lines, moved, audit


def _decided(result: Decision | PendingCheck, proxy: _Proxy, answer: Answer | None = None) -> Decision:
    if isinstance(result, PendingCheck):
        assert answer is not None
        result = proxy.rules.resume(result, answer, proxy.clock)
    assert isinstance(result, Decision) and result.context is not None
    return result


def produce_check(proxy: _Proxy) -> Decision:
    proxy.rules.registry.added(TXN, PID, EPOCH, proxy.clock.wall_ms(), partitions={T0})
    pending = proxy.rules.check_produce(memoryview(produce(1, [T0, T1])), 9, CLIENT, proxy.clock)
    not_added = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not in the transaction",
                        "INVALID_TXN_STATE")
    return _decided(pending, proxy, PartitionVerdicts({T1: not_added}))


def txn_offset_commit_check(proxy: _Proxy) -> Decision:
    m = txn_offset_commit_v3
    frame = request(m.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id="g", producer_id=i64(PID), producer_epoch=i16(EPOCH), generation_id=i32(-1),
        member_id="", group_instance_id=None,
        topics=(m.TxnOffsetCommitRequestTopic(name="orders", partitions=(m.TxnOffsetCommitRequestPartition(
            partition_index=i32(0), committed_offset=i64(5), committed_leader_epoch=i32(-1),
            committed_metadata=""),)),)), 1)
    proxy.rules.registry.end_txn(TXN, PID, EPOCH, proxy.clock.wall_ms())   # a late write: local evidence
    proxy.rules.offsets_partitions = 50
    return _decided(proxy.rules.check_txn_offset_commit(memoryview(frame), 3, CLIENT, proxy.clock), proxy)


def _held(proxy: _Proxy, key: int, frame: bytes, settled: bool) -> Decision:
    proxy.guard.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=proxy.clock.wall_ms())
    body = memoryview(frame)[4:]
    observed = proxy.rules.observe_request(key, 3, body, proxy.clock.wall_ms(), connection_id=2)
    pending = proxy.rules.end_txn_hold(key, 3, memoryview(frame), observed, CLIENT, 2, proxy.clock)
    assert pending is not None
    return _decided(pending, proxy, EndTxnSettled() if settled else EndTxnStillInDoubt())


def add_partitions_held(proxy: _Proxy) -> Decision:
    return _held(proxy, ApiKey.ADD_PARTITIONS_TO_TXN, add_partitions(1, [T0]), settled=False)


def add_offsets_held(proxy: _Proxy) -> Decision:
    return _held(proxy, ApiKey.ADD_OFFSETS_TO_TXN, add_offsets(1), settled=True)


def _timed_out(proxy: _Proxy, frame: bytes, version: int) -> Decision:
    started = proxy.clock.wall_ms()
    proxy.rules.registry.added(TXN, PID, EPOCH, started, partitions={T0})
    proxy.clock.seconds += TIMEOUT_MS / 1000 + 1
    aborted = DescribedTransaction(0, TXN, "CompleteAbort", TIMEOUT_MS, started - 3, PID, EPOCH + 1, frozenset())
    return _decided(proxy.rules.check_lifecycle(memoryview(frame), version, CLIENT, proxy.clock), proxy,
                    TransactionDescription(aborted))


def end_txn_timed_out(proxy: _Proxy) -> Decision:
    return _timed_out(proxy, request(EndTxnRequest(transactional_id=TransactionalId(TXN), producer_id=ProducerId(PID),
                                                   producer_epoch=i16(EPOCH), committed=True), 1), 3)


def init_producer_id_timed_out(proxy: _Proxy) -> Decision:
    return _timed_out(proxy, request(InitProducerIdRequest(
        transactional_id=TransactionalId(TXN), transaction_timeout=datetime.timedelta(milliseconds=TIMEOUT_MS),
        producer_id=ProducerId(PID), producer_epoch=i16(EPOCH)), 1), 4)


PRODUCE_FAILURE = {"client_family": JAVA, "from_error": "INVALID_TXN_STATE", "to_error": "INVALID_TXN_STATE"}

RECORDED = {
    produce_check: (
        [("verification_failed", "produce")],
        [("txnguard_error_rewrites_total", {"api": "produce", **PRODUCE_FAILURE}),
         ("txnguard_inspection_time_ms_count", {"api": "produce"}),
         ("txnguard_verification_failures_total", {"reason": "not_in_transaction"}),
         ("txnguard_verification_time_ms_count", {"evidence": "coordinator"}),
         ("txnguard_verification_time_ms_count", {"evidence": "local"}),
         ("txnguard_verifications_total", {"decision": "forwarded", "evidence": "local", "outcome": "pass"}),
         ("txnguard_verifications_total", {"decision": "rejected", "evidence": "coordinator",
                                           "outcome": "not_in_transaction"})],
        [{"kind": "decision", "api": "produce", "api_version": 9, "target": "orders-0", "decision": "forwarded",
          "outcome": "pass", "error_name": None},
         {"kind": "decision", "api": "produce", "api_version": 9, "target": "orders-1", "decision": "rejected",
          "outcome": "not_in_transaction", "error_name": "INVALID_TXN_STATE"}],
    ),
    txn_offset_commit_check: (
        [("verification_failed", "txn_offset_commit")],
        [("txnguard_error_rewrites_total", {"api": "txn_offset_commit", "client_family": JAVA,
                                            "from_error": "late_write", "to_error": "INVALID_TXN_STATE"}),
         ("txnguard_inspection_time_ms_count", {"api": "txn_offset_commit"}),
         ("txnguard_verification_failures_total", {"reason": "late_write"}),
         ("txnguard_verification_time_ms_count", {"evidence": "local"}),
         ("txnguard_verifications_total", {"decision": "rejected", "evidence": "local", "outcome": "late_write"})],
        [{"kind": "decision", "api": "txn_offset_commit", "api_version": 3, "target": "group:g",
          "decision": "rejected", "outcome": "late_write", "error_name": "INVALID_TXN_STATE"}],
    ),
    add_partitions_held: (
        [("end_txn_hold_ended", "AddPartitionsToTxn")],
        [("txnguard_end_txn_hold_endings_total", {"ending": "timeout"})],
        [{"kind": "end_txn_hold", "api": "AddPartitionsToTxn", "decision": "rejected",
          "error_name": "CONCURRENT_TRANSACTIONS"}],
    ),
    add_offsets_held: (
        [("end_txn_hold_ended", "AddOffsetsToTxn")],
        [("txnguard_end_txn_hold_endings_total", {"ending": "settled"})],
        [{"kind": "end_txn_hold", "api": "AddOffsetsToTxn", "decision": "forwarded", "error_name": None}],
    ),
    end_txn_timed_out: (
        [("coordinator_timeout_recovered", "end_txn")],
        [("txnguard_error_rewrites_total", {"api": "end_txn", "client_family": JAVA, "from_error": "PRODUCER_FENCED",
                                            "to_error": "INVALID_PRODUCER_ID_MAPPING"})],
        [{"kind": "decision", "api": "end_txn", "api_version": 3, "target": f"txn:{TXN}",
          "decision": "timeout_recovered", "outcome": "producer_fenced", "error_name": "INVALID_PRODUCER_ID_MAPPING"}],
    ),
    init_producer_id_timed_out: (
        [("coordinator_timeout_recovered", "init_producer_id")],
        [("txnguard_error_rewrites_total", {"api": "init_producer_id", "client_family": JAVA,
                                            "from_error": "PRODUCER_FENCED", "to_error": "EPOCH_OF_COORDINATOR"})],
        [{"kind": "decision", "api": "init_producer_id", "api_version": 4, "target": f"txn:{TXN}",
          "decision": "timeout_recovered", "outcome": "producer_fenced", "error_name": None}],
    ),
}


@pytest.mark.parametrize("check", list(RECORDED), ids=lambda f: f.__name__)
def test_each_kind_of_check_is_recorded_under_its_own_names(check: Any, tmp_path: Path) -> None:
    proxy = _Proxy(tmp_path)
    assert proxy.record(check(proxy)) == RECORDED[check]

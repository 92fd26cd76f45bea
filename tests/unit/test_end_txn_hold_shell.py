"""The KAFKA-17754 hold in the asyncio shell: the guard waits for the EndTxn in doubt to end, within the bound.

The ledger is the guard's own; an answer on the EndTxn's connection (the core calls `answered`) wakes
the hold at once; a coordinator naming another producer epoch fences it; the bound answers "still in doubt".
Time is a fake clock (virtual_time.py): the loop's waits and the ledger's wall milliseconds are one virtual
clock, so the durations below are exact and no real time passes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from virtual_time import VirtualClock, run

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.checks import AwaitEndTxn, EndTxnSettled, EndTxnStillInDoubt

TXN, PID, EPOCH = "app", 7, 0


class Coordinator:
    """DescribeTransactions answers (the verifier's `describe`), counted."""

    def __init__(self, epoch: int = EPOCH) -> None:
        self.epoch = epoch
        self.asked = 0

    async def describe(self, txn_id: str) -> DescribedTransaction:
        self.asked += 1
        return DescribedTransaction(0, txn_id, "CompleteCommit", 60_000, -1, PID, self.epoch, frozenset())

    async def close(self) -> None:
        pass


def guard_with(coordinator: Coordinator, clock: VirtualClock) -> tuple[TransactionGuard, ProxyMetrics]:
    metrics = ProxyMetrics()
    guard = TransactionGuard(ProxyConfig(upstream=(HostPort("127.0.0.1", 9),)), metrics, policy_from_config({}), None,
                             clock=clock)
    guard.verifier = coordinator  # type: ignore[assignment]
    return guard, metrics


def metric(metrics: ProxyMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def held_question(hold_ms: float) -> AwaitEndTxn:
    return AwaitEndTxn(TXN, PID, EPOCH, hold_ms=hold_ms, connection_id=2)


def test_the_end_txns_answer_ends_the_hold_at_once(log_lines):
    clock = VirtualClock()
    coordinator = Coordinator()
    guard, metrics = guard_with(coordinator, clock)
    sent = guard.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=clock.wall_ms())

    async def scenario() -> Any:
        task = asyncio.ensure_future(guard.answer(held_question(5_000), None))
        await asyncio.sleep(0.1)                          # the hold has begun; its first question is at 0.25 s
        held_now = metric(metrics, "txnguard_end_txn_holds")
        answered_at = clock.seconds
        guard.rules.observe_response(ApiKey.END_TXN, 3, sent, memoryview(b""), 0)   # the EndTxn's answer came back
        answer = await task
        return held_now, answer, clock.seconds - answered_at

    held_now, answer, after = run(scenario(), clock)
    assert held_now == 1 and answer == EndTxnSettled()
    assert after == 0 and coordinator.asked == 0          # woken by the answer at that instant, not by a poll
    assert metric(metrics, "txnguard_end_txn_in_doubt_endings_total", {"ending": "answered"}) == 1
    assert metric(metrics, "txnguard_end_txn_holds") == 0
    [line] = [x for x in log_lines() if x["event"] == "end_txn_hold"]
    assert line["transactional_id"] == TXN and line["end_txn"]["connection_id"] == 1 and "KAFKA-17754" in line["reason"]


def test_a_coordinator_naming_a_newer_epoch_fences_the_end_txn_and_ends_the_hold():
    clock = VirtualClock()
    coordinator = Coordinator(epoch=EPOCH + 1)            # e.g. it aborted the transaction on its timeout
    guard, metrics = guard_with(coordinator, clock)
    guard.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=clock.wall_ms())
    started = clock.seconds
    answer = run(guard.answer(held_question(5_000), None), clock)
    assert answer == EndTxnSettled() and coordinator.asked == 1
    assert clock.seconds - started == pytest.approx(0.25)  # ended by the first question, at 0.25 s
    assert metric(metrics, "txnguard_end_txn_in_doubt_endings_total", {"ending": "fenced"}) == 1


def test_a_coordinator_answer_after_the_end_txns_connection_closed_ends_the_hold():
    clock = VirtualClock()
    coordinator = Coordinator()                           # same epoch, but asked after the close
    guard, metrics = guard_with(coordinator, clock)
    sent = guard.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=clock.wall_ms())
    guard.in_doubt.orphaned(sent, clock.wall_ms())
    answer = run(guard.answer(held_question(5_000), None), clock)
    assert answer == EndTxnSettled() and coordinator.asked == 1
    assert metric(metrics, "txnguard_end_txn_in_doubt_endings_total", {"ending": "closed"}) == 1


def test_at_the_bound_the_hold_says_still_in_doubt():
    clock = VirtualClock()
    coordinator = Coordinator()                           # same producer epoch: proves nothing
    guard, _ = guard_with(coordinator, clock)
    guard.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=clock.wall_ms())
    started = clock.seconds
    answer = run(guard.answer(held_question(800), None), clock)
    assert answer == EndTxnStillInDoubt()
    assert clock.seconds - started == pytest.approx(0.8)  # exactly its bound
    assert coordinator.asked == 2                         # at 0.25 s, then every 0.5 s: at 0.75 s
    assert len(guard.in_doubt) == 1                       # still in doubt: the next request is held again

"""Holding a check while the coordinator cannot answer, as the broker holds a Produce (issue 13).

    client ─Produce(timeout_ms=T)─▶ core ─Ask(hold_ms=0.8·T)─▶ guard ─▶ coordinator … "not now"
                                           guard … backoff, asks again … "not now"
                                           guard … backoff, asks again ✓ Ongoing  ─▶ forwarded
    or, when the hold runs out:                                  ◀─ NOT_ENOUGH_REPLICAS (retriable)

The pure half (verification/hold_limits.py and the hold budget in the VerifyPartitions question) is tested
on its own; the guard's loop runs against a scripted verifier (a stand-in for a
coordinator that is frozen, then answers), since a real frozen coordinator is what
tests/integration/test_coordinator_unavailable.py freezes. The loop runs on a fake
clock (virtual_time.py): its waits take exact virtual durations and no real time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from connection_playbook import PID, T0, T1, TXN, FakeClock, Like, Playbook, of_type, produce, request, steps
from kio.static.primitive import i16, i32, i64
from virtual_time import VirtualClock, run

from txnguard.codecs.header import peek_request, produce_timeout_ms
from txnguard.connection.commands import Ask, PauseReading, Side
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import ConfigError, HostPort, ProxyConfig, from_mapping
from txnguard.proxy.guard import TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import CountOffsetsPartitions, OffsetsPartitionCount, VerifyPartitions
from txnguard.verification.decisions import PendingCheck
from txnguard.verification.hold_limits import NO_HOLD, HoldLimits, worth_asking_again
from txnguard.verification.judge import coordinator_unreachable
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed

NOT_NOW = coordinator_unreachable("no answer from the coordinator: TimeoutError()")
ONGOING = passed(Evidence.COORDINATOR, "Ongoing")
NOT_ADDED = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not added")
FENCED = Verdict(Outcome.FENCED, Evidence.COORDINATOR, "other epoch")
CLIENT = ClientInfo("c", "apache-kafka-java", "3.5.2", "java", "bootstrap", 1)


# -- the budget ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("timeout_ms", "limits", "budget"), [
    (30_000, HoldLimits(), 24_000.0),                  # Java/kafka-python/librdkafka default request timeout
    (1_500, HoldLimits(), 1_200.0),                    # a short client timeout: a short hold
    (120_000, HoldLimits(), 30_000.0),                 # capped by max_ms
    (None, HoldLimits(default_request_timeout_ms=10_000), 8_000.0),  # TxnOffsetCommit, nothing learned
    (30_000, NO_HOLD, 0.0),                            # share 0: one question, as before issue 13
    (0, HoldLimits(), 0.0),                            # a Produce that allows no time at all
])
def test_a_hold_lasts_a_share_of_the_requests_own_timeout(timeout_ms, limits, budget):
    assert limits.budget_ms(timeout_ms) == budget


def test_questions_back_off_doubling_up_to_a_second():
    assert [HoldLimits().backoff(a) for a in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]


def test_only_not_now_is_worth_asking_again_and_a_definite_failure_ends_the_hold():
    assert worth_asking_again({T0: NOT_NOW, T1: NOT_NOW}) == [T0, T1]
    assert worth_asking_again({T0: ONGOING, T1: NOT_NOW}) == [T1]    # T0 settled: ask only about T1
    assert worth_asking_again({T0: NOT_ADDED, T1: NOT_NOW}) == []    # T0 is refused anyway: answer now
    assert worth_asking_again({T0: FENCED}) == []
    assert worth_asking_again({T0: ONGOING}) == []


# -- the question carries the budget --------------------------------------------------------------------------


def test_the_produce_timeout_is_read_in_place():
    frame = produce(1, [T0], timeout_ms=12_345)
    assert produce_timeout_ms(frame[4:], peek_request(frame[4:])) == 12_345


def test_a_produce_the_core_cannot_decide_asks_with_a_hold_of_its_own_timeout():
    pb = Playbook()
    out = pb.client_sends(produce(1, [T0], timeout_ms=10_000))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    [ask] = of_type(out, Ask)
    assert ask.question.hold_ms == 8_000


def txn_offset_commit(correlation_id: int) -> bytes:
    from kio.schema.txn_offset_commit.v3 import request as m

    return request(m.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id="g", producer_id=i64(PID), producer_epoch=i16(0), generation_id=i32(-1),
        member_id="", group_instance_id=None,
        topics=(m.TxnOffsetCommitRequestTopic(name="orders", partitions=(m.TxnOffsetCommitRequestPartition(
            partition_index=i32(0), committed_offset=i64(5), committed_leader_epoch=i32(-1),
            committed_metadata=""),)),)), correlation_id)


def test_a_txn_offset_commit_holds_as_long_as_the_ids_produce_timeout_else_the_configured_default():
    pb = Playbook()
    pb.rules.offsets_partitions = 50
    clock = FakeClock()
    pb.registry.init_producer_id(TXN, PID, 0, 60_000, clock.wall_ms())
    # Nothing learned yet: the configured client request timeout (30 s by default).
    check = pb.rules.check_txn_offset_commit(memoryview(txn_offset_commit(1)), 3, CLIENT, clock)
    assert isinstance(check, PendingCheck) and check.question.hold_ms == 24_000
    # The id's Produce said 5 s: its TxnOffsetCommit gets the same client's bound.
    assert steps(pb.client_sends(produce(2, [T0], timeout_ms=5_000))) == [PauseReading(Side.CLIENT, "verification"),
                                                                          Like(Ask)]
    check = pb.rules.check_txn_offset_commit(memoryview(txn_offset_commit(3)), 3, CLIENT, clock)
    assert isinstance(check, PendingCheck) and check.question.hold_ms == 4_000


def test_a_first_question_for_the_offsets_partition_count_spends_the_same_budget():
    # client ─TxnOffsetCommit─▶ core ─Ask(offsets partitions?)─▶ guard … 1 s (a frozen bootstrap broker)
    #                                ◀─ 50 ─ core ─Ask(group partition, hold_ms = 4 s - 1 s)─▶ guard
    pb = Playbook()
    clock = FakeClock()
    pb.registry.init_producer_id(TXN, PID, 0, 60_000, clock.wall_ms())
    out = pb.client_sends(produce(2, [T0], timeout_ms=5_000))   # the id's bound: 0.8 x 5 s = 4 s
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    first = pb.rules.check_txn_offset_commit(memoryview(txn_offset_commit(3)), 3, CLIENT, clock)
    assert isinstance(first, PendingCheck) and isinstance(first.question, CountOffsetsPartitions)
    clock.seconds += 1.0
    second = pb.rules.resume(first, OffsetsPartitionCount(50), clock)
    assert isinstance(second, PendingCheck) and second.question.hold_ms == 3_000
    # A first question that outlasted the whole budget leaves one question, bounded by its own timeout.
    clock.seconds += 10.0
    third = pb.rules.resume(first, OffsetsPartitionCount(50), clock)
    assert isinstance(third, PendingCheck) and third.question.hold_ms == 0


# -- configuration ------------------------------------------------------------------------------------------


def test_the_hold_is_configurable_and_a_share_past_the_whole_timeout_is_refused():
    cfg = from_mapping({"upstream": "127.0.0.1:9092", "verification": {"hold_share": 0, "hold_max_ms": 9000}})
    assert (cfg.verification.hold_share, cfg.verification.hold_max_ms) == (0.0, 9000)
    with pytest.raises(ConfigError, match="hold_share"):
        from_mapping({"upstream": "127.0.0.1:9092", "verification": {"hold_share": 1.5}})


# -- the guard's loop, against a scripted coordinator -----------------------------------------------------------


class ScriptedVerifier:
    """Answers each verify() with the next verdict in the script (the last one repeats), after `delay_s`."""

    def __init__(self, script: list[Verdict], delay_s: float = 0.0) -> None:
        self.script, self.delay_s = script, delay_s
        self.asked: list[list[tuple[str, int]]] = []

    async def verify(self, txn_id: str, pid: int, epoch: int, pending: Any, leader: Any) -> Any:
        self.asked.append(list(pending))
        await asyncio.sleep(self.delay_s)
        v = self.script[min(len(self.asked) - 1, len(self.script) - 1)]
        return {tp: v for tp in pending}, None

    async def close(self) -> None:
        pass


def guard_with(verifier: ScriptedVerifier, clock: VirtualClock | None = None) -> tuple[TransactionGuard, ProxyMetrics]:
    metrics = ProxyMetrics()
    config = ProxyConfig(upstream=(HostPort("127.0.0.1", 9),))
    guard = TransactionGuard(config, metrics, policy_from_config({}), None, clock=clock)
    guard.verifier = verifier  # type: ignore[assignment]
    return guard, metrics


def metric(metrics: ProxyMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_a_check_is_held_until_the_coordinator_answers_and_then_decided_by_that_answer(log_lines):
    clock = VirtualClock()
    verifier = ScriptedVerifier([NOT_NOW, NOT_NOW, ONGOING])
    guard, metrics = guard_with(verifier, clock)
    question = VerifyPartitions(TXN, PID, 0, (T0,), hold_ms=5_000)
    started = clock.seconds

    async def scenario() -> Any:
        task = asyncio.ensure_future(guard.answer(question, None))
        await asyncio.sleep(0.05)                          # between the first question and the second (0.1 s)
        held_now = metric(metrics, "txnguard_verification_holds")
        return held_now, await task

    held_now, answer = run(scenario(), clock)
    assert held_now == 1                                   # visible while it lasts
    assert answer.verdicts == {T0: ONGOING}                # the coordinator's own answer decides
    assert len(verifier.asked) == 3
    assert clock.seconds - started == pytest.approx(0.1 + 0.2)  # two backoffs, then the answer: not the bound
    assert metric(metrics, "txnguard_verification_holds") == 0
    assert metric(metrics, "txnguard_verification_hold_endings_total", {"ending": "decided"}) == 1
    assert [line["event"] for line in log_lines()] == []  # a hold that ends in an answer is not news


def test_a_hold_ends_at_its_bound_with_the_retriable_answer_never_letting_the_write_through(log_lines):
    clock = VirtualClock()
    verifier = ScriptedVerifier([NOT_NOW], delay_s=0.05)   # each question takes 50 ms
    guard, metrics = guard_with(verifier, clock)
    started = clock.seconds
    answer = run(guard.answer(VerifyPartitions(TXN, PID, 0, (T0,), hold_ms=600), None), clock)
    assert answer.verdicts == {T0: NOT_NOW}
    assert clock.seconds - started == pytest.approx(0.6)  # exactly its bound
    # Asked at 0 (answered 0.05), 0.15 (0.2), 0.4 (0.45); the next pause (400 ms) is cut at 0.6: no fourth.
    assert len(verifier.asked) == 3
    assert metric(metrics, "txnguard_verification_hold_endings_total", {"ending": "timeout"}) == 1
    assert metric(metrics, "txnguard_verification_holds") == 0
    [line] = log_lines()
    assert (line["event"], line["level"], line["transactional_id"], line["partitions"], line["held_ms"]) == (
        "verification_hold_expired", "warning", TXN, ["orders-0"], 600)


def test_a_definite_answer_is_not_asked_again(log_lines):
    verifier = ScriptedVerifier([NOT_ADDED])
    guard, metrics = guard_with(verifier)
    answer = run(guard.answer(VerifyPartitions(TXN, PID, 0, (T0,), hold_ms=5_000), None))
    assert answer.verdicts == {T0: NOT_ADDED} and len(verifier.asked) == 1
    assert metric(metrics, "txnguard_verification_hold_endings_total", {"ending": "decided"}) == 0


def test_without_a_hold_one_question_is_all(log_lines):
    verifier = ScriptedVerifier([NOT_NOW])
    guard, _ = guard_with(verifier)
    answer = run(guard.answer(VerifyPartitions(TXN, PID, 0, (T0,), hold_ms=0), None))
    assert answer.verdicts == {T0: NOT_NOW} and len(verifier.asked) == 1


def test_only_the_unsettled_partitions_are_asked_again(log_lines):
    class Split(ScriptedVerifier):
        async def verify(self, txn_id: str, pid: int, epoch: int, pending: Any, leader: Any) -> Any:
            self.asked.append(list(pending))
            if len(self.asked) == 1:
                return {T0: ONGOING, T1: NOT_NOW}, None
            return {tp: ONGOING for tp in pending}, None

    verifier = Split([])
    guard, _ = guard_with(verifier)
    answer = run(guard.answer(VerifyPartitions(TXN, PID, 0, (T0, T1), hold_ms=5_000), None))
    assert verifier.asked == [[T0, T1], [T1]]
    assert answer.verdicts == {T0: ONGOING, T1: ONGOING}

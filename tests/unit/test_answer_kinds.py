"""Each kind of answer, decided: what the pure rules do with the answer the shell found out for a question.

A check's question (verification/checks.py) is answered by one of its own answers, each carrying only what
it has; `TransactionRules.resume` dispatches on the answer's type. Frames are real Kafka requests (kio).

    VerifyPartitions       ─▶ PartitionVerdicts             the partitions' verdicts (and the coordinator's view)
    CountOffsetsPartitions ─▶ OffsetsPartitionCount         then the group's partition is asked about
                           ─▶ OffsetsPartitionCountFailed   the commit cannot be verified: retriable
    DescribeTransaction    ─▶ TransactionDescription        aborted for its timeout: the EndTxn is answered here
                           ─▶ TransactionDescriptionFailed  nothing proves a timeout: the EndTxn goes on
    AwaitEndTxn            ─▶ EndTxnSettled                 the held AddOffsetsToTxn goes on
                           ─▶ EndTxnStillInDoubt            CONCURRENT_TRANSACTIONS, which the client retries
"""

from __future__ import annotations

import pytest
from connection_playbook import (
    EPOCH,
    PID,
    T0,
    TXN,
    FakeClock,
    add_offsets,
    decode_produce_response,
    produce,
    request,
    request_module,
)
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TransactionalId
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.groups import CONSUMER_OFFSETS, offsets_partition_for
from txnguard.policies.families import JAVA
from txnguard.policies.policy import policy_from_config
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import (
    Answer,
    AwaitEndTxn,
    CountOffsetsPartitions,
    DescribeTransaction,
    EndTxnSettled,
    EndTxnStillInDoubt,
    OffsetsPartitionCount,
    OffsetsPartitionCountFailed,
    PartitionVerdicts,
    Question,
    TransactionDescription,
    TransactionDescriptionFailed,
    VerifyPartitions,
    answers,
)
from txnguard.verification.decisions import Decision, PendingCheck, TransactionRules
from txnguard.verification.in_doubt import EndTxnLedger, InDoubtLimits
from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed

CLIENT = ClientInfo("c", None, None, JAVA, "bootstrap", 2)
TIMEOUT_MS = 60_000
NOT_ADDED = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not in the transaction", "INVALID_TXN_STATE")


def _rules(limits: RegistryLimits | None = None, **policy: bool) -> tuple[TransactionRules, FakeClock]:
    clock = FakeClock()
    rules = TransactionRules(Registry(limits), policy_from_config(dict(policy)),
                             in_doubt=EndTxnLedger(InDoubtLimits()))
    rules.registry.init_producer_id(TXN, PID, EPOCH, TIMEOUT_MS, clock.wall_ms())
    return rules, clock


def _asked(result: Decision | PendingCheck, question: type) -> PendingCheck:
    assert isinstance(result, PendingCheck) and isinstance(result.question, question), result
    return result


def _decided(result: Decision | PendingCheck) -> Decision:
    assert isinstance(result, Decision), result
    return result


def _description(state: str, epoch: int, start_ms: int) -> DescribedTransaction:
    return DescribedTransaction(0, TXN, state, TIMEOUT_MS, start_ms, PID, epoch, frozenset({T0}))


def _txn_offset_commit(correlation_id: int) -> memoryview:
    m = request_module(ApiKey.TXN_OFFSET_COMMIT, 3)
    return memoryview(request(m.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id="g", producer_id=i64(PID), producer_epoch=i16(EPOCH), generation_id=i32(-1),
        member_id="", group_instance_id=None,
        topics=(m.TxnOffsetCommitRequestTopic(name="orders", partitions=(m.TxnOffsetCommitRequestPartition(
            partition_index=i32(0), committed_offset=i64(5), committed_leader_epoch=i32(-1),
            committed_metadata=""),)),)), correlation_id))


def _end_txn(correlation_id: int) -> memoryview:
    return memoryview(request(EndTxnRequest(transactional_id=TransactionalId(TXN), producer_id=ProducerId(PID),
                                            producer_epoch=i16(EPOCH), committed=True), correlation_id))


# -- VerifyPartitions ------------------------------------------------------------------------------------------------


def test_partition_verdicts_decide_the_produce_and_an_ongoing_coordinator_is_kept_as_evidence_within_its_bound():
    # client ─Produce[orders-0]─▶ rules ─VerifyPartitions(orders-0)─▶ shell
    #                                   ◀─PartitionVerdicts(orders-0 passed; coordinator: Ongoing)─
    #        ◀─────────── forwarded as it is ─────────────┘
    # client ─Produce[orders-0]─▶ rules: decided at once (the coordinator's "Ongoing", within evidence_ttl_ms)
    rules, clock = _rules(RegistryLimits(evidence_ttl_ms=60_000))
    frame = memoryview(produce(1, [T0]))
    pending = _asked(rules.check_produce(frame, 9, CLIENT, clock), VerifyPartitions)
    assert pending.question == VerifyPartitions(TXN, PID, EPOCH, (T0,), ask_leader=True, hold_ms=24_000)
    ongoing = _description("Ongoing", EPOCH, clock.wall_ms())
    decision = _decided(rules.resume(pending, PartitionVerdicts({T0: passed(Evidence.COORDINATOR)}, ongoing), clock))
    assert decision.forward is frame and decision.rejections == {}
    assert [(r.target, r.decision) for r in decision.records] == [("orders-0", "forwarded")]
    again = _decided(rules.check_produce(memoryview(produce(2, [T0])), 9, CLIENT, clock))
    assert [(r.target, r.verdict.evidence) for r in again.records] == [("orders-0", Evidence.CACHE)]


def test_a_gateway_asks_again_after_a_coordinators_ongoing_it_was_given():
    # client ─Produce[orders-0]─▶ gateway B ─VerifyPartitions─▶ ◀─passed; coordinator: Ongoing─ forwarded
    #                            … the transaction commits through gateway A (unseen here) …
    # client ─Produce[orders-0]─▶ gateway B ─VerifyPartitions─▶ (asked again: a given answer is not kept)
    rules, clock = _rules()  # a gateway's limits: only what it forwarded lasts until the EndTxn it forwards
    pending = _asked(rules.check_produce(memoryview(produce(1, [T0])), 9, CLIENT, clock), VerifyPartitions)
    ongoing = _description("Ongoing", EPOCH, clock.wall_ms())
    _decided(rules.resume(pending, PartitionVerdicts({T0: passed(Evidence.COORDINATOR)}, ongoing), clock))
    _asked(rules.check_produce(memoryview(produce(2, [T0])), 9, CLIENT, clock), VerifyPartitions)


def test_partition_verdicts_without_a_description_keep_nothing_and_a_rejection_is_answered_here():
    # client ─Produce[orders-0]─▶ rules ─VerifyPartitions─▶ shell ◀─PartitionVerdicts(orders-0: not added)─
    #        ◀─ INVALID_TXN_STATE, nothing forwarded ─┘
    # client ─Produce[orders-0]─▶ rules ─VerifyPartitions─▶ (asked again: nothing was learned)
    rules, clock = _rules()
    pending = _asked(rules.check_produce(memoryview(produce(1, [T0])), 9, CLIENT, clock), VerifyPartitions)
    decision = _decided(rules.resume(pending, PartitionVerdicts({T0: NOT_ADDED}), clock))
    assert decision.forward is None and decision.local_response is not None
    assert [(t, p, code) for t, p, code, _ in decode_produce_response(decision.local_response)] == [
        ("orders", 0, ErrorCode.invalid_txn_state)]
    _asked(rules.check_produce(memoryview(produce(2, [T0])), 9, CLIENT, clock), VerifyPartitions)


# -- CountOffsetsPartitions --------------------------------------------------------------------------------------------


def test_an_offsets_partition_count_is_kept_and_the_groups_partition_is_asked_about_next():
    # client ─TxnOffsetCommit(g)─▶ rules ─CountOffsetsPartitions─▶ shell ◀─OffsetsPartitionCount(50)─
    #                              rules ─VerifyPartitions(__consumer_offsets-<partition of g among 50>)─▶ shell
    # client ─TxnOffsetCommit(g)─▶ rules ─VerifyPartitions─▶ (the count is asked for once per proxy)
    rules, clock = _rules()
    first = _asked(rules.check_txn_offset_commit(_txn_offset_commit(1), 3, CLIENT, clock), CountOffsetsPartitions)
    group_partition = (CONSUMER_OFFSETS, offsets_partition_for("g", 50))
    second = _asked(rules.resume(first, OffsetsPartitionCount(50), clock), VerifyPartitions)
    assert second.question.partitions == (group_partition,)
    assert rules.offsets_partitions == 50
    again = _asked(rules.check_txn_offset_commit(_txn_offset_commit(2), 3, CLIENT, clock), VerifyPartitions)
    assert again.question.partitions == (group_partition,)


def test_no_offsets_partition_count_fails_the_commit_as_retriable_and_is_asked_for_again():
    # client ─TxnOffsetCommit(g)─▶ rules ─CountOffsetsPartitions─▶ shell ◀─OffsetsPartitionCountFailed(timeout)─
    #        ◀─ rejected: the coordinator cannot be reached (retriable) ─┘
    # client ─TxnOffsetCommit(g)─▶ rules ─CountOffsetsPartitions─▶ (nothing was kept)
    rules, clock = _rules()
    first = _asked(rules.check_txn_offset_commit(_txn_offset_commit(1), 3, CLIENT, clock), CountOffsetsPartitions)
    decision = _decided(rules.resume(first, OffsetsPartitionCountFailed("TimeoutError()"), clock))
    assert decision.forward is None and decision.local_response is not None
    [record] = decision.records
    assert (record.target, record.decision, record.verdict.outcome) == ("group:g", "rejected",
                                                                         Outcome.COORDINATOR_RETRIABLE)
    assert record.verdict.detail == "cannot read __consumer_offsets metadata: TimeoutError()"
    assert rules.offsets_partitions is None
    _asked(rules.check_txn_offset_commit(_txn_offset_commit(2), 3, CLIENT, clock), CountOffsetsPartitions)


# -- DescribeTransaction -----------------------------------------------------------------------------------------------


def _past_its_timeout(rules: TransactionRules, clock: FakeClock) -> int:
    started = clock.wall_ms()
    rules.registry.added(TXN, PID, EPOCH, started, partitions={T0})
    clock.seconds += TIMEOUT_MS / 1000 + 1
    return started


def test_a_transaction_description_showing_the_coordinators_abort_answers_the_end_txn_here():
    # client ─AddPartitionsToTxn─▶ … 61 s … client ─EndTxn(commit)─▶ rules ─DescribeTransaction─▶ shell
    #   ◀─TransactionDescription(CompleteAbort at epoch E+1)─ ; client ◀─ INVALID_PRODUCER_ID_MAPPING (Java)
    rules, clock = _rules(timeout_recovery=True)
    started = _past_its_timeout(rules, clock)
    pending = _asked(rules.check_lifecycle(_end_txn(1), 3, CLIENT, clock), DescribeTransaction)
    aborted = _description("CompleteAbort", EPOCH + 1, started - 3)
    decision = _decided(rules.resume(pending, TransactionDescription(aborted), clock))
    assert decision.forward is None and decision.local_response is not None
    _, body = schemas.decode_response(memoryview(decision.local_response)[4:], ApiKey.END_TXN, 3)
    assert body.error_code == ErrorCode.invalid_producer_id_mapping
    assert [r.decision for r in decision.records] == ["timeout_recovered"]


def test_no_transaction_description_lets_the_end_txn_go_on_as_it_is():
    # client ─EndTxn(commit)─▶ rules ─DescribeTransaction─▶ shell ◀─TransactionDescriptionFailed(timeout)─
    #        forwarded untouched (and in doubt until its answer) ─▶ coordinator
    rules, clock = _rules(timeout_recovery=True)
    _past_its_timeout(rules, clock)
    frame = _end_txn(1)
    pending = _asked(rules.check_lifecycle(frame, 3, CLIENT, clock), DescribeTransaction)
    decision = _decided(rules.resume(pending, TransactionDescriptionFailed("TimeoutError()"), clock))
    assert decision.forward is frame and decision.records == [] and decision.observe is not None
    assert rules.in_doubt is not None and rules.in_doubt.in_doubt(TXN) != []


# -- AwaitEndTxn -------------------------------------------------------------------------------------------------------


def _held(rules: TransactionRules, clock: FakeClock, frame: memoryview) -> PendingCheck:
    # connection 1 ─EndTxn─▶ coordinator (unanswered); connection 2 ─AddOffsetsToTxn─▶ rules: held
    assert rules.in_doubt is not None
    rules.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=1, now_ms=clock.wall_ms())
    observed = rules.observe_request(ApiKey.ADD_OFFSETS_TO_TXN, 3, frame[4:], clock.wall_ms(), connection_id=2)
    return _asked(rules.end_txn_hold(ApiKey.ADD_OFFSETS_TO_TXN, 3, frame, observed, CLIENT, 2, clock), AwaitEndTxn)


def test_end_txn_settled_lets_the_held_request_go_on():
    # connection 2 ─AddOffsetsToTxn─▶ rules ─AwaitEndTxn─▶ shell ◀─EndTxnSettled─ ; forwarded as it is
    rules, clock = _rules()
    frame = memoryview(add_offsets(1))
    decision = _decided(rules.resume(_held(rules, clock, frame), EndTxnSettled(), clock))
    assert decision.forward is frame and decision.local_response is None


def test_end_txn_still_in_doubt_answers_concurrent_transactions_which_the_client_retries():
    # connection 2 ─AddOffsetsToTxn─▶ rules ─AwaitEndTxn─▶ shell ◀─EndTxnStillInDoubt (its bound passed)─
    #              ◀─ CONCURRENT_TRANSACTIONS, nothing forwarded ─┘
    rules, clock = _rules()
    decision = _decided(rules.resume(_held(rules, clock, memoryview(add_offsets(1))), EndTxnStillInDoubt(), clock))
    assert decision.forward is None and decision.local_response is not None
    assert decision.local_reason == "end_txn_in_doubt"
    _, body = schemas.decode_response(memoryview(decision.local_response)[4:], ApiKey.ADD_OFFSETS_TO_TXN, 3)
    assert body.error_code == ErrorCode.concurrent_transactions


# -- which answer answers which question -------------------------------------------------------------------------------

QUESTIONS: list[Question] = [VerifyPartitions(TXN, PID, EPOCH, (T0,)), CountOffsetsPartitions(),
                             DescribeTransaction(TXN), AwaitEndTxn(TXN, PID, EPOCH, 1_000.0, 1)]
ANSWERS: dict[type[Question], list[Answer]] = {
    VerifyPartitions: [PartitionVerdicts({T0: NOT_ADDED})],
    CountOffsetsPartitions: [OffsetsPartitionCount(50), OffsetsPartitionCountFailed("e")],
    DescribeTransaction: [TransactionDescription(_description("Ongoing", EPOCH, 0)),
                          TransactionDescriptionFailed("e")],
    AwaitEndTxn: [EndTxnSettled(), EndTxnStillInDoubt()],
}


@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: type(q).__name__)
def test_each_question_takes_its_own_answers_and_no_other(question: Question):
    own = ANSWERS[type(question)]
    others = [a for kind, found in ANSWERS.items() if kind is not type(question) for a in found]
    assert [answers(question, a) for a in own] == [True] * len(own)
    assert [answers(question, a) for a in others] == [False] * len(others)


def test_an_answer_to_another_question_is_a_bug_not_a_decision():
    # rules ─VerifyPartitions─▶ shell ◀─EndTxnSettled─ : no decision is taken from it
    rules, clock = _rules()
    pending = _asked(rules.check_produce(memoryview(produce(1, [T0])), 9, CLIENT, clock), VerifyPartitions)
    with pytest.raises(AssertionError, match="EndTxnSettled does not answer VerifyPartitions"):
        rules.resume(pending, EndTxnSettled(), clock)

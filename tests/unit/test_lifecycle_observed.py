"""Each observed life-cycle request, as its own type, and what the rules learn from its answer.

`TransactionRules.observe_request` reads a request as `InitProducerIdSeen`, `AddPartitionsSeen`,
`AddOffsetsSeen` or (kept as its `SentEndTxn` while in doubt) `EndTxnSeen`; `observe_response` matches on
that type. Frames are real Kafka requests and answers (kio).

    client ─InitProducerId─▶ coordinator ◀─ pid, epoch ─   the registry knows the producer
    client ─AddPartitionsToTxn[orders-0]─▶ … ◀─ NONE ─      orders-0 is in the transaction
    client ─AddPartitionsToTxn[orders-0]─▶ … ◀─ 51 ─        nothing added; asked again (True)
    client ─AddOffsetsToTxn(g)─▶ … ◀─ NONE ─                 group g is in the transaction
    client ─EndTxn─▶ … (in doubt) ◀─ any answer ─           no longer in doubt
"""

from __future__ import annotations

from connection_playbook import (
    EPOCH,
    PID,
    T0,
    TXN,
    FakeClock,
    add_offsets,
    add_offsets_response,
    add_partitions,
    add_partitions_response,
    init_producer_id,
    init_producer_id_response,
    request,
    request_module,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.lifecycle_scan import AddOffsetsSeen, AddPartitionsSeen, InitProducerIdSeen
from txnguard.policies.policy import policy_from_config
from txnguard.verification.decisions import TransactionRules
from txnguard.verification.in_doubt import EndTxnLedger, InDoubtLimits, SentEndTxn
from txnguard.verification.registry import Registry


def _rules() -> tuple[TransactionRules, FakeClock]:
    return TransactionRules(Registry(), policy_from_config({}), in_doubt=EndTxnLedger(InDoubtLimits())), FakeClock()


def _observed(rules: TransactionRules, clock: FakeClock, key: int, frame: bytes) -> object:
    return rules.observe_request(key, 3, memoryview(frame)[4:], clock.wall_ms(), connection_id=1)


def _answered(rules: TransactionRules, clock: FakeClock, key: int, observed: object, frame: bytes) -> bool:
    return rules.observe_response(key, 3, observed, memoryview(frame)[4:], clock.wall_ms())


def test_init_producer_id_is_seen_as_such_and_its_answer_names_the_producer():
    rules, clock = _rules()
    seen = _observed(rules, clock, ApiKey.INIT_PRODUCER_ID, init_producer_id(1))
    assert seen == InitProducerIdSeen(TXN, -1, -1, 60_000)
    assert _answered(rules, clock, ApiKey.INIT_PRODUCER_ID, seen, init_producer_id_response(1)) is False
    record = rules.registry.get(TXN)
    assert record is not None and (record.producer_id, record.producer_epoch, record.timeout_ms) == (PID, EPOCH,
                                                                                                    60_000)


def test_add_partitions_is_seen_as_such_and_only_an_accepted_partition_is_added():
    rules, clock = _rules()
    seen = _observed(rules, clock, ApiKey.ADD_PARTITIONS_TO_TXN, add_partitions(1, [T0]))
    assert seen == AddPartitionsSeen(TXN, PID, EPOCH, (T0,))
    refused = add_partitions_response(1, [T0], error=ErrorCode.concurrent_transactions)
    # the whole request refused: ask again
    assert _answered(rules, clock, ApiKey.ADD_PARTITIONS_TO_TXN, seen, refused) is True
    assert rules.registry.get(TXN) is None
    assert _answered(rules, clock, ApiKey.ADD_PARTITIONS_TO_TXN, seen, add_partitions_response(1, [T0])) is False
    record = rules.registry.get(TXN)
    assert record is not None and record.partitions == {T0}


def test_add_offsets_is_seen_as_such_and_its_group_is_added():
    rules, clock = _rules()
    seen = _observed(rules, clock, ApiKey.ADD_OFFSETS_TO_TXN, add_offsets(1, group="g"))
    assert seen == AddOffsetsSeen(TXN, PID, EPOCH, "g")
    refused = add_offsets_response(1, ErrorCode.concurrent_transactions)
    assert _answered(rules, clock, ApiKey.ADD_OFFSETS_TO_TXN, seen, refused) is True
    assert rules.registry.get(TXN) is None
    assert _answered(rules, clock, ApiKey.ADD_OFFSETS_TO_TXN, seen, add_offsets_response(1)) is False
    record = rules.registry.get(TXN)
    assert record is not None and record.groups == {"g"}


def test_end_txn_is_kept_as_in_doubt_until_any_answer():
    rules, clock = _rules()
    m = request_module(ApiKey.END_TXN, 3)
    frame = request(m.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                    committed=True), 1)
    sent = _observed(rules, clock, ApiKey.END_TXN, frame)
    assert isinstance(sent, SentEndTxn) and (sent.transactional_id, sent.committed) == (TXN, True)
    assert rules.in_doubt is not None and rules.in_doubt.in_doubt(TXN) == [sent]
    assert _answered(rules, clock, ApiKey.END_TXN, sent, b"") is False        # any answer at all: not even read
    assert rules.in_doubt.in_doubt(TXN) == []


def test_without_the_defence_an_end_txn_leaves_nothing_to_watch():
    rules = TransactionRules(Registry(), policy_from_config({}))
    clock = FakeClock()
    m = request_module(ApiKey.END_TXN, 3)
    frame = request(m.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                    committed=False), 1)
    assert _observed(rules, clock, ApiKey.END_TXN, frame) is None

"""Hypothesis: the fast path's life-cycle rules in one native call (native/src/py_observe.rs) observe as the Python
rules do, over any history of life-cycle requests and answers of a few producers on a few connections.

Two sets of rules, each with its own native registry and EndTxn ledger, get the same frames in the same order at
the same times: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn requests on connections, and
answers to them (no error, an error, CONCURRENT_TRANSACTIONS for the whole request, one partition refused), each
answer after its request, in any order. One set runs `observe_request_in_place` / `observe_response_in_place`
natively; the other is made to take the Python steps (`_native_state` answers False), the steps the general path
takes too. After every frame: the same answer (what the request is seen as, whether its bytes are kept to ask
again, whether the answer passes as it is), the registry's record of every id, and the ledger's size, endings and
EndTxns in doubt per id. The EndTxn defence and the CONCURRENT_TRANSACTIONS retry are each on or off per example.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.header import RequestHead
from txnguard.policies.policy import policy_from_config
from txnguard.verification.concurrent import ConcurrentRetry
from txnguard.verification.decisions import TransactionRules
from txnguard.verification.in_doubt import InDoubtLimits, NativeEndTxnLedger

# `make test` builds the native module; without it this import fails, and so does the run (not a skip).
from txnguard.verification.registry import NativeRegistry

IDS = ["a", "b"]
PRODUCERS = [("a", 1, 0), ("a", 1, 1), ("b", 2, 0), ("a", 3, 0)]  # (id, producer id, epoch)
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
KEYS = {"init": ApiKey.INIT_PRODUCER_ID, "add": ApiKey.ADD_PARTITIONS_TO_TXN, "offsets": ApiKey.ADD_OFFSETS_TO_TXN,
        "end": ApiKey.END_TXN}
VERSION = 3  # every one of the four at v3: the clients' shape (AddPartitionsToTxn v4+ is not read in place)


def _classes(key: int, side: str) -> Any:
    schema = schemas.request_schema(key, VERSION) if side == "request" else schemas.response_schema(key, VERSION)
    return sys.modules[schema.__module__]


def _by_topic(parts: list[tuple[str, int]]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for t, p in parts:
        topics.setdefault(t, []).append(p)
    return topics


def request_frame(kind: str, producer: tuple[str, int, int], parts: list[tuple[str, int]], committed: bool,
                  correlation_id: int) -> bytes:
    txn, pid, epoch = producer
    m = _classes(KEYS[kind], "request")
    if kind == "init":
        body = m.InitProducerIdRequest(transactional_id=txn, transaction_timeout=datetime.timedelta(seconds=60),
                                       producer_id=i64(pid), producer_epoch=i16(epoch))
    elif kind == "add":
        body = m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=txn, v3_and_below_producer_id=i64(pid),
            v3_and_below_producer_epoch=i16(epoch),
            v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(name=t, partitions=tuple(i32(p) for p in ps))
                                      for t, ps in _by_topic(parts).items()))
    elif kind == "offsets":
        body = m.AddOffsetsToTxnRequest(transactional_id=txn, producer_id=i64(pid), producer_epoch=i16(epoch),
                                        group_id="g")
    else:
        body = m.EndTxnRequest(transactional_id=txn, producer_id=i64(pid), producer_epoch=i16(epoch),
                               committed=committed)
    return schemas.encode_request(body, correlation_id, "property-client")


def answer_frame(kind: str, how: str, parts: list[tuple[str, int]], producer: tuple[str, int, int],
                 correlation_id: int) -> bytes:
    """`how`: "ok", "error" (an error the client does not retry), "concurrent" (the whole request), or
    "partly" (AddPartitionsToTxn: the first partition refused, the others aborted as the coordinator does)."""
    key = KEYS[kind]
    m = _classes(key, "response")
    code = {"ok": ErrorCode.none, "error": ErrorCode.invalid_producer_epoch,
            "concurrent": ErrorCode.concurrent_transactions, "partly": ErrorCode.none}[how]
    zero = datetime.timedelta(0)
    if kind == "init":
        _, pid, epoch = producer
        body = m.InitProducerIdResponse(throttle_time=zero, error_code=code, producer_id=i64(pid + 10),
                                        producer_epoch=i16(epoch + 1))
    elif kind == "add":
        def partition_code(i: int) -> ErrorCode:
            if how != "partly":
                return code
            return ErrorCode.topic_authorization_failed if i == 0 else ErrorCode.operation_not_attempted
        results, i = [], 0
        for t, ps in _by_topic(parts).items():
            rows = []
            for p in ps:
                rows.append(m.AddPartitionsToTxnPartitionResult(partition_index=i32(p),
                                                                partition_error_code=partition_code(i)))
                i += 1
            results.append(m.AddPartitionsToTxnTopicResult(name=t, results_by_partition=tuple(rows)))
        body = m.AddPartitionsToTxnResponse(throttle_time=zero, results_by_topic_v3_and_below=tuple(results))
    elif kind == "offsets":
        body = m.AddOffsetsToTxnResponse(throttle_time=zero, error_code=code)
    else:
        body = m.EndTxnResponse(throttle_time=zero, error_code=code)
    return schemas.encode(schemas.response_header_for(key, VERSION, correlation_id), body)


def _rules(native: bool, hold: bool, absorb: bool) -> TransactionRules:
    rules = TransactionRules(NativeRegistry(), policy_from_config({}), concurrent=ConcurrentRetry(enabled=absorb),
                             in_doubt=NativeEndTxnLedger(InDoubtLimits(enabled=hold)))
    if not native:
        rules._native_state = lambda: False  # type: ignore[method-assign]
    return rules


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def wall_ms(self) -> int:
        return self.ms


def _seen(observed: Any) -> Any:
    """What a request is seen as, comparable across the two ledgers: a NamedTuple as it is, a token by fields."""
    if observed is None or isinstance(observed, tuple):
        return observed
    return ("token", observed.transactional_id, observed.producer_id, observed.producer_epoch, observed.committed,
            observed.connection_id, observed.sent_ms)


def _state(rules: TransactionRules) -> Any:
    records = {}
    for txn in IDS:
        record = rules.registry.get(txn)
        records[txn] = None if record is None else dict(vars(record))
    ledger = rules.in_doubt
    assert ledger is not None
    open_ = {txn: [_seen(s) for s in ledger.in_doubt(txn)] for txn in IDS}
    return records, len(ledger), dict(ledger.endings), open_


request_step = st.tuples(st.just("request"), st.sampled_from(list(KEYS)), st.sampled_from(PRODUCERS),
                         st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3, unique=True), st.booleans(),
                         st.integers(1, 3), st.sampled_from([0, 1, 50, 5_000]))
answer_step = st.tuples(st.just("answer"), st.integers(0, 20), st.sampled_from(["ok", "ok", "error", "concurrent",
                                                                                  "partly"]),
                        st.sampled_from([0, 1, 50, 5_000]))
history = st.lists(st.one_of(request_step, request_step, answer_step), min_size=1, max_size=30)


@settings(max_examples=1500, deadline=None)
@given(history, st.booleans(), st.booleans())
@example([("request", "end", ("a", 1, 0), [("t", 0)], True, 1, 0),
          ("request", "add", ("a", 1, 0), [("t", 0)], True, 2, 1),     # another connection: held by the EndTxn
          ("answer", 0, "ok", 1), ("request", "add", ("a", 1, 0), [("t", 0)], True, 2, 1)], True, True)
@example([("request", "add", ("a", 1, 0), [("t", 0), ("t", 1)], True, 1, 0),
          ("answer", 0, "concurrent", 1),                                 # refused whole: the general path's
          ("request", "init", ("a", 1, 0), [("t", 0)], True, 1, 0), ("answer", 1, "ok", 1)], True, True)
def test_native_life_cycle_rules_observe_as_the_python_rules(steps: list[Any], hold: bool, absorb: bool) -> None:
    native, python = _rules(True, hold, absorb), _rules(False, hold, absorb)
    clock = _Clock()
    # Requests awaiting their answers: (kind, producer, partitions, correlation id, whether its bytes were kept to
    # ask again, what each set of rules saw it as)
    sent: list[tuple[str, tuple[str, int, int], list[tuple[str, int]], int, bool, Any, Any]] = []
    correlation_id = 0
    for step in steps:
        if step[0] == "request":
            _, kind, producer, parts, committed, connection_id, later = step
            clock.ms += later
            correlation_id += 1
            frame = request_frame(kind, producer, parts, committed, correlation_id)
            head = RequestHead(KEYS[kind], VERSION, correlation_id)
            answers = [rules.observe_request_in_place(head, frame, 4, len(frame), clock, connection_id)
                       for rules in (native, python)]
            native_answer, python_answer = (a if a is None else (_seen(a[0]), a[1]) for a in answers)
            assert native_answer == python_answer, step
            event(f"{kind} request: {'general path' if answers[0] is None else 'observed in place'}")
            if answers[0] is not None:  # forwarded on the fast path: its answer comes later
                sent.append((kind, producer, parts, correlation_id, answers[0][1], answers[0][0], answers[1][0]))
        elif sent:
            _, which, how, later = step
            clock.ms += later
            kind, producer, parts, cid, kept, seen_native, seen_python = sent.pop(which % len(sent))
            frame = answer_frame(kind, how, parts, producer, cid)
            passed = [rules.observe_response_in_place(KEYS[kind], VERSION, seen, frame, 4, len(frame), clock.ms,
                                                      absorbable=kept)  # as the relay asks: bytes kept
                      for rules, seen in ((native, seen_native), (python, seen_python))]
            assert passed[0] == passed[1], step
            event(f"{kind} answer {how}: {'passes' if passed[0] else 'general path'}")
        assert _state(native) == _state(python), step

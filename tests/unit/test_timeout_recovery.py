"""KIP-588 for old clients: a coordinator-side timeout answered so the client bumps, a real fence never hidden.

Each test reads as the exchange: what the client sends, what the coordinator says
(DescribeTransactions), what the proxy does.
"""

from __future__ import annotations

import datetime
import sys

import pytest
from connection_playbook import FakeClock, request
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.types import ProducerId, TransactionalId
from kio.static.primitive import i16

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.policies.families import AIOKAFKA, JAVA, KAFKA_PYTHON, LIBRDKAFKA, SARAMA
from txnguard.policies.policy import PolicyError, policy_from_config
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import DescribeTransaction, ProduceWrite, TransactionDescription
from txnguard.verification.decisions import Decision, PendingCheck, TransactionRules
from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.timeouts import START_SKEW_MS, Candidate, end_txn_reply, timed_out

PID, E, TIMEOUT_MS = 4000, 3, 3000
T0 = 1_000_000  # wall ms when the proxy saw the first add accepted


def _desc(state: str = "CompleteAbort", epoch: int = E + 1, pid: int = PID, start: int = T0 - 5,
          error: int = 0) -> DescribedTransaction:
    return DescribedTransaction(error, "app", state, TIMEOUT_MS, start, pid, epoch, frozenset())


CANDIDATE = Candidate(PID, E, T0)


# -- the coordinator's answer: a timeout of our transaction, or anything else ---------------------------------

@pytest.mark.parametrize("state", ["PrepareEpochFence", "PrepareAbort", "CompleteAbort"])
def test_our_transaction_aborted_at_the_next_epoch_is_a_timeout(state):
    assert timed_out(_desc(state=state), CANDIDATE) is not None


@pytest.mark.parametrize(
    "desc",
    [
        _desc(state="Empty"),                    # someone's InitProducerId was answered E+1: they hold it
        _desc(state="Ongoing"),                  # a new producer at E+1 is in a transaction
        _desc(state="CompleteCommit"),           # ... and committed one
        _desc(epoch=E + 2),                      # fenced, and the new producer got E+2 (a real zombie fence)
        _desc(state="Empty", epoch=E + 2),
        _desc(state="CompleteAbort", epoch=E + 2),  # the new producer aborted its own transaction
        _desc(start=T0 + START_SKEW_MS + 1),     # an abort of a transaction that began after ours
        _desc(start=-1),
        _desc(pid=PID + 1),                      # a new producer id
        _desc(state="Ongoing", epoch=E),         # not aborted at all: the client's request is right
        _desc(error=ErrorCode.not_coordinator),
        None,                                    # no answer
    ],
    ids=["empty", "ongoing", "committed", "fenced-e2", "empty-e2", "aborted-e2", "later-start", "no-start",
         "other-pid", "still-ours", "not-coordinator", "no-answer"],
)
def test_a_real_fence_or_anything_else_is_never_taken_for_a_timeout(desc):
    assert timed_out(desc, CANDIDATE) is None


def test_the_family_table():
    assert end_txn_reply(JAVA, committed=True).code == ErrorCode.invalid_producer_id_mapping
    assert end_txn_reply(JAVA, committed=False).code == ErrorCode.none
    assert end_txn_reply(LIBRDKAFKA, committed=True).code == ErrorCode.unknown_producer_id
    assert end_txn_reply(LIBRDKAFKA, committed=False).code == ErrorCode.unknown_producer_id
    assert end_txn_reply(SARAMA, committed=True).code == ErrorCode.unknown_producer_id
    assert end_txn_reply(SARAMA, committed=False).code == ErrorCode.none
    for family in (KAFKA_PYTHON, AIOKAFKA, "unknown"):
        assert end_txn_reply(family, committed=True) is None
        assert end_txn_reply(family, committed=False) is None


# -- what the registry saw -------------------------------------------------------------------------------------

def _registry(ttl: int | None = None) -> Registry:
    r = Registry(RegistryLimits(evidence_ttl_ms=ttl))
    r.init_producer_id("app", PID, E, TIMEOUT_MS, T0 - 100)
    r.added("app", PID, E, T0, partitions=[("orders", 0)])
    return r


def test_a_candidate_is_an_ongoing_transaction_past_its_timeout():
    r = _registry()
    assert r.timeout_candidate("app", PID, E, T0 + 1000) is None  # not yet due
    assert r.timeout_candidate("app", PID, E, T0 + TIMEOUT_MS) == CANDIDATE
    assert r.timeout_candidate("app", PID, E - 1, T0 + TIMEOUT_MS) is None
    assert r.timeout_candidate("app", PID + 1, E, T0 + TIMEOUT_MS) is None
    r.expire(T0 + TIMEOUT_MS + 1)  # the registry ends it itself: still a candidate
    assert r.timeout_candidate("app", PID, E, T0 + TIMEOUT_MS + 2) == CANDIDATE


def test_no_candidate_after_an_end_txn_the_proxy_forwarded():
    r = _registry()
    r.end_txn("app", PID, E, T0 + 10)
    assert r.timeout_candidate("app", PID, E, T0 + TIMEOUT_MS * 2) is None


def test_no_candidate_without_the_whole_life_cycle():
    # A sidecar's registry (evidence with a TTL) may miss the client's EndTxn: never a candidate.
    assert _registry(ttl=0).timeout_candidate("app", PID, E, T0 + TIMEOUT_MS) is None


# -- the exchange, through the rules -----------------------------------------------------------------------------

def _rules(recovery: bool = True, mode: str = "enforce") -> TransactionRules:
    rules = TransactionRules(_registry(), policy_from_config({"timeout_recovery": recovery, "mode": mode}))
    return rules


def _client(family: str) -> ClientInfo:
    return ClientInfo("c", None, None, family, "bootstrap", 1)


def _end_txn(committed: bool, epoch: int = E) -> memoryview:
    return memoryview(request(EndTxnRequest(transactional_id=TransactionalId("app"), producer_id=ProducerId(PID),
                                            producer_epoch=i16(epoch), committed=committed), 11))


def _init(epoch: int = E) -> memoryview:
    return memoryview(request(InitProducerIdRequest(
        transactional_id=TransactionalId("app"), transaction_timeout=datetime.timedelta(milliseconds=TIMEOUT_MS),
        producer_id=ProducerId(PID), producer_epoch=i16(epoch)), 12))


def _due() -> FakeClock:
    return FakeClock((T0 + TIMEOUT_MS) / 1000)


def _asked(rules: TransactionRules, frame: memoryview, family: str, desc: DescribedTransaction | None) -> Decision:
    clock = _due()
    pending = rules.check_lifecycle(frame, 3 if len(frame) and frame[5] == 26 else 4, _client(family), clock)
    assert isinstance(pending, PendingCheck) and isinstance(pending.question, DescribeTransaction)
    decided = rules.resume(pending, TransactionDescription(desc), clock)
    assert isinstance(decided, Decision)
    return decided


def _error_of(decision: Decision) -> int:
    assert decision.forward is None and decision.local_response is not None
    _, body = schemas.decode_response(memoryview(decision.local_response)[4:], ApiKey.END_TXN, 3)
    return int(body.error_code)


def _epoch_sent(decision: Decision) -> int:
    assert decision.forward is not None
    _, req = schemas.decode_request(memoryview(decision.forward)[4:])
    return int(req.producer_epoch)


def test_java_commit_after_a_timeout_becomes_abortable_and_its_bump_claims_the_coordinators_epoch():
    rules = _rules()
    # client -> EndTxn(commit, E); coordinator: CompleteAbort at E+1 -> client gets INVALID_PRODUCER_ID_MAPPING
    commit = _asked(rules, _end_txn(True), JAVA, _desc())
    assert _error_of(commit) == ErrorCode.invalid_producer_id_mapping
    assert commit.records[0].decision == "timeout_recovered"
    # client -> InitProducerId(pid, E) (KIP-360 bump); the proxy sends it with E+1; the coordinator bumps to E+2
    bump = _asked(rules, _init(), JAVA, _desc())
    assert _epoch_sent(bump) == E + 1
    assert bump.observe is not None  # the answer (E+2) still goes into the registry


def test_java_abort_after_a_timeout_is_answered_and_the_bump_follows():
    rules = _rules()
    assert _error_of(_asked(rules, _end_txn(False), JAVA, _desc(state="PrepareAbort"))) == ErrorCode.none
    assert _epoch_sent(_asked(rules, _init(), JAVA, _desc())) == E + 1


def test_librdkafka_gets_unknown_producer_id_for_both():
    assert _error_of(_asked(_rules(), _end_txn(True), LIBRDKAFKA, _desc())) == ErrorCode.unknown_producer_id
    assert _error_of(_asked(_rules(), _end_txn(False), LIBRDKAFKA, _desc())) == ErrorCode.unknown_producer_id


@pytest.mark.parametrize("desc", [_desc(state="Empty", epoch=E + 2), _desc(state="Ongoing", epoch=E + 1),
                                  _desc(state="CompleteAbort", epoch=E + 2)], ids=["empty-e2", "ongoing-e1",
                                                                                   "aborted-e2"])
def test_a_second_producer_keeps_its_fence(desc):
    rules = _rules()
    end = _asked(rules, _end_txn(True), JAVA, desc)
    assert end.forward is not None and end.context is None  # forwarded untouched: the coordinator says FENCED
    bump = _asked(_rules(), _init(), JAVA, desc)
    assert _epoch_sent(bump) == E and bump.context is None


def test_a_family_without_an_abortable_end_txn_keeps_the_coordinators_answer():
    # kafka-python 3.0: every EndTxn error but the retriable ones is fatal. Its EndTxn is forwarded
    # (the coordinator answers PRODUCER_FENCED), and a forwarded EndTxn ends the evidence: no claim.
    rules = _rules()
    end = rules.check_lifecycle(_end_txn(True), 3, _client(KAFKA_PYTHON), _due())
    assert isinstance(end, Decision) and end.forward is not None
    init = rules.check_lifecycle(_init(), 4, _client(KAFKA_PYTHON), _due())
    assert isinstance(init, Decision) and _epoch_sent(init) == E


def test_kafka_pythons_own_bump_after_a_produce_error_is_claimed():
    # kafka-python 3.0 answers a Produce INVALID_PRODUCER_EPOCH with InitProducerId(pid, E), no EndTxn.
    assert _epoch_sent(_asked(_rules(), _init(), KAFKA_PYTHON, _desc())) == E + 1


def test_requests_of_a_transaction_not_due_pass_at_once():
    rules = _rules()
    early = FakeClock((T0 + 100) / 1000)
    init = rules.check_lifecycle(_init(), 4, _client(JAVA), early)
    assert isinstance(init, Decision) and _epoch_sent(init) == E and init.observe is not None
    end = rules.check_lifecycle(_end_txn(True), 3, _client(JAVA), early)
    assert isinstance(end, Decision) and end.forward is not None
    # ... and the forwarded EndTxn ended the transaction for the registry: no candidate afterwards.
    assert rules.registry.timeout_candidate("app", PID, E, T0 + TIMEOUT_MS * 2) is None


def test_off_by_default_and_in_monitor_mode():
    assert not TransactionRules(Registry(), policy_from_config({})).wants_lifecycle(ApiKey.END_TXN, 3)
    assert _rules().wants_lifecycle(ApiKey.END_TXN, 3) and _rules().wants_lifecycle(ApiKey.INIT_PRODUCER_ID, 3)
    assert not _rules().wants_lifecycle(ApiKey.INIT_PRODUCER_ID, 2)  # no producer id or epoch in InitProducerId v0-2
    assert not _rules().wants_lifecycle(ApiKey.END_TXN, 5)  # transaction version 2: the client bumps every transaction
    monitor = _rules(mode="monitor")
    end = monitor.check_lifecycle(_end_txn(True), 3, _client(JAVA), _due())
    assert isinstance(end, Decision) and end.forward is not None


def test_the_option_is_a_boolean():
    with pytest.raises(PolicyError, match="timeout_recovery"):
        policy_from_config({"timeout_recovery": "yes"})


def test_a_late_write_of_a_timed_out_transaction_makes_kafka_python_bump_by_itself():
    from txnguard.policies.enforcement import Enforcement
    from txnguard.verification.decisions import RequestContext
    from txnguard.verification.verdicts import Evidence, Outcome, Verdict

    late = Verdict(Outcome.LATE_WRITE, Evidence.LOCAL, "the registry ended it: past its timeout")

    def error_for(rules: TransactionRules, family: str, epoch: int = E) -> int | None:
        ctx = RequestContext(ProduceWrite(()), 9, "app", PID, epoch, Enforcement.ENFORCE, memoryview(b""), None, None,
                             _client(family))
        choice = rules._timed_out_write(ctx, late, _due())
        return None if choice is None else choice.code

    rules = _rules()
    rules.registry.expire(T0 + TIMEOUT_MS + 1)
    assert error_for(rules, KAFKA_PYTHON) == ErrorCode.invalid_producer_epoch
    assert error_for(rules, JAVA) is None  # its usual INVALID_TXN_STATE is abortable, with a bump
    assert error_for(rules, KAFKA_PYTHON, epoch=E + 1) is None
    off = _rules(recovery=False)
    off.registry.expire(T0 + TIMEOUT_MS + 1)
    assert error_for(off, KAFKA_PYTHON) is None


# -- the same exchange through the connection core (the wiring) ---------------------------------------------------

def test_through_the_core_the_end_txn_is_answered_and_the_bump_is_forwarded_at_the_coordinators_epoch():
    from connection_playbook import EPOCH, TXN, Like, Playbook, of_type, response, steps, to_broker, to_client
    from connection_playbook import PID as PB_PID

    from txnguard.connection.commands import (
        AnsweredLocally,
        Ask,
        Decided,
        PauseReading,
        ResumeReading,
        SendToBroker,
        SendToClient,
        Side,
    )

    pb = Playbook(policy={"timeout_recovery": True, "families": [{"family": "java", "client_id": "playbook-*"}]})
    pb.transaction_with(("orders", 0))           # ongoing at (PID, EPOCH), timeout 60 s
    started = pb.clock.wall_ms()
    pb.clock.seconds += 61                       # past its timeout by the proxy's clock
    aborted = DescribedTransaction(0, TXN, "CompleteAbort", 60_000, started - 3, PB_PID, EPOCH + 1, frozenset())

    def end_txn(committed: bool, cid: int) -> bytes:
        return request(EndTxnRequest(transactional_id=TransactionalId(TXN), producer_id=ProducerId(PB_PID),
                                     producer_epoch=i16(EPOCH), committed=committed), cid)

    # client -> EndTxn(commit): held while the coordinator is asked; nothing reaches the broker
    out = pb.client_sends(end_txn(True, 21))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    (ask,) = of_type(out, Ask)
    assert isinstance(ask.question, DescribeTransaction)
    out = pb.conn.answered(ask.check_id, TransactionDescription(aborted))
    assert steps(out) == [Like(Decided), AnsweredLocally(ApiKey.END_TXN, 3, 21, "verification"),
                          ResumeReading(Side.CLIENT, "verification"), Like(SendToClient)]
    _, body = schemas.decode_response(memoryview(to_client(out))[4:], ApiKey.END_TXN, 3)
    assert body.error_code == ErrorCode.invalid_producer_id_mapping and to_broker(out) == b""

    # client -> InitProducerId(PID, EPOCH): forwarded with EPOCH+1; the answer (EPOCH+2) reaches the registry
    bump = InitProducerIdRequest(transactional_id=TransactionalId(TXN), producer_id=ProducerId(PB_PID),
                                 transaction_timeout=datetime.timedelta(minutes=1), producer_epoch=i16(EPOCH))
    out = pb.client_sends(request(bump, 22))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    (ask,) = of_type(out, Ask)
    out = pb.conn.answered(ask.check_id, TransactionDescription(aborted))
    assert steps(out) == [Like(Decided), ResumeReading(Side.CLIENT, "verification"), Like(SendToBroker)]
    _, sent = schemas.decode_request(memoryview(to_broker(out))[4:])
    assert int(sent.producer_epoch) == EPOCH + 1 and int(sent.producer_id) == PB_PID
    m = sys.modules[schemas.response_schema(ApiKey.INIT_PRODUCER_ID, 4).__module__]
    answer = response(ApiKey.INIT_PRODUCER_ID, 4, 22, m.InitProducerIdResponse(throttle_time=datetime.timedelta(0),
                                                           error_code=ErrorCode.none, producer_id=ProducerId(PB_PID),
                                                           producer_epoch=i16(EPOCH + 2)))
    assert to_client(pb.broker_answers(answer)) == answer
    assert pb.registry.get(TXN).producer_epoch == EPOCH + 2


def test_through_the_core_a_fenced_producers_end_txn_reaches_the_coordinator_untouched():
    from connection_playbook import EPOCH, TXN, Like, Playbook, of_type, steps
    from connection_playbook import PID as PB_PID

    from txnguard.connection.commands import Ask, PauseReading, ResumeReading, SendToBroker, Side

    pb = Playbook(policy={"timeout_recovery": True, "families": [{"family": "java", "client_id": "playbook-*"}]})
    pb.transaction_with(("orders", 0))
    pb.clock.seconds += 61
    fenced = DescribedTransaction(0, TXN, "Empty", 60_000, -1, PB_PID, EPOCH + 2, frozenset())
    frame = request(EndTxnRequest(transactional_id=TransactionalId(TXN), producer_id=ProducerId(PB_PID),
                                  producer_epoch=i16(EPOCH), committed=True), 31)
    out = pb.client_sends(frame)
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    (ask,) = of_type(out, Ask)
    # no Decided: the coordinator's answer leaves nothing to judge, the EndTxn goes on as it is
    assert steps(pb.conn.answered(ask.check_id, TransactionDescription(fenced))) == [
        ResumeReading(Side.CLIENT, "verification"), SendToBroker([frame])]

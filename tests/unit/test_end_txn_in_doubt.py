"""The KAFKA-17754 defence as sequence diagrams: an EndTxn in doubt, the next transaction held behind it.

Two client connections of one proxy share the rules (and so the ledger of EndTxns in doubt), as the
Java client's first coordinator connection (which timed out) and its second (the retry, then T2) do.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from connection_playbook import (
    EPOCH,
    PID,
    T0,
    T1,
    TXN,
    FakeClock,
    FakeCluster,
    Like,
    add_partitions,
    add_partitions_response,
    heartbeat,
    heartbeat_response,
    init_producer_id,
    of_type,
    only,
    request,
    request_module,
    response,
    response_module,
    steps,
    to_client,
    track,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection.commands import (
    AnsweredLocally,
    Ask,
    Close,
    Command,
    Decided,
    PauseReading,
    ResumeReading,
    SendToBroker,
    SendToClient,
    Side,
)
from txnguard.connection.core import Connection, Settings
from txnguard.connection.traffic import make_traffic
from txnguard.policies.policy import policy_from_config
from txnguard.verification.checks import AwaitEndTxn, EndTxnSettled, EndTxnStillInDoubt
from txnguard.verification.decisions import TransactionRules
from txnguard.verification.in_doubt import Ending, EndTxnLedger, InDoubtLimits
from txnguard.verification.registry import Registry


def end_txn(correlation_id: int, committed: bool = True, epoch: int = EPOCH) -> bytes:
    m = request_module(ApiKey.END_TXN, 3)
    return request(m.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(epoch),
                                   committed=committed), correlation_id)


def end_txn_response(correlation_id: int, error: ErrorCode = ErrorCode.none) -> bytes:
    m = response_module(ApiKey.END_TXN, 3)
    return response(ApiKey.END_TXN, 3, correlation_id, m.EndTxnResponse(throttle_time=datetime.timedelta(0),
                                                                        error_code=error))


def add_offsets(correlation_id: int) -> bytes:
    m = request_module(ApiKey.ADD_OFFSETS_TO_TXN, 3)
    return request(m.AddOffsetsToTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                            group_id="g"), correlation_id)


def init_producer_id_response_epoch(correlation_id: int, epoch: int) -> bytes:
    m = response_module(ApiKey.INIT_PRODUCER_ID, 3)
    return response(ApiKey.INIT_PRODUCER_ID, 3, correlation_id, m.InitProducerIdResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, producer_id=i64(PID),
        producer_epoch=i16(epoch)))


class Proxy:
    """One proxy's rules and ledger, and its client connections (numbered from 1)."""

    def __init__(self, *, defence: bool = True, max_ms: int = 60_000, policy: dict[str, Any] | None = None) -> None:
        self.clock = FakeClock()
        self.ledger = EndTxnLedger(InDoubtLimits(max_ms=max_ms))
        self.rules = TransactionRules(Registry(), policy_from_config(policy or {}),
                                      in_doubt=self.ledger if defence else None)
        self.connections: list[Connection] = []

    def connection(self) -> Connection:
        conn = Connection(Settings(connection_id=len(self.connections) + 1, listener="broker-1",
                                   max_frame_bytes=100 << 20, pre_auth_max_frame_bytes=None, max_in_flight=100,
                                   partial_frame_timeout_s=30.0, idle_timeout_s=600.0),
                          self.rules, FakeCluster(), self.clock, make_traffic())
        track(conn)  # every command it emits must be asserted (connection_playbook.py)
        self.connections.append(conn)
        return conn


def sends(conn: Connection, *frames: bytes) -> list[Command]:
    return conn.receive_from_client(b"".join(frames))


def answers(conn: Connection, *frames: bytes) -> list[Command]:
    return conn.receive_from_broker(b"".join(frames))


def relays(conn: Connection, *frames: bytes) -> None:
    """The client sends `frames`; the core forwards them as they are and does nothing else."""
    assert only(sends(conn, *frames), SendToBroker) == b"".join(frames)


def delivers(conn: Connection, *frames: bytes) -> None:
    """The broker answers `frames`; the core passes them to the client as they are and does nothing else."""
    assert only(answers(conn, *frames), SendToClient) == b"".join(frames)


HELD = PauseReading(Side.CLIENT, "verification")
RELEASED = ResumeReading(Side.CLIENT, "verification")


def decode(frame: bytes, api_key: int, version: int = 3) -> Any:
    return schemas.decode_response(frame[4:], api_key, version)[1]


# -- the normal path costs nothing ---------------------------------------------------------------------------------


def test_an_answered_end_txn_leaves_the_next_transaction_alone():
    proxy = Proxy()
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1))
    delivers(first, end_txn_response(1))
    assert len(proxy.ledger) == 0
    relays(second, add_partitions(2, [T0, T1]))  # no Ask


def test_the_end_txns_own_connection_is_not_held_the_broker_answers_it_in_order():
    proxy = Proxy()
    conn = proxy.connection()
    relays(conn, end_txn(1), add_partitions(2, [T0]))  # no Ask


def test_an_end_txn_checked_for_coordinator_timeouts_is_in_doubt_the_same_way():
    proxy = Proxy(policy={"timeout_recovery": True})      # EndTxn goes through check_lifecycle
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1))
    assert steps(sends(second, add_partitions(2, [T0]))) == [HELD, Like(Ask)]
    delivers(first, end_txn_response(1))
    assert len(proxy.ledger) == 0


# -- the hold ----------------------------------------------------------------------------------------------------------


def test_a_new_transaction_waits_for_the_unanswered_end_txn_and_goes_once_it_is_answered():
    proxy = Proxy()
    timed_out, retry = proxy.connection(), proxy.connection()
    relays(timed_out, end_txn(1))                           # T1's EndTxn(COMMIT), unanswered
    relays(retry, end_txn(1))                               # the client's retry is not held
    delivers(retry, end_txn_response(1))                    # T1 committed by the retry
    out = sends(retry, add_partitions(2, [T0, T1]), heartbeat(3))   # T2 begins
    assert steps(out) == [HELD, Like(Ask)]
    [ask] = of_type(out, Ask)
    assert isinstance(ask.question, AwaitEndTxn) and ask.question.connection_id == 2
    assert ask.question.hold_ms == 1_000                    # then CONCURRENT_TRANSACTIONS, held again on retry
    delivers(timed_out, end_txn_response(1))                # the late EndTxn landed (in T1: a retry)
    assert proxy.ledger.blocking(TXN, PID, EPOCH, 2, proxy.clock.wall_ms()) is None
    out = retry.answered(ask.check_id, EndTxnSettled())
    assert steps(out) == [Like(Decided), RELEASED,
                          SendToBroker([add_partitions(2, [T0, T1]) + heartbeat(3)])]   # in the client's order
    [decided] = of_type(out, Decided)
    assert decided.decision.context.api == "AddPartitionsToTxn" and decided.decision.forward is not None
    # The registry still learns T2's partitions from the forwarded request's answer.
    delivers(retry, add_partitions_response(2, [T0, T1]), heartbeat_response(3))
    assert proxy.rules.registry.get(TXN).partitions == {T0, T1}


def test_at_the_bound_the_held_request_is_answered_concurrent_transactions():
    proxy = Proxy()
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1))
    out = sends(second, add_partitions(2, [T0, T1]))
    assert steps(out) == [HELD, Like(Ask)]
    [ask] = of_type(out, Ask)
    out = second.answered(ask.check_id, EndTxnStillInDoubt())
    assert steps(out) == [Like(Decided), AnsweredLocally(ApiKey.ADD_PARTITIONS_TO_TXN, 3, 2, "end_txn_in_doubt"),
                          RELEASED, Like(SendToClient)]
    body = decode(to_client(out), ApiKey.ADD_PARTITIONS_TO_TXN)
    assert {(str(t.name), int(p.partition_index), p.partition_error_code)
            for t in body.results_by_topic_v3_and_below for p in t.results_by_partition} == {
        ("orders", 0, ErrorCode.concurrent_transactions), ("orders", 1, ErrorCode.concurrent_transactions)}


def test_add_offsets_to_txn_is_held_too():
    proxy = Proxy()
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1, committed=False))
    out = sends(second, add_offsets(2))
    assert steps(out) == [HELD, Like(Ask)]
    [ask] = of_type(out, Ask)
    out = second.answered(ask.check_id, EndTxnStillInDoubt())
    assert steps(out) == [Like(Decided), AnsweredLocally(ApiKey.ADD_OFFSETS_TO_TXN, 3, 2, "end_txn_in_doubt"),
                          RELEASED, Like(SendToClient)]
    assert decode(to_client(out), ApiKey.ADD_OFFSETS_TO_TXN).error_code == ErrorCode.concurrent_transactions


def test_another_producer_epoch_is_not_held():
    proxy = Proxy()
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1, epoch=EPOCH + 1))              # an EndTxn the coordinator fences or is fenced by
    relays(second, add_partitions(2, [T0]))                 # no Ask


def test_with_the_defence_off_nothing_is_held_and_a_leaving_client_closes_at_once():
    proxy = Proxy(defence=False)
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1))
    relays(second, add_partitions(2, [T0]))                 # no Ask
    [close] = first.client_gone().see(Close)
    assert close.reason == "client_closed"


# -- a client that leaves with its EndTxn unanswered ---------------------------------------------------------


@pytest.mark.parametrize("read", ["the first", "a later"])
def test_a_client_that_leaves_with_an_end_txn_unanswered_leaves_the_broker_side_until_the_answer(read: str) -> None:
    # The first read of a connection takes the general path (it names the client); a later one the fast path,
    # which books the EndTxn in the native book.
    proxy = Proxy()
    conn = proxy.connection()
    if read == "a later":
        relays(conn, heartbeat(0))
        delivers(conn, heartbeat_response(0))
    relays(conn, heartbeat(1), end_txn(2))
    assert conn.client_gone() == [] and conn.lingering      # no Close: the broker may still process it
    delivers(conn, heartbeat_response(1))                   # no Close yet: the EndTxn is still to come
    out = answers(conn, end_txn_response(2))
    assert steps(out) == [SendToClient([end_txn_response(2)]), Like(Close)]
    [close] = of_type(out, Close)
    assert close.reason == "client_closed" and "answered" in close.detail
    assert len(proxy.ledger) == 0 and proxy.ledger.endings[Ending.ANSWERED] == 1


def test_a_client_that_leaves_with_nothing_in_doubt_closes_at_once():
    proxy = Proxy()
    conn = proxy.connection()
    relays(conn, end_txn(1))
    delivers(conn, end_txn_response(1))
    [close] = conn.client_gone().see(Close)
    assert close.reason == "client_closed" and not conn.lingering


def test_an_end_txn_whose_connection_closed_unanswered_stays_in_doubt_until_the_producer_moves_on():
    proxy = Proxy()
    lost, other = proxy.connection(), proxy.connection()
    relays(lost, end_txn(1))
    lost.connection_lost()                                  # the broker went away: no answer will be seen
    [s] = proxy.ledger.in_doubt(TXN)
    assert s.orphaned_ms is not None
    assert steps(sends(other, add_partitions(2, [T0]))) == [HELD, Like(Ask)]
    # A new epoch (InitProducerId answered) fences the old EndTxn: it can only be refused now.
    third = proxy.connection()
    relays(third, init_producer_id(1))
    delivers(third, init_producer_id_response_epoch(1, EPOCH + 1))
    assert proxy.ledger.in_doubt(TXN) == [] and proxy.ledger.endings[Ending.FENCED] == 1


def test_an_orphaned_end_txn_ends_once_a_later_end_txn_of_the_producer_is_answered():
    proxy = Proxy()
    lost, retry, t2 = proxy.connection(), proxy.connection(), proxy.connection()
    relays(lost, end_txn(1))
    lost.connection_lost()        # closed: the broker read it (and handles it first) or never will
    relays(retry, end_txn(1))     # the client's retry, sent after the close
    assert steps(sends(t2, add_partitions(2, [T0]))) == [HELD, Like(Ask)]  # not yet: the retry is unanswered
    delivers(retry, end_txn_response(1))
    assert proxy.ledger.in_doubt(TXN) == [] and proxy.ledger.endings[Ending.CLOSED] == 1
    relays(proxy.connection(), add_partitions(3, [T0]))     # no Ask


def test_a_live_connection_keeps_its_end_txn_in_doubt_whatever_answers_elsewhere():
    proxy = Proxy()
    slow, retry = proxy.connection(), proxy.connection()
    relays(slow, end_txn(1))      # still on an open connection: it can still arrive (the J3 case)
    relays(retry, end_txn(1))
    delivers(retry, end_txn_response(1))
    assert len(proxy.ledger.in_doubt(TXN)) == 1


def test_an_end_txn_unanswered_past_the_bound_is_given_up_and_said_so():
    proxy = Proxy(max_ms=5_000)
    first, second = proxy.connection(), proxy.connection()
    relays(first, end_txn(1))
    proxy.clock.seconds += 5
    relays(second, add_partitions(2, [T0]))                 # no Ask: no longer held for
    [gone] = proxy.ledger.expire(proxy.clock.wall_ms())
    assert gone.transactional_id == TXN and proxy.ledger.endings[Ending.EXPIRED] == 1

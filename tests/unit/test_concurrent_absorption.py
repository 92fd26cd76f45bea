"""CONCURRENT_TRANSACTIONS absorbed by the connection core (the KIP-609 idea), as sequence diagrams.

The coordinator refuses the next transaction's first AddPartitionsToTxn/AddOffsetsToTxn
while it still writes the previous one's markers. The core asks again itself, after a
short pause, with the request's own bytes, and the client sees one answer: the last.
"""

from __future__ import annotations

from connection_playbook import (
    T0,
    T1,
    TXN,
    Like,
    Playbook,
    add_offsets,
    add_offsets_response,
    add_partitions,
    add_partitions_response,
    correlation_ids,
    heartbeat,
    heartbeat_response,
    of_type,
    produce,
    steps,
    to_broker,
    to_client,
)
from kio.schema.errors import ErrorCode

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection.commands import (
    ConcurrentAbsorbed,
    PauseReading,
    ResumeReading,
    SendToBroker,
    SendToClient,
    Side,
    StartTimer,
)
from txnguard.verification.concurrent import NO_ABSORPTION, ConcurrentRetry

BUSY = ErrorCode.concurrent_transactions


def partition_errors(frame: bytes) -> dict[tuple[str, int], int]:
    _, body = schemas.decode_response(frame[4:], ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    return {(str(t.name), int(p.partition_index)): int(p.partition_error_code)
            for t in body.results_by_topic_v3_and_below for p in t.results_by_partition}


def test_the_client_sees_one_success_where_the_coordinator_first_said_concurrent_transactions():
    pb = Playbook()
    request = add_partitions(2, [T0])
    assert to_broker(pb.client_sends(request)) == request
    # broker -> proxy: CONCURRENT_TRANSACTIONS (markers of the previous transaction still being written)
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), StartTimer(1, 0.002, "app")]
    [timer] = of_type(out, StartTimer)
    # the pause runs out: the same bytes go to the coordinator again
    pb.clock.seconds += timer.delay_s
    assert to_broker(pb.conn.timer_fired(timer.token)) == request
    # broker -> proxy: added; proxy -> client: that answer, once
    out = pb.broker_answers(add_partitions_response(2, [T0]))
    assert steps(out) == [Like(ConcurrentAbsorbed), ResumeReading(Side.CLIENT, "concurrent_transactions"),
                          Like(SendToClient)]
    assert partition_errors(to_client(out)) == {T0: 0}
    [absorbed] = of_type(out, ConcurrentAbsorbed)
    assert (absorbed.ending, absorbed.retries, round(absorbed.waited_ms, 3)) == ("absorbed", 1, 2.0)
    assert [r.cause for r in of_type(out, ResumeReading)] == ["concurrent_transactions"]
    # and the registry learned the partition from the answer that counted
    assert steps(pb.client_sends(produce(3, [T0]))) == [SendToBroker([produce(3, [T0])])]  # no Ask


def test_requests_behind_an_absorbed_one_wait_and_every_answer_leaves_in_the_clients_order():
    pb = Playbook()
    pb.relays(add_partitions(2, [T0]), heartbeat(3))  # both out before the refusal comes
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY), heartbeat_response(3))
    # heartbeat 3's answer waits behind request 2
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer)]
    [timer] = of_type(out, StartTimer)
    assert to_broker(pb.client_sends(heartbeat(4))) == b""   # held: it must follow request 2's answer
    pb.clock.seconds += timer.delay_s
    assert to_broker(pb.conn.timer_fired(timer.token)) == add_partitions(2, [T0])
    out = pb.broker_answers(add_partitions_response(2, [T0]))
    assert steps(out) == [Like(ConcurrentAbsorbed, ending="absorbed"),
                          ResumeReading(Side.CLIENT, "concurrent_transactions"), Like(SendToClient),
                          SendToBroker([heartbeat(4)])]  # released after the answers above
    assert correlation_ids(to_client(out)) == [2, 3]
    assert correlation_ids(to_client(pb.broker_answers(heartbeat_response(4)))) == [4]


def test_once_the_budget_is_spent_the_client_gets_concurrent_transactions_as_the_coordinator_said_it():
    pb = Playbook(concurrent=ConcurrentRetry(budget_ms=31, backoff_ms=2, backoff_max_ms=20))
    pb.relays(add_partitions(2, [T0]))
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert of_type(out, PauseReading) == [PauseReading(Side.CLIENT, "concurrent_transactions")]
    delays = []
    while not to_client(out):
        [timer] = of_type(out, StartTimer)
        delays.append(timer.delay_s * 1000)
        pb.clock.seconds += timer.delay_s
        assert to_broker(pb.conn.timer_fired(timer.token)) == add_partitions(2, [T0])
        out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert delays == [2, 4, 8, 16]                   # 31 ms would be passed by the next 20 ms pause
    assert steps(out) == [Like(ConcurrentAbsorbed), ResumeReading(Side.CLIENT, "concurrent_transactions"),
                          Like(SendToClient)]
    assert partition_errors(to_client(out)) == {T0: BUSY}
    [spent] = of_type(out, ConcurrentAbsorbed)
    assert (spent.ending, spent.retries) == ("budget_spent", 4)


def test_switched_off_the_refusal_goes_straight_to_the_client():
    pb = Playbook(concurrent=NO_ABSORPTION)
    pb.relays(add_partitions(2, [T0]))
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert partition_errors(to_client(out)) == {T0: BUSY}
    assert of_type(out, StartTimer) == [] and of_type(out, ConcurrentAbsorbed) == []


def test_a_mixed_answer_is_not_a_busy_coordinator_and_passes_untouched():
    pb = Playbook()
    pb.relays(add_partitions(2, [T0, T1]))
    answer = add_partitions_response(2, [T0, T1], errors={T0: BUSY, T1: ErrorCode.topic_authorization_failed})
    out = pb.broker_answers(answer)
    assert to_client(out) == answer and of_type(out, StartTimer) == []


def test_add_offsets_to_txn_is_absorbed_too():
    pb = Playbook()
    pb.relays(add_offsets(2))
    out = pb.broker_answers(add_offsets_response(2, BUSY))
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer)]
    [timer] = of_type(out, StartTimer)
    assert to_broker(pb.conn.timer_fired(timer.token)) == add_offsets(2)
    out = pb.broker_answers(add_offsets_response(2))
    assert steps(out) == [Like(ConcurrentAbsorbed, ending="absorbed"),
                          ResumeReading(Side.CLIENT, "concurrent_transactions"),
                          SendToClient([add_offsets_response(2)])]
    assert pb.registry.get(TXN) is not None and "g" in pb.registry.get(TXN).groups  # type: ignore[union-attr]


def test_a_close_while_waiting_to_ask_again_sends_nothing_when_the_timer_fires():
    pb = Playbook()
    pb.relays(add_partitions(2, [T0]))
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer)]
    [timer] = of_type(out, StartTimer)
    pb.conn.connection_lost()
    assert pb.conn.timer_fired(timer.token) == []


def test_a_stale_timer_does_nothing():
    pb = Playbook()
    pb.relays(add_partitions(2, [T0]))
    out = pb.broker_answers(add_partitions_response(2, [T0], error=BUSY))
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer)]
    [timer] = of_type(out, StartTimer)
    assert steps(pb.conn.timer_fired(timer.token)) == [SendToBroker([add_partitions(2, [T0])])]
    assert pb.conn.timer_fired(timer.token) == []    # already asked again for this pause


def test_the_pause_doubles_up_to_its_cap_and_stops_at_the_budget():
    limits = ConcurrentRetry(budget_ms=100, backoff_ms=2, backoff_max_ms=20)
    waited, delays = 0.0, []
    while (d := limits.delay_ms(len(delays), waited)) is not None:
        delays.append(d)
        waited += d
    assert delays == [2, 4, 8, 16, 20, 20, 20]
    assert NO_ABSORPTION.delay_ms(0, 0) is None


def test_two_refused_requests_in_flight_both_get_an_answer():
    """librdkafka sends AddOffsetsToTxn and AddPartitionsToTxn back to back; right after a commit both
    come back CONCURRENT_TRANSACTIONS. Found by the sidecar bounce (bench/proxy_bounce.py): the second
    was never asked again nor answered, and the client's request timed out after 60 s.

        client ─AddOffsets 2, AddPartitions 3─▶ proxy ─▶ coordinator
                 ◀─ 51 (2), 51 (3) ─  2 is asked again after a pause; 3 goes back as the coordinator
                                      said it (the client retries it), after 2's answer"""
    pb = Playbook()
    pb.relays(add_offsets(2), add_partitions(3, [T0]))
    out = pb.broker_answers(add_offsets_response(2, error=BUSY), add_partitions_response(3, [T0], error=BUSY))
    # 3's answer waits behind request 2; its 51 is counted
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer),
                          Like(ConcurrentAbsorbed, ending="behind_another")]
    [timer] = of_type(out, StartTimer)
    pb.clock.seconds += timer.delay_s
    assert to_broker(pb.conn.timer_fired(timer.token)) == add_offsets(2)
    out = pb.broker_answers(add_offsets_response(2))
    assert steps(out) == [Like(ConcurrentAbsorbed, ending="absorbed"),
                          ResumeReading(Side.CLIENT, "concurrent_transactions"), Like(SendToClient)]
    assert correlation_ids(to_client(out)) == [2, 3]
    assert partition_errors(to_client(out)[len(add_offsets_response(2)):]) == {T0: BUSY}
    assert [a.ending for a in of_type(out, ConcurrentAbsorbed)] == ["absorbed"]

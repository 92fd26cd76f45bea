"""The connection's mode table (connection/modes.py): every legal transition, and every other pair refused.

The legal transitions are spelled out here once more, as a reader would draw them, so that a change to
the table is a change to this test too.
"""

from __future__ import annotations

import itertools

import pytest
from connection_playbook import (
    T0,
    T1,
    Like,
    Playbook,
    add_partitions,
    add_partitions_response,
    heartbeat,
    heartbeat_response,
    produce,
    produce_response,
    sasl_handshake,
    sasl_handshake_response,
    steps,
)
from kio.schema.errors import ErrorCode

from txnguard.connection.commands import (
    Ask,
    Close,
    ConcurrentAbsorbed,
    Decided,
    PauseReading,
    RawMode,
    ResumeReading,
    SendToBroker,
    SendToClient,
    Side,
    StartTimer,
)
from txnguard.connection.modes import TRANSITIONS, Event, Mode, ModeError, next_mode
from txnguard.verification.checks import PartitionVerdicts
from txnguard.verification.verdicts import Evidence, passed

R, H, P, W, D, L, C = (Mode.RELAY, Mode.HOLDING, Mode.RAW_PENDING, Mode.RAW, Mode.DRAINING, Mode.LINGERING,
                       Mode.CLOSED)

LEGAL: dict[Mode, dict[Event, Mode]] = {
    R: {Event.HOLD: H, Event.SASL_V0: P, Event.DRAIN: D, Event.CLIENT_GONE: L, Event.CLOSE: C},
    H: {Event.HOLD: H, Event.RELEASE: R, Event.SASL_V0: P, Event.DRAIN: D, Event.CLIENT_GONE: L, Event.CLOSE: C},
    P: {Event.HOLD: P, Event.RELEASE: P, Event.SASL_V0: P, Event.FLUSHED: W, Event.DRAIN: D, Event.CLIENT_GONE: L,
        Event.CLOSE: C},
    W: {Event.DRAIN: D, Event.CLOSE: C},
    D: {Event.HOLD: D, Event.RELEASE: D, Event.SASL_V0: D, Event.DRAIN: D, Event.CLIENT_GONE: L, Event.CLOSE: C},
    L: {Event.HOLD: L, Event.RELEASE: L, Event.SASL_V0: L, Event.DRAIN: L, Event.CLOSE: C},
    C: {},
}
EXPECTED = {(mode, event): to for mode, row in LEGAL.items() for event, to in row.items()}
ILLEGAL = [pair for pair in itertools.product(Mode, Event) if pair not in EXPECTED]


def test_the_table_is_exactly_the_drawn_one():
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("mode", "event"), list(EXPECTED), ids=lambda v: v.value)
def test_every_legal_transition_leads_where_drawn(mode: Mode, event: Event):
    assert next_mode(mode, event) is EXPECTED[mode, event]


@pytest.mark.parametrize(("mode", "event"), ILLEGAL, ids=lambda v: v.value)
def test_every_other_pair_raises_an_error_that_names_mode_and_event(mode: Mode, event: Event):
    with pytest.raises(ModeError, match=f"from mode {mode.value} on event {event.value}$") as raised:
        next_mode(mode, event)
    assert (raised.value.mode, raised.value.event) == (mode, event)


def test_closed_is_final_and_every_other_mode_can_close():
    assert all(next_mode(mode, Event.CLOSE) is C for mode in Mode if mode is not C)
    assert not [pair for pair in TRANSITIONS if pair[0] is C]


def test_only_a_hold_leaves_relay_for_holding_and_only_the_last_release_comes_back():
    assert [pair for pair, to in TRANSITIONS.items() if to is H] == [(R, Event.HOLD), (H, Event.HOLD)]
    assert [pair for pair, to in TRANSITIONS.items() if to is R] == [(H, Event.RELEASE)]


def test_the_byte_pipe_is_reached_only_through_raw_pending_and_reads_no_frames():
    assert [pair for pair, to in TRANSITIONS.items() if to is W] == [(P, Event.FLUSHED)]
    assert {event for (mode, event) in TRANSITIONS if mode is W} == {Event.DRAIN, Event.CLOSE}


# -- the modes the core goes through, as sequence diagrams ----------------------------------------------------


def test_a_verification_and_an_absorption_hold_together_and_relay_resumes_after_the_last():
    pb = Playbook()
    pb.relays(add_partitions(1, [T0]))
    out = pb.client_sends(produce(2, [T1]), heartbeat(3))   # T1 has no evidence: a verification holds
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask, check_id=1)]
    assert pb.conn.mode is H
    out = pb.broker_answers(add_partitions_response(1, [T0], error=ErrorCode.concurrent_transactions))
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), StartTimer(2, 0.002, "app")]
    out = pb.conn.answered(1, PartitionVerdicts({T1: passed(Evidence.COORDINATOR)}))
    assert steps(out) == [Like(Decided), ResumeReading(Side.CLIENT, "verification"), SendToBroker([produce(2, [T1])])]
    assert pb.conn.mode is H                          # heartbeat 3 still waits behind the absorption
    assert steps(pb.conn.timer_fired(2)) == [SendToBroker([add_partitions(1, [T0])])]
    # The broker answers in the order it was sent: Produce 2, then AddPartitionsToTxn 1 asked again.
    assert steps(pb.broker_answers(produce_response(2, [T1]))) == []  # it waits behind request 1's answer
    out = pb.broker_answers(add_partitions_response(1, [T0]))
    assert steps(out) == [Like(ConcurrentAbsorbed, ending="absorbed"),
                          ResumeReading(Side.CLIENT, "concurrent_transactions"),
                          SendToClient([add_partitions_response(1, [T0]) + produce_response(2, [T1])]),
                          SendToBroker([heartbeat(3)])]
    assert pb.conn.mode is R


def test_a_sasl_v0_handshake_goes_raw_once_the_response_before_it_is_out():
    pb = Playbook(pre_auth_max_frame_bytes=512 * 1024)
    pb.relays(heartbeat(1), sasl_handshake(2, version=0))
    pb.delivers(heartbeat_response(1))
    assert pb.conn.mode is R
    out = pb.broker_answers(sasl_handshake_response(2, version=0))
    assert steps(out) == [SendToClient([sasl_handshake_response(2, version=0)]), RawMode("sasl_handshake_v0")]
    assert pb.conn.mode is W


def test_a_handshake_answered_while_a_later_request_waits_goes_raw_only_after_its_answer():
    pb = Playbook(pre_auth_max_frame_bytes=512 * 1024)
    pb.relays(sasl_handshake(1, version=0), heartbeat(2))
    pb.delivers(sasl_handshake_response(1, version=0))
    assert pb.conn.mode is P                          # heartbeat 2 is still owed an answer
    out = pb.broker_answers(heartbeat_response(2))
    assert steps(out) == [SendToClient([heartbeat_response(2)]), RawMode("sasl_handshake_v0")]
    assert pb.conn.mode is W


def test_draining_closes_when_the_queue_empties_and_a_closed_connection_says_nothing():
    pb = Playbook()
    pb.relays(heartbeat(1))
    assert pb.conn.drain() == [PauseReading(Side.CLIENT, "draining")]
    assert pb.conn.mode is D
    out = pb.broker_answers(heartbeat_response(1))
    assert steps(out) == [SendToClient([heartbeat_response(1)]), Close("draining", "proxy shutting down")]
    assert pb.conn.mode is C
    assert pb.conn.drain() == [] and pb.client_sends(heartbeat(2)) == [] and pb.conn.client_gone() == []


def test_a_connection_closed_by_the_shell_stays_closed():
    pb = Playbook()
    pb.relays(heartbeat(1))
    pb.conn.connection_lost()
    pb.conn.connection_lost()
    assert pb.conn.mode is C and pb.broker_answers(heartbeat_response(1)) == []

"""The connection's mode table (connection/modes.py): every legal transition, and every other pair refused.

The legal transitions are spelled out here once more, as a reader would draw them, so that a change to
the table is a change to this test too.
"""

from __future__ import annotations

import itertools

import pytest

from txnguard.connection.modes import TRANSITIONS, Event, Mode, ModeError, next_mode

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

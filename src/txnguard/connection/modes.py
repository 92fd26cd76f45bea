"""What a connection is doing, as one value, and every way it changes, in one table (after h11's state tables).

Rule 1: the mode changes only through `TRANSITIONS`; a pair the table does not name is a bug in the core
and raises `ModeError`, naming both.
Rule 2: a hold (connection/holds.py) is data, not a mode: HOLDING says "relaying, with later requests
queued behind a hold". A hold that begins or ends while the connection drains, lingers or waits to
become a byte pipe leaves that mode as it is (the holds themselves keep the queue).

    RELAY        frames read, book-kept, forwarded; the fast paths run only here (and, for responses, in
                 HOLDING); a large request is cut through only here
    HOLDING      a verification, the EndTxn hold or an absorption holds the client's later requests: what
                 the relay tests (connection/relay.py) to leave requests to the general path, which queues
                 them, while answers still take the fast path; the last hold's end (RELEASE) goes back to RELAY
    RAW_PENDING  a SaslHandshake v0 succeeded: header-less SASL tokens follow once every earlier response
                 is out
    RAW          a byte pipe both ways (SASL v0 tokens)
    DRAINING     the proxy shuts down: nothing new is read; closes once every response is delivered (the one
                 place: `_close_when_drained`, connection/responses.py)
    LINGERING    the client left with an EndTxn unanswered: the broker side stays until it is answered
    CLOSED       nothing more comes out
"""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    RELAY = "relay"
    HOLDING = "holding"
    RAW_PENDING = "raw_pending"
    RAW = "raw"
    DRAINING = "draining"
    LINGERING = "lingering"
    CLOSED = "closed"


class Event(enum.Enum):
    HOLD = "hold"                # a hold began (another may be on already)
    RELEASE = "release"          # the last hold ended
    SASL_V0 = "sasl_v0"          # the broker accepted a SaslHandshake v0
    FLUSHED = "flushed"          # no response is owed the client and nothing is held
    DRAIN = "drain"              # the proxy shuts down
    CLIENT_GONE = "client_gone"  # the client left with an EndTxn forwarded and unanswered
    CLOSE = "close"


class ModeError(RuntimeError):
    """A transition the table does not allow: a bug in the core, not in what a peer sent."""

    def __init__(self, mode: Mode, event: Event) -> None:
        super().__init__(f"no transition from mode {mode.value} on event {event.value}")
        self.mode = mode
        self.event = event


_R, _H, _P, _W, _D, _L, _C = (Mode.RELAY, Mode.HOLDING, Mode.RAW_PENDING, Mode.RAW, Mode.DRAINING,
                              Mode.LINGERING, Mode.CLOSED)
_E = Event

TRANSITIONS: dict[tuple[Mode, Event], Mode] = {
    (_R, _E.HOLD): _H,
    (_R, _E.SASL_V0): _P,
    (_R, _E.DRAIN): _D,
    (_R, _E.CLIENT_GONE): _L,
    (_R, _E.CLOSE): _C,

    (_H, _E.HOLD): _H,
    (_H, _E.RELEASE): _R,
    (_H, _E.SASL_V0): _P,         # a handshake answered while a later request is held: raw once it is out
    (_H, _E.DRAIN): _D,
    (_H, _E.CLIENT_GONE): _L,
    (_H, _E.CLOSE): _C,

    (_P, _E.HOLD): _P,
    (_P, _E.RELEASE): _P,
    (_P, _E.SASL_V0): _P,
    (_P, _E.FLUSHED): _W,
    (_P, _E.DRAIN): _D,           # closes once the queue is empty: no byte pipe first
    (_P, _E.CLIENT_GONE): _L,
    (_P, _E.CLOSE): _C,

    (_W, _E.DRAIN): _D,           # nothing is owed in a byte pipe: it closes at once
    (_W, _E.CLOSE): _C,

    (_D, _E.HOLD): _D,
    (_D, _E.RELEASE): _D,
    (_D, _E.SASL_V0): _D,
    (_D, _E.DRAIN): _D,
    (_D, _E.CLIENT_GONE): _L,     # the EndTxn is answered before the queue is empty: lingering ends first
    (_D, _E.CLOSE): _C,

    (_L, _E.HOLD): _L,
    (_L, _E.RELEASE): _L,
    (_L, _E.SASL_V0): _L,
    (_L, _E.DRAIN): _L,
    (_L, _E.CLOSE): _C,
}


def next_mode(mode: Mode, event: Event) -> Mode:
    try:
        return TRANSITIONS[mode, event]
    except KeyError:
        raise ModeError(mode, event) from None

"""Hypothesis: whatever a broker sends back, the client gets answers only to its own requests, in their order.

The requests are booked in the connection's native book (the fast path: a later read than the first), so the
broker's bytes meet the book's response loop first (native/src/book.rs) and the general path after it. The bytes
are the right answers mutated (a byte changed, bytes cut out or put in, two answers swapped) or any bytes at all,
arriving in any chunks. Then: nothing raises; what reaches the client is the start of what the broker sent (these
answers pass as they are); every response head in it carries the correlation id of the request in its place; and
once the bytes stop making sense, the connection closes with a frame error's reason or waits for more.
"""

from __future__ import annotations

import struct

from connection_playbook import Playbook, heartbeat, heartbeat_response, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from txnguard.connection.commands import Close, SendToClient

_HEAD = struct.Struct(">ii")


@st.composite
def _mutated(draw: st.DrawFn, answers: list[bytes]) -> bytes:
    stream = bytearray(b"".join(answers))
    kind = draw(st.sampled_from(["byte", "cut", "insert", "swap"]))
    at = draw(st.integers(0, len(stream) - 1))
    if kind == "byte":
        stream[at] = draw(st.integers(0, 255))
    elif kind == "cut":
        del stream[at:at + draw(st.integers(1, 12))]
    elif kind == "insert":
        stream[at:at] = draw(st.binary(min_size=1, max_size=12))
    elif len(answers) > 1:
        i = draw(st.integers(0, len(answers) - 2))
        answers = [*answers[:i], answers[i + 1], answers[i], *answers[i + 2:]]
        stream = bytearray(b"".join(answers))
    return bytes(stream)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 4), data=st.data())
def test_broker_bytes_reach_the_client_only_as_answers_to_its_requests_in_order(n: int, data: st.DataObject) -> None:
    pb = Playbook()
    pb.relays(heartbeat(0))                      # the first read names the client (the general path)
    pb.delivers(heartbeat_response(0))
    pb.relays(*(heartbeat(i) for i in range(1, n + 1)))  # booked in the native book
    answers = [heartbeat_response(i) for i in range(1, n + 1)]
    stream = data.draw(st.one_of(st.binary(max_size=120), _mutated(answers)))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    delivered, closes = b"", []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if closes:
            break
        for command in steps(pb.conn.receive_from_broker(stream[start:stop])):
            if isinstance(command, SendToClient):
                delivered += command.data[0]
            else:
                assert isinstance(command, Close), command
                closes.append(command)
    assert stream.startswith(delivered)
    at, expected = 0, 1
    while len(delivered) - at >= 8:
        size, correlation_id = _HEAD.unpack_from(delivered, at)
        assert correlation_id == expected, (delivered, stream)
        at, expected = at + 4 + size, expected + 1
    if stream == b"".join(answers):
        assert delivered == stream and not closes
    for close in closes:
        assert close.frame_error is not None or close.reason == "response_out_of_order", close

"""The proxy's own requests to a broker (proxy/kafka_client.py): pipelined, answered in order, bounded in time.

    proxy ─request 1─▶ broker ─(nothing within the timeout)─▶ request 1 and every request behind it fail,
                                                               the connection is dropped (a late answer would
                                                               be taken for the next request's)
    proxy ─request 1 (its waiter cancelled), request 2─▶ broker ─answer 1, answer 2─▶ request 2 gets answer 2
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from txnguard.codecs.api_keys import ApiKey
from txnguard.proxy.kafka_client import BrokerConnection, UpstreamError

FETCH = ApiKey.FETCH.value


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def connected() -> tuple[BrokerConnection, Transport]:
    conn, transport = BrokerConnection(), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def frame(correlation_id: int) -> bytes:
    return struct.pack(">ii", 4, correlation_id)  # an answer of nothing but its correlation id


def test_no_answer_within_the_timeout_fails_every_waiter_and_drops_the_connection() -> None:
    async def run() -> tuple[list[BaseException | memoryview], bool, bool]:
        conn, transport = connected()
        first = asyncio.ensure_future(conn.request_encoded(FETCH, 12, frame, timeout=0.05))
        second = asyncio.ensure_future(conn.request_encoded(FETCH, 12, frame, timeout=5.0))
        done = await asyncio.gather(first, second, return_exceptions=True)
        return done, conn.is_open, transport.closed

    (first, second), is_open, closed = asyncio.run(run())
    assert isinstance(first, UpstreamError) and str(first) == "no response within 0.05s"
    assert isinstance(second, UpstreamError)
    assert not is_open and closed


def test_an_answer_whose_waiter_was_cancelled_is_not_taken_for_the_next_requests() -> None:
    async def run() -> bytes:
        conn, _ = connected()
        first = asyncio.ensure_future(conn.request_encoded(FETCH, 12, frame, timeout=5.0))
        second = asyncio.ensure_future(conn.request_encoded(FETCH, 12, frame, timeout=5.0))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        conn.data_received(frame(1) + frame(2))
        with pytest.raises(asyncio.CancelledError):
            await first
        return bytes(await second)

    assert asyncio.run(run()) == struct.pack(">i", 2)


def test_an_answer_in_time_cancels_the_timer() -> None:
    async def run() -> tuple[bytes, bool]:
        conn, _ = connected()
        asked = asyncio.ensure_future(conn.request_encoded(FETCH, 12, frame, timeout=0.05))
        await asyncio.sleep(0)
        conn.data_received(frame(1))
        answer = bytes(await asked)
        await asyncio.sleep(0.1)  # past the timeout: the timer must not drop the connection now
        return answer, conn.is_open

    assert asyncio.run(run()) == (struct.pack(">i", 1), True)

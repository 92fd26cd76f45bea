"""How the shell reads a client that sends a lot: what it holds, and whose turn it is.

    client ──8 MiB Produce──▶ proxy (uvloop)             broker connection: not up yet
                              holds one read, reading paused; more of the client's bytes wait unread in the
                              proxy's socket for a few turns of the loop (a session still reading would take them)
                              broker connection up ──▶ the 8 MiB, byte for byte, to the broker

    client ──24 MiB Produce──▶ proxy: one full read (256,000 B) per turn of the event loop, then the others'
                                       turn (libuv would read up to 32 in a row: 8 MB before anyone else)

uvloop starts reading a connection once `connection_made` returns, whatever the protocol paused there; the
session pauses again on its first read. The "broker" is a byte sink and the slow connect a wrapper around the
proxy's own, which goes on only after those turns (an order of events, no wall-clock delay): a real broker cannot
be told to wait for that (real brokers carry big frames
through the proxy in tests/integration/test_proxy_process.py; bench/big_frame.py measures a neighbour's
round trips beside a 100 MiB Produce).
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import struct
import termios
import threading
from typing import Any

import uvloop

from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.server import Proxy
from txnguard.proxy.session import FULL_READ, Session

FRAME_MIB = 8
ONE_READ = 256 * 1024  # uvloop reads 256,000 bytes at a time, asyncio 256 KiB
UNREAD_TURNS = 20  # turns of the loop with the client's bytes ready in the proxy's socket before the connect


def big_produce(mib: int = FRAME_MIB) -> bytes:
    """A Produce v3 (acks=1, no transactional id) of `mib` MiB: the proxy relays it unread."""
    records = b"\x00" * (mib * 1024 * 1024)
    client_id = b"early"
    body = (struct.pack(">hhih", 0, 3, 1, len(client_id)) + client_id
            + struct.pack(">hhi", -1, 1, 30000)                   # no transactional id, acks=1, timeout
            + struct.pack(">ih", 1, 3) + b"big"                   # one topic
            + struct.pack(">iii", 1, 0, len(records)) + records)  # one partition: 0, its records
    return struct.pack(">i", len(body)) + body


def held(session: Session) -> int:
    """What the session read and holds until its broker connection is up."""
    return sum(len(b) for b in session._early)


def unread_bytes(session: Session) -> int:
    """What the kernel holds for the proxy on the session's client socket, not read yet (FIONREAD)."""
    assert session.client is not None
    count = array.array("i", [0])
    fcntl.ioctl(session.client.get_extra_info("socket").fileno(), termios.FIONREAD, count)
    return count[0]


async def scenario(frame: bytes, hold_connect: bool = True) -> tuple[int, int, list[int]]:
    streams: list[bytearray] = []  # one per connection: the proxy's own Metadata connections come here too
    done = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = bytearray()
        streams.append(received)
        while len(received) < len(frame):
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            received.extend(chunk)
        if len(received) >= len(frame):
            done.set()
        writer.close()

    broker = await asyncio.start_server(sink, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    proxy = Proxy(ProxyConfig(listen=HostPort("127.0.0.1", 0), upstream=(HostPort("127.0.0.1", broker_port),)))
    held_at_connect: list[int] = []
    connect = proxy.connect_upstream

    async def slow_connect(target: HostPort, factory: Any) -> Any:
        if hold_connect:  # the client has been sending all along
            [session] = proxy.sessions
            # A read taken, and more ready to read (or more than one read taken: the test fails below).
            while not session._early or not (unread_bytes(session) or held(session) > ONE_READ):
                await asyncio.sleep(0.001)
            for _ in range(UNREAD_TURNS):
                await asyncio.sleep(0)
        held_at_connect.append(sum(held(s) for s in proxy.sessions))
        return await connect(target, factory)

    # The loop's turns, counted by a callback that schedules itself again at every turn; each full read of
    # the client's records the turn it came in.
    turn = [0]

    def count_turns() -> None:
        turn[0] += 1
        loop.call_soon(count_turns)

    full_read_turns: list[int] = []
    from_client = Session.from_client

    def recording(self: Session, data: bytes) -> None:
        if len(data) >= FULL_READ:
            full_read_turns.append(turn[0])
        from_client(self, data)

    loop = asyncio.get_running_loop()
    loop.call_soon(count_turns)
    proxy.connect_upstream = slow_connect  # type: ignore[method-assign]
    Session.from_client = recording  # type: ignore[method-assign]
    await proxy.start()
    try:
        client = socket.create_connection(("127.0.0.1", proxy.bootstrap_address.port))
        sender = threading.Thread(target=client.sendall, args=(frame,), daemon=True)
        sender.start()
        await asyncio.wait_for(done.wait(), 30)
        sender.join(5)
        client.close()
    finally:
        Session.from_client = from_client  # type: ignore[method-assign]
        await proxy.stop()
        broker.close()
    [received] = [r for r in streams if len(r) >= len(frame)]
    assert bytes(received) == frame, "the frame reached the broker whole and unchanged"
    return held_at_connect[0], len(received), full_read_turns


def test_a_client_sending_before_the_broker_connection_is_up_waits_in_its_socket_not_in_the_proxy() -> None:
    frame = big_produce()

    held, forwarded, _ = uvloop.run(scenario(frame))

    assert forwarded == len(frame)
    assert 0 < held <= ONE_READ   # one read arrived and paused reading; the rest waited in the sockets


def test_a_client_with_more_to_read_is_read_once_a_turn_so_the_others_get_theirs() -> None:
    frame = big_produce(24)

    _, forwarded, turns = uvloop.run(scenario(frame, hold_connect=False))

    assert forwarded == len(frame)
    assert len(turns) > 20                          # the frame came in many full reads...
    assert len(set(turns)) == len(turns), turns     # ...never two in one turn of the loop

"""The floor any relay pays here: a byte pipe with no Kafka framing (the "bare relay" arm of proxy_overhead.py).

Run: `python bench/bare_relay.py --listen 127.0.0.1:9100 --upstream 127.0.0.1:9092`

For each accepted connection it opens one upstream connection and writes every read, as it came,
to the other side: one Python callback and one write per read, nothing parsed, nothing counted
but bytes. Flow control as txnguard's: a side whose write buffer passes 4 MiB stops the reading of
its peer until it drains below 1 MiB. Either side closing closes both. A measuring instrument, not
product code: the broker must advertise this address (the sidecar layout), since a byte pipe cannot
rewrite Metadata.

SIGUSR1 prints `relayed <client-to-upstream bytes> <upstream-to-client bytes> <connections>` on
stdout (the bench's route check); SIGTERM or SIGINT prints it once more and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from typing import cast

import uvloop

HIGH_WATER = 4 * 1024 * 1024        # txnguard's defaults (proxy/config.py), so both relays pause alike
LOW_WATER = 1024 * 1024


class Counts:
    def __init__(self) -> None:
        self.to_upstream = 0
        self.to_client = 0
        self.connections = 0

    def line(self) -> str:
        return f"relayed {self.to_upstream} {self.to_client} {self.connections}"


class Pipe(asyncio.Protocol):
    """One side of a relayed connection: what its transport reads goes to the peer's transport."""

    def __init__(self, counts: Counts, to_upstream: bool) -> None:
        self.counts = counts
        self.to_upstream = to_upstream   # this side reads from the client
        self.transport: asyncio.Transport | None = None
        self.peer: Pipe | None = None

    def _setup(self, transport: asyncio.BaseTransport) -> asyncio.Transport:
        # uvloop's TCP transport has asyncio.Transport's methods without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        self.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.transport

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(data)
        if self.to_upstream:
            self.counts.to_upstream += len(data)
        else:
            self.counts.to_client += len(data)

    # Our own write buffer is full: stop reading what fills it, from the peer.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class ClientSide(Pipe):
    def __init__(self, counts: Counts, upstream: tuple[str, int]) -> None:
        super().__init__(counts, to_upstream=True)
        self.upstream = upstream
        self.connecting: asyncio.Task[None] | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Nothing is read until the upstream connection exists: nowhere to write it yet.
        self._setup(transport).pause_reading()
        self.counts.connections += 1
        self.connecting = asyncio.get_running_loop().create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            # Pausing in connection_made does not hold back a read the transport already made
            # (txnguard's session keeps these too): it leaves first once upstream is connected.
            self.early.append(data)
            return
        super().data_received(data)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: UpstreamSide(self), *self.upstream)
        except OSError:
            assert self.transport is not None
            self.transport.close()


class UpstreamSide(Pipe):
    def __init__(self, client: ClientSide) -> None:
        super().__init__(client.counts, to_upstream=False)
        self.client = client
        self.peer = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        upstream, client = self._setup(transport), self.client
        assert client.transport is not None
        if client.transport.is_closing():   # the client left while we connected
            upstream.close()
            return
        client.peer = self
        if client.early:
            early, client.early = b"".join(client.early), []
            upstream.write(early)
            self.counts.to_upstream += len(early)
        client.transport.resume_reading()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    counts = Counts()
    stop = loop.create_future()

    def report() -> None:
        print(counts.line(), flush=True)

    def finish() -> None:
        if not stop.done():
            stop.set_result(None)

    loop.add_signal_handler(signal.SIGUSR1, report)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish)
    server = await loop.create_server(lambda: ClientSide(counts, upstream), *listen, backlog=1024)
    print(f"listening {listen[0]}:{listen[1]} -> {upstream[0]}:{upstream[1]}", flush=True)
    await stop
    server.close()
    report()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", required=True, help="host:port to accept clients on")
    parser.add_argument("--upstream", required=True, help="host:port to relay each connection to")
    args = parser.parse_args()
    uvloop.run(serve(_address(args.listen), _address(args.upstream)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

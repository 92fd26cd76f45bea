"""A fault layer for tests (issue 10): a Kafka-aware TCP relay in front of one broker.

    client or proxy ──▶ FaultRelay(127.0.0.1:port) ──▶ broker
                        per API key and direction: delay, hold until released, drop, duplicate,
                        reset the connection, cut the bandwidth

Toxiproxy's TCP faults, plus what only a Kafka-aware relay can do: hold the one EndTxn(COMMIT)
of a transaction past the client's request timeout and release it while the next transaction is
open (KAFKA-17754, the scenario the tests call J3; docs/concepts.md explains it). Loopback only, bounded, and
deterministic: faults apply in the order frames arrive, and a fault with a probability draws
from its own seeded generator.

Stream semantics are kept as TCP keeps them: a delayed or held frame delays every later byte in
its direction on that connection, and a client that closes while a frame is held does not take
the held frame with it: the relay keeps the broker side open until what it holds has been
released and written (a delayed packet still arrives), then closes it.

Process faults live next to their processes: `Cluster.pause_node/resume_node/kill_node/restart_node`
for brokers, `ProxyProcess.kill/restart` for the proxy.
"""

from __future__ import annotations

import asyncio
import enum
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_FRAME_HEAD = struct.Struct(">ihhi")   # size, api key, api version, correlation id (request header v1+)
_RESPONSE_HEAD = struct.Struct(">ii")  # size, correlation id
MAX_FRAME = 200 << 20


class Direction(enum.Enum):
    REQUEST = "request"      # client to broker
    RESPONSE = "response"    # broker to client


class Action(enum.Enum):
    DELAY = "delay"          # forward after delay_s (later frames in that direction wait too)
    HOLD = "hold"            # keep until release(); later frames in that direction wait behind it
    DROP = "drop"            # never forward (requests: the broker never sees it; the client times out)
    DUPLICATE = "duplicate"  # requests only: the broker gets it twice; the client sees the first response
    RESET = "reset"          # abort both sockets (RST) when the frame arrives; the frame is lost
    BANDWIDTH = "bandwidth"  # forward that direction at bytes_per_s from this frame on


@dataclass
class Fault:
    action: Action
    api_key: int | None = None           # None: any API
    direction: Direction = Direction.REQUEST
    times: int | None = 1                # how many matching frames it applies to (None: all)
    delay_s: float = 0.0
    bytes_per_s: int = 0
    probability: float = 1.0
    match: Callable[[bytes], bool] | None = None  # a further test on the whole frame (length prefix included)
    seed: int = 0
    applied: int = 0                     # frames it was applied to so far
    _random: random.Random = field(default_factory=random.Random, repr=False)
    _released: asyncio.Event | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._random.seed(self.seed)

    def wants(self, direction: Direction, api_key: int, frame: bytes) -> bool:
        if direction is not self.direction or (self.api_key is not None and self.api_key != api_key):
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        if self.match is not None and not self.match(frame):
            return False
        return self.probability >= 1.0 or self._random.random() < self.probability


@dataclass
class Seen:
    """What crossed the relay: (direction, api key, correlation id, action applied or None)."""

    frames: list[tuple[Direction, int, int, Action | None]] = field(default_factory=list)

    def count(self, api_key: int, direction: Direction = Direction.REQUEST, action: Action | None = None) -> int:
        return sum(1 for d, k, _, a in self.frames if d is direction and k == api_key and a is action)


class _Pipe:
    """One direction of one connection: frames in order, each after the previous one was written."""

    def __init__(self, relay: FaultRelay, conn: _Connection, direction: Direction,
                 writer: asyncio.StreamWriter) -> None:
        self.relay, self.conn, self.direction, self.writer = relay, conn, direction, writer
        self.queue: asyncio.Queue[tuple[bytes, int, int] | None] = asyncio.Queue()
        self.bytes_per_s = 0
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                frame, api_key, correlation_id = item
                fault = self.relay.fault_for(self.direction, api_key, frame)
                action = fault.action if fault is not None else None
                self.relay.seen.frames.append((self.direction, api_key, correlation_id, action))
                for observe in self.relay.observers:
                    observe(self.direction, api_key, self.conn.version_of.get(correlation_id, -1), frame)
                if fault is not None:
                    fault.applied += 1
                    if fault.action is Action.DROP:
                        continue
                    if fault.action is Action.RESET:
                        self.conn.abort()
                        return
                    if fault.action is Action.DELAY:
                        await asyncio.sleep(fault.delay_s)
                    elif fault.action is Action.HOLD:
                        assert fault._released is not None
                        await fault._released.wait()
                    elif fault.action is Action.BANDWIDTH:
                        self.bytes_per_s = fault.bytes_per_s
                    elif fault.action is Action.DUPLICATE and self.direction is Direction.REQUEST:
                        self.conn.swallow[correlation_id] = self.conn.swallow.get(correlation_id, 0) + 1
                        await self._write(frame)
                await self._write(frame)
        except (ConnectionError, OSError):
            self.conn.abort()
        finally:
            self._close_write()

    async def _write(self, frame: bytes) -> None:
        if self.direction is Direction.RESPONSE and self.conn.client_gone:
            return  # answers to a client that left are read and dropped; the broker side stays as it was
        try:
            await self._write_paced(frame)
        except (ConnectionError, OSError):
            if self.direction is Direction.REQUEST:
                raise
            # The client went away: keep the broker side open for what is still held for it.
            self.conn.client_gone = True

    async def _write_paced(self, frame: bytes) -> None:
        if self.bytes_per_s:
            chunk = max(self.bytes_per_s // 20, 1)
            for i in range(0, len(frame), chunk):
                self.writer.write(frame[i:i + chunk])
                await self.writer.drain()
                await asyncio.sleep(len(frame[i:i + chunk]) / self.bytes_per_s)
        else:
            self.writer.write(frame)
            await self.writer.drain()

    def _close_write(self) -> None:
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
        except (OSError, RuntimeError):
            pass


class _Connection:
    def __init__(self, relay: FaultRelay, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 broker: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.relay = relay
        self.client_reader, self.client_writer = client
        self.broker_reader, self.broker_writer = broker
        self.api_of: dict[int, int] = {}       # correlation id -> api key, for responses
        self.version_of: dict[int, int] = {}   # correlation id -> api version (observers decode with it)
        self.swallow: dict[int, int] = {}      # duplicated request -> answers still to drop (the later ones)
        self.client_gone = False
        self.to_broker = _Pipe(relay, self, Direction.REQUEST, self.broker_writer)
        self.to_client = _Pipe(relay, self, Direction.RESPONSE, self.client_writer)

    def abort(self) -> None:
        for w in (self.client_writer, self.broker_writer):
            w.transport.abort()

    async def run(self) -> None:
        await asyncio.gather(self._read_requests(), self._read_responses(), return_exceptions=True)
        # Both directions drained (held frames released and written) or aborted: close for good.
        await asyncio.gather(self.to_broker.task, self.to_client.task, return_exceptions=True)
        for w in (self.client_writer, self.broker_writer):
            w.close()

    async def _frames(self, reader: asyncio.StreamReader) -> Any:
        while True:
            try:
                head = await reader.readexactly(4)
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                return
            (size,) = struct.unpack(">i", head)
            if not 0 <= size <= MAX_FRAME:
                return
            try:
                body = await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                return
            yield head + body

    async def _read_requests(self) -> None:
        async for frame in self._frames(self.client_reader):
            if len(frame) >= _FRAME_HEAD.size:
                _, api_key, api_version, correlation_id = _FRAME_HEAD.unpack_from(frame)
            else:
                api_key, api_version, correlation_id = -1, -1, -1
            self.api_of[correlation_id] = api_key
            self.version_of[correlation_id] = api_version
            await self.to_broker.queue.put((frame, api_key, correlation_id))
        await self.to_broker.queue.put(None)  # the client closed: the broker side closes once drained

    async def _read_responses(self) -> None:
        forwarded: dict[int, int] = {}
        async for frame in self._frames(self.broker_reader):
            correlation_id = _RESPONSE_HEAD.unpack_from(frame)[1] if len(frame) >= 8 else -1
            api_key = self.api_of.get(correlation_id, -1)
            if forwarded.get(correlation_id, 0) and self.swallow.get(correlation_id, 0):
                self.swallow[correlation_id] -= 1  # a later answer to a duplicated request: the client had one
                continue
            forwarded[correlation_id] = forwarded.get(correlation_id, 0) + 1
            await self.to_client.queue.put((frame, api_key, correlation_id))
        await self.to_client.queue.put(None)


class FaultRelay:
    """A relay to `target` on a loopback port of its own, in a thread with its own event loop."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target, self.host = target, host
        self.port = port  # 0: any free port; a fixed one when a broker advertises the relay (J1-lite)
        self.faults: list[Fault] = []
        self.seen = Seen()
        # Called on the relay's loop with (direction, api key, api version, frame) for every frame that
        # crosses, before its fault applies: a tap for what a client really received.
        self.observers: list[Callable[[Direction, int, int, bytes], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._connections: set[asyncio.Task[None]] = set()
        self._open: set[_Connection] = set()

    # -- life cycle (any thread) -----------------------------------------------------------------------------

    def start(self) -> FaultRelay:
        self._thread = threading.Thread(target=self._run, name=f"fault-relay-{self.target[1]}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault relay did not start")
        return self

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self._loop is None:
            return
        self.release_all()
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults (any thread) ------------------------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        """Apply `fault` to frames from now on (faults are tried in the order they were added)."""
        assert self._loop is not None, "start the relay first"

        def install() -> None:
            if fault.action is Action.HOLD:
                fault._released = asyncio.Event()
            self.faults.append(fault)

        self._call(install)
        return fault

    def release(self, fault: Fault) -> None:
        """Let the frames `fault` holds go on (in their order), and stop holding new ones."""
        def set_free() -> None:
            fault.times = fault.applied
            if fault._released is not None:
                fault._released.set()

        self._call(set_free)

    def release_all(self) -> None:
        for f in list(self.faults):
            self.release(f)

    def clear(self) -> None:
        """No faults from now on: held frames go on, and connections a bandwidth cut slowed run at full speed."""
        self.release_all()

        def forget() -> None:
            self.faults.clear()
            for conn in self._open:
                conn.to_broker.bytes_per_s = conn.to_client.bytes_per_s = 0

        self._call(forget)

    def fault_for(self, direction: Direction, api_key: int, frame: bytes) -> Fault | None:
        for f in self.faults:
            if f.wants(direction, api_key, frame):
                return f
        return None

    # -- the loop ------------------------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], None]) -> None:
        assert self._loop is not None
        if threading.current_thread() is self._thread:
            fn()
            return
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise RuntimeError("the fault relay's loop did not answer")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._accept, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            broker = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = _Connection(self, (reader, writer), broker)
        self._open.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            # The relay stops. Ending quietly matters: asyncio's start_server callback asks a cancelled
            # handler task for its exception and logs the CancelledError as an error.
            return
        finally:
            self._connections.discard(task)
            self._open.discard(conn)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        pipes = [t for conn in self._open for t in (conn.to_broker.task, conn.to_client.task)]
        for conn in list(self._open):
            conn.abort()  # transports closed while the loop still runs: nothing left to close after it
        tasks = [*self._connections, *pipes]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.05)  # let the aborted transports' close callbacks run

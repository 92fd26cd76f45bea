"""One client connection in asyncio: moves bytes into the connection core and runs its commands.

Every protocol rule (framing, ordering, holds, SASL, local answers, verification
decisions) is in `txnguard.connection.core`; this module owns the two
transports, the broker connection's set-up, the verifier's tasks, the logs and
the metrics of what the core reports. It knows its proxy only through `Host`,
so `server` imports it and not the other way round.
"""

from __future__ import annotations

import asyncio
import itertools
import mmap
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from txnguard.codecs import native, schemas
from txnguard.connection import commands as c
from txnguard.connection.core import Cluster, Connection, Settings
from txnguard.proxy import logs
from txnguard.proxy.config import ClientAuth, HostPort, ProxyConfig
from txnguard.proxy.guard import SystemClock, TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.checks import Answer
from txnguard.verification.inventory import ConnectionInventory

_ids = itertools.count(1)
_CLOCK = SystemClock()


class Releaser:
    """Gives the memory of large assembled frames back to the kernel on a thread of its own.

    A frame the core assembled past 1 MiB (a transactional Produce it verifies; codecs/framing.py) is
    an anonymous mapping, and unmapping 100 MiB is one munmap of 30-80 ms on this machine (25,600
    pages). Where the last reference goes, the munmap runs: on the event loop's thread that stopped
    every connection. A session keeps the mappings it forwarded and hands each over once nothing else
    refers to it (the transport has written it, the core has let it go); the munmap drops the GIL.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[mmap.mmap]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def release(self, mappings: list[mmap.mmap]) -> None:
        """Take the only references to these mappings (the caller keeps none, not even in a variable)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="txnguard-release", daemon=True)
            self._thread.start()
        self._queue.put(mappings)

    def _run(self) -> None:
        while True:
            self._queue.get().clear()  # the list held their last references: unmapped here


RELEASER = Releaser()


def unreferenced(held: list[mmap.mmap]) -> list[mmap.mmap]:
    """Take out of `held` the mappings nothing else refers to (no view of them is left anywhere)."""
    # getrefcount sees the list's reference and its own argument's: 2 is nobody else.
    return [held.pop(i) for i in reversed(range(len(held))) if sys.getrefcount(held[i]) <= 2]


class ListenerLike(Protocol):
    name: str


class Host(Cluster, Protocol):
    """What a session needs of its proxy."""

    config: ProxyConfig
    metrics: ProxyMetrics
    guard: TransactionGuard
    debug: bool
    response_observer: Callable[[list[bytes | memoryview]], None] | None

    async def upstream_for(self, listener: Any) -> list[HostPort]: ...
    async def connect_upstream(self, target: HostPort, factory: Callable[[], asyncio.Protocol]) -> Any: ...
    def session_closed(self, session: Session) -> None: ...


# uvloop reads at most 256,000 bytes at a time (asyncio 256 KiB): a read that long means more is waiting.
FULL_READ = 256_000
FAIR_SHARE = "fair_share"  # a pause cause: a connection with more to read lets the others go first


class ClientProtocol(asyncio.Protocol):
    """asyncio glue: hands every event of the client socket to its Session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        # An instance attribute: the transport calls the session's own method, one Python call less
        # per read.
        self.data_received = session.from_client  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.session.client_connected(cast(asyncio.Transport, transport))  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.session.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.client_lost(repr(exc) if exc else "client closed the connection")

    def pause_writing(self) -> None:
        self.session.pause_reading(c.Side.BROKER, "client_write_buffer")

    def resume_writing(self) -> None:
        self.session.resume_reading(c.Side.BROKER, "client_write_buffer")


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, session: Session) -> None:
        self.session = session
        self.data_received = session.from_upstream  # type: ignore[method-assign]  # as ClientProtocol

    def data_received(self, data: bytes) -> None:
        self.session.from_upstream(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.close("upstream_closed", repr(exc) if exc else "broker closed the connection")

    def pause_writing(self) -> None:
        self.session.pause_reading(c.Side.CLIENT, "upstream_write_buffer")

    def resume_writing(self) -> None:
        self.session.resume_reading(c.Side.CLIENT, "upstream_write_buffer")


class Session:
    def __init__(self, proxy: Host, listener: ListenerLike, peer: str) -> None:
        self.id = next(_ids)
        self.proxy = proxy
        self.listener = listener
        self.limits = limits = proxy.config.limits
        self.metrics = proxy.metrics
        self.guard = proxy.guard
        self.log = logs.get(conn=self.id, listener=listener.name, client=peer)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.upstream_address: HostPort | None = None
        self.core = Connection(
            Settings(connection_id=self.id, listener=listener.name, max_frame_bytes=limits.max_frame_bytes,
                     pre_auth_max_frame_bytes=(limits.pre_auth_max_frame_bytes
                                               if proxy.config.client_auth is ClientAuth.SASL else None),
                     max_in_flight=limits.max_in_flight, partial_frame_timeout_s=limits.partial_frame_timeout_s,
                     idle_timeout_s=limits.idle_timeout_s, debug=proxy.debug),
            self.guard.rules, proxy, _CLOCK, proxy.metrics.traffic,
            ConnectionInventory(peer, int(time.time() * 1000)))  # for the audit's connection record
        # Every core books in its guard's one ledger, which the guard records in batches (`booked`).
        self.core.ledger = self.guard.ledger
        self._paused: dict[c.Side, dict[str, float]] = {c.Side.CLIENT: {}, c.Side.BROKER: {}}
        self.closed = False
        self._upstream_task: asyncio.Task[None] | None = None
        self._early: list[bytes] = []
        self._checks: set[asyncio.Task[None]] = set()
        self._linger: asyncio.TimerHandle | None = None
        self._run: dict[type, Callable[[Any], None]] = {
            c.SendToClient: self._send_to_client, c.SendToBroker: self._send_to_broker, c.Ask: self._ask,
            c.Close: self._close_command, c.PauseReading: self._pause_command,
            c.ResumeReading: self._resume_command, c.ClientIdentified: self._client_identified,
            c.ClientSoftware: self._client_software, c.AnsweredLocally: self._answered_locally,
            c.Rewritten: self._rewritten, c.Decided: self._decided,
            c.RequestSeen: self._request_seen, c.RawMode: self._raw_mode, c.Authenticated: self._authenticated,
            c.StartTimer: self._start_timer, c.ConcurrentAbsorbed: self._concurrent_absorbed,
        }
        # The core's timers, each with what forgets its wake-up by the follower (`_start_timer`), if it has one.
        self._timers: dict[asyncio.TimerHandle, Callable[[], None] | None] = {}
        self._software: tuple[str, str, str] | None = None  # its txnguard_client_connections labels
        self._mappings: list[mmap.mmap] = []  # large frames forwarded, until the Releaser unmaps them

    # -- who the client is (for the proxy's other parts) -------------------------------------------------

    @property
    def client_id(self) -> str | None:
        return self.core.client_id

    @property
    def client_family(self) -> str:
        return self.core.family

    def forget_family(self) -> None:
        """A new policy may classify the client differently."""
        self.core.forget_family()

    # -- life cycle ---------------------------------------------------------------------------

    def client_connected(self, transport: asyncio.Transport) -> None:
        self.client = transport
        transport.set_write_buffer_limits(self.limits.high_water_bytes, self.limits.low_water_bytes)
        # Nothing is read until the broker connection is up: no buffering, no reordering.
        self.pause_reading(c.Side.CLIENT, "connecting")
        self._upstream_task = asyncio.get_running_loop().create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        failures: list[str] = []
        try:
            for target in await self.proxy.upstream_for(self.listener):
                try:
                    transport, _ = await self.proxy.connect_upstream(target, lambda: UpstreamProtocol(self))
                    break
                except (TimeoutError, OSError, ConnectionError) as e:
                    failures.append(f"{target}: {e!r}")  # a broker that is down: try the next one
            else:
                raise ConnectionError("; ".join(failures))
        except (TimeoutError, OSError, ConnectionError) as e:
            self.close("upstream_unreachable", f"cannot reach the broker for listener {self.listener.name}: {e}")
            return
        if self.closed:
            transport.close()
            return
        self.upstream = transport
        self.upstream_address = target
        transport.set_write_buffer_limits(self.limits.high_water_bytes, self.limits.low_water_bytes)
        self.log = self.log.bind(broker=str(target))
        self.log.debug("upstream_connected")
        self.resume_reading(c.Side.CLIENT, "connecting")
        if self._early:
            early, self._early = b"".join(self._early), []
            self.from_client(early)

    def client_lost(self, detail: str) -> None:
        """The client closed. With an EndTxn forwarded and unanswered, the broker side stays open until its
        answer (bounded): that answer is what tells the KAFKA-17754 defence the EndTxn can no longer land."""
        if self.closed:
            return
        self._execute(self.core.client_gone())
        if not self.core.lingering:
            self.close("client_closed", detail, level="debug")
            return
        self.client = None
        max_ms = self.proxy.config.verification.end_txn_in_doubt_max_ms
        self.log.info("lingering_for_end_txn", detail=detail, max_ms=max_ms,
                      reason="the client left with an EndTxn unanswered: the broker may still process it, so "
                             "the broker connection stays until its answer")
        self._linger = asyncio.get_running_loop().call_later(max_ms / 1000, self._linger_expired, max_ms)

    def _linger_expired(self, max_ms: int) -> None:
        self.close("end_txn_unanswered", f"the EndTxn the client left was not answered within {max_ms} ms; it "
                   "stays in doubt until the producer moves on", level="warning")

    def close(self, reason: str, detail: str = "", level: str = "info") -> None:
        if self.closed:
            return
        self.closed = True
        self._count_close(reason)
        self.core.connection_lost()
        self.guard.flush_ledger()  # what this connection booked is recorded before its close is
        getattr(self.log, level)("connection_closed", reason=reason, detail=detail, in_flight=self.core.in_flight)
        for side, causes in self._paused.items():
            for cause in list(causes):
                self.resume_reading(side, cause)
        if self.client is not None:
            self.client.close()
        if self.upstream is not None:
            self.upstream.close()
        if self._upstream_task is not None and not self._upstream_task.done():
            self._upstream_task.cancel()
        for task in list(self._checks):
            task.cancel()
        for timer, forget in self._timers.items():
            timer.cancel()
            if forget is not None:
                forget()  # a closed session is not kept alive by the follower until that transaction ends
        self._timers.clear()
        if self._mappings:  # whatever a closed transport still holds is freed when it lets go
            mappings, self._mappings = self._mappings, []
            RELEASER.release(mappings)
        if self.core.inventory is not None:
            self.guard.audit.connection_closed(self.core.client_info(), self.core.inventory, reason)
        self.proxy.session_closed(self)

    def _count_close(self, reason: str) -> None:
        if self.core.lingering:
            if self._linger is not None:
                self._linger.cancel()
            ending = {"client_closed": "answered", "end_txn_unanswered": "timeout"}.get(reason, "upstream_closed")
            self.metrics.child(self.metrics.end_txn_lingers, ending).inc()
        self.metrics.connection_closes.labels(reason).inc()
        if self._software is not None:
            self.metrics.client_software_closed(self._software)

    def drain(self) -> None:
        """Stop reading new requests; close once every in-flight response is delivered."""
        self._execute(self.core.drain())

    def check_timers(self) -> None:
        """Once a second: the core's timeouts (the core reads its own clock); large frames' memory let go."""
        if self._mappings:
            self._release_mappings()
        if not self.closed:
            self._execute(self.core.tick())

    def _release_mappings(self) -> None:
        free = unreferenced(self._mappings)
        if free:
            RELEASER.release(free)

    # -- bytes in -------------------------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None:
            # Reading is paused until the broker connection is up, but uvloop starts reading once
            # `connection_made` returns, whatever it paused there: this read pauses it again, so one read
            # at most waits here (without it a client could fill memory while the broker connection is
            # slow to come, and the whole of it was then relayed in one call: a 25 MB, 43 ms stall of
            # every other connection measured by bench/big_frame.py). Kept unexamined: decisions need the
            # connection.
            self._early.append(data)
            client = self.client
            if client is not None and not client.is_closing():
                client.pause_reading()
            return
        # The relay's common case: every frame of the read needs no reading, and the read leaves as
        # one write, with no command objects in between.
        core = self.core
        done = core.relay_from_client(data)
        if done == len(data):
            upstream.write(data)
            ledger = core.ledger
            if ledger.passed or ledger.windows or ledger.offsets:
                self.guard.booked()  # recorded in a batch, before anything can tell (guard.py)
        else:
            self._execute(core.receive_from_client(data, done))
        if len(data) >= FULL_READ:
            self._take_turns(c.Side.CLIENT)

    def from_upstream(self, data: bytes) -> None:
        core = self.core
        done = core.relay_from_broker(data)  # as from_client
        if done == len(data):
            if self.client is not None:  # None only while lingering, when the core relays nothing
                self.client.write(data)
            if self.proxy.response_observer is not None:
                self.proxy.response_observer([data])
            ledger = core.ledger
            if ledger.passed or ledger.windows:
                self.guard.booked()
        else:
            self._execute(core.receive_from_broker(data, done))
        if len(data) >= FULL_READ:
            self._take_turns(c.Side.BROKER)

    def _take_turns(self, side: c.Side) -> None:
        """A full read: more is waiting on this socket, and libuv would go on reading it, up to 32 reads
        (8 MB) in one turn of the loop, before any other connection is served. Paused until the loop's next
        turn, every other ready connection goes first. A 100 MiB Produce passing cost its neighbours 8-20 ms
        pauses of the loop without this (bench/big_frame.py; pausing every fourth read instead measured
        worse for the neighbour, and no CPU per MiB difference showed at saturation)."""
        if FAIR_SHARE in self._paused[side] or self.closed:
            return
        self.pause_reading(side, FAIR_SHARE)
        asyncio.get_running_loop().call_soon(self.resume_reading, side, FAIR_SHARE)

    def _execute(self, commands: list[c.Command]) -> None:
        """Record what the cores booked in the ledger (it happened before these commands), then run them."""
        self.guard.flush_ledger()
        run = self._run
        for command in commands:
            run[type(command)](command)

    # -- commands ---------------------------------------------------------------------------------

    def _send_to_client(self, command: c.SendToClient) -> None:
        if self.client is None or self.closed:
            return
        data = command.data
        if len(data) == 1:
            self.client.write(data[0])
        else:
            self.client.writelines(data)
        if self.proxy.response_observer is not None:
            self.proxy.response_observer(data)

    def _send_to_broker(self, command: c.SendToBroker) -> None:
        if self.upstream is None or self.closed:
            return
        data = command.data
        if len(data) == 1:
            self.upstream.write(data[0])
        else:
            self.upstream.writelines(data)
        for chunk in data:
            if type(chunk) is memoryview and type(chunk.obj) is mmap.mmap:  # a large frame assembled in place
                self._mappings.append(chunk.obj)

    def _ask(self, command: c.Ask) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(command))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer(self, command: c.Ask) -> None:
        try:
            answer: Answer = await self.guard.answer(command.question, self.upstream_address)
        except asyncio.CancelledError:
            raise
        # Any failure to find out closes, with its reason: a panic in the native state a question reads (the
        # registry, the EndTxn ledger a hold waits on) too, which would otherwise leave the request unanswered.
        except (Exception, native.PanicException) as e:  # noqa: BLE001
            if self.closed:
                return
            self.log.error("verification_error", error=repr(e))
            self._execute(self.core.verification_failed(command.check_id, getattr(e, "reason", "verification_error"),
                                                        repr(e)))
            return
        if not self.closed:
            self._execute(self.core.answered(command.check_id, answer))

    def _close_command(self, command: c.Close) -> None:
        if command.frame_error is not None:
            self.metrics.frame_errors.labels(command.reason, command.frame_error.value).inc()
        self.close(command.reason, command.detail, level=command.level)

    def _pause_command(self, command: c.PauseReading) -> None:
        self.pause_reading(command.side, command.cause)

    def _resume_command(self, command: c.ResumeReading) -> None:
        self.resume_reading(command.side, command.cause)

    def _client_identified(self, command: c.ClientIdentified) -> None:
        self.log = self.log.bind(client_id=command.client_id)

    def _client_software(self, command: c.ClientSoftware) -> None:
        self.log = self.log.bind(client_software=command.name, client_software_version=command.version)
        if self._software is not None:  # a second ApiVersions on the connection names it again
            self.metrics.client_software_closed(self._software)
        self._software = self.metrics.client_software_opened(command.name, command.version, self.core.family)

    def _answered_locally(self, command: c.AnsweredLocally) -> None:
        name = schemas.api_name(command.api_key)
        self.metrics.child(self.metrics.local_responses, name, command.reason).inc()
        if command.reason != "verification":
            self.log.info("answered_locally", api=name, version=command.api_version,
                          correlation_id=command.correlation_id, reason=command.reason)

    def _rewritten(self, command: c.Rewritten) -> None:
        name = "api_versions" if command.kind == "intersect" else schemas.api_name(command.api_key)
        self.metrics.child(self.metrics.rewrites, name, command.kind).inc()

    def _decided(self, command: c.Decided) -> None:
        self.guard.record(command.decision, self.log)

    def _start_timer(self, command: c.StartTimer) -> None:
        def fire() -> None:
            forget = self._timers.pop(handle, None)
            if forget is not None:
                forget()
            if not self.closed:
                self._execute(self.core.timer_fired(command.token))

        def early() -> None:
            # The coordinator's log shows the transaction ended: it accepts the next one now, so the request
            # is asked again now rather than after the rest of the pause (at most one refusal more if its cache
            # lags the log; the core then pauses again as before).
            if handle in self._timers:
                handle.cancel()
                self.metrics.concurrent_woken.labels().value += 1
                fire()

        handle = asyncio.get_running_loop().call_later(command.delay_s, fire)
        follower = self.guard.follower
        self._timers[handle] = None if command.transactional_id is None or follower is None else \
            follower.when_ended(command.transactional_id, early)

    def _concurrent_absorbed(self, command: c.ConcurrentAbsorbed) -> None:
        api = schemas.api_name(command.api_key)
        self.metrics.concurrent_absorptions.labels(api, command.ending).value += 1
        if command.retries:
            self.metrics.concurrent_retries.labels(api).value += command.retries
        # Absorbed is the normal case of a short-transaction loop: debug. A spent budget means the client
        # backs off after all, which an operator may want to see.
        log = self.log.debug if command.ending == "absorbed" else self.log.info
        log("concurrent_transactions_" + command.ending, api=api, retries=command.retries,
            waited_ms=round(command.waited_ms, 3))

    def _request_seen(self, command: c.RequestSeen) -> None:
        self.log.debug("request", api=schemas.api_name(command.api_key), version=command.api_version,
                       correlation_id=command.correlation_id)

    def _raw_mode(self, command: c.RawMode) -> None:
        self.log.info("raw_mode", reason=command.reason)

    def _authenticated(self, command: c.Authenticated) -> None:
        self.log.debug("authenticated")

    # -- backpressure -------------------------------------------------------------------------

    def _transport(self, side: c.Side) -> asyncio.Transport | None:
        return self.client if side is c.Side.CLIENT else self.upstream

    def pause_reading(self, side: c.Side, cause: str) -> None:
        causes = self._paused[side]
        if cause in causes:
            return
        transport = self._transport(side)
        if not causes and transport is not None and not transport.is_closing():
            transport.pause_reading()
        causes[cause] = time.monotonic()

    def resume_reading(self, side: c.Side, cause: str) -> None:
        causes = self._paused[side]
        started = causes.pop(cause, None)
        if started is None:
            return
        if cause != "connecting" and cause != FAIR_SHARE:  # neither is back-pressure
            self.metrics.child(self.metrics.paused_seconds, side.value).inc(time.monotonic() - started)
        transport = self._transport(side)
        if not causes and transport is not None and not transport.is_closing():
            transport.resume_reading()

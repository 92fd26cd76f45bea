"""One client connection and its upstream broker connection.

Frames are forwarded as the original bytes. Only the few responses the proxy
must change (ApiVersions, anything carrying a broker address) are decoded and
re-encoded. Kafka answers a connection's requests in order, so an in-order
queue of in-flight requests (`_order`) pairs every response with its request;
requests the proxy answers itself sit in the same queue and leave in turn.
acks=0 Produce requests get no response and never enter the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from kio.schema.errors import ErrorCode

from txnguard.codecs import addresses, api_versions, schemas
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import FrameSplitter
from txnguard.codecs.header import (
    RequestHead,
    peek_client_id,
    peek_correlation_id,
    peek_request,
    produce_acks_and_txn_id_null,
)
from txnguard.codecs.produce import merged_produce_response
from txnguard.codecs.synthesis import api_versions_unsupported
from txnguard.proxy import logs
from txnguard.proxy.config import HostPort
from txnguard.proxy.guard import OBSERVED, TXN_OFFSET_COMMIT_KEY, Decision
from txnguard.proxy.metrics import BROKER_TO_CLIENT, CLIENT_TO_BROKER

if TYPE_CHECKING:
    from txnguard.proxy.server import Listener, Proxy

PRODUCE, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 18, 17, 36
TXN_OFFSET_COMMIT = TXN_OFFSET_COMMIT_KEY

# What to do with a response before it goes back to the client.
PASS, REWRITE_API_VERSIONS, REWRITE_ADDRESSES, SASL_HANDSHAKE_DONE, SASL_AUTH_DONE, OBSERVE, MERGE_PRODUCE = range(7)

_ids = itertools.count(1)


class InFlight:
    __slots__ = ("action", "api_key", "api_version", "context", "correlation_id", "response", "sent_at")

    def __init__(self, correlation_id: int, api_key: int, api_version: int, action: int, sent_at: float) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.action = action
        self.sent_at = sent_at
        self.response: bytes | memoryview | None = None
        self.context: Any = None  # the decoded request, for responses the guard watches or merges


class ClientProtocol(asyncio.Protocol):
    """asyncio glue: hands every event of the client socket to its Session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.session.client_connected(cast(asyncio.Transport, transport))  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.session.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.close("client_closed", repr(exc) if exc else "client closed the connection", level="debug")

    def pause_writing(self) -> None:
        self.session.pause_reading("upstream", "client_write_buffer")

    def resume_writing(self) -> None:
        self.session.resume_reading("upstream", "client_write_buffer")


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, session: Session) -> None:
        self.session = session

    def data_received(self, data: bytes) -> None:
        self.session.from_upstream(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.close("upstream_closed", repr(exc) if exc else "broker closed the connection")

    def pause_writing(self) -> None:
        self.session.pause_reading("client", "upstream_write_buffer")

    def resume_writing(self) -> None:
        self.session.resume_reading("client", "upstream_write_buffer")


class Session:
    def __init__(self, proxy: Proxy, listener: Listener, peer: str) -> None:
        self.id = next(_ids)
        self.proxy = proxy
        self.listener = listener
        self.limits = proxy.config.limits
        self.metrics = proxy.metrics
        self.log = logs.get(conn=self.id, listener=listener.name, client=peer)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        pre_auth = proxy.config.client_auth == "sasl"
        self.requests = FrameSplitter(self.limits.pre_auth_max_frame_bytes if pre_auth else self.limits.max_frame_bytes)
        # Responses are bounded by the broker's own limits; ours only guards against garbage.
        self.responses = FrameSplitter(max(self.limits.max_frame_bytes, 2 * 1024 * 1024 * 1024 - 1))
        self._order: deque[InFlight] = deque()      # every request awaiting its response, in request order
        self._forwarded: deque[InFlight] = deque()  # the subset sent to the broker, to pair its responses
        self._paused: dict[str, dict[str, float]] = {"client": {}, "upstream": {}}
        self.raw_mode = False
        self.draining = False
        self.closed = False
        self.client_id: str | None = None
        self.software_name: str | None = None
        self.software_version: str | None = None
        self._family: str | None = None
        self.upstream_address: HostPort | None = None
        # A request waiting for verification holds every later request of the connection:
        # the broker must see them in the order the client sent them.
        self._holding = False
        self._held: list[memoryview] = []
        self.last_activity = time.monotonic()
        self.partial_since: float | None = None
        self._upstream_task: asyncio.Task[None] | None = None
        self._early: list[bytes] = []
        self._checks: set[asyncio.Task[Decision]] = set()

    @property
    def client_family(self) -> str:
        if self._family is None:
            self._family = self.proxy.policy.family(self.software_name, self.client_id, self.listener.name)
            self.log = self.log.bind(client_family=self._family)
        return self._family

    def forget_family(self) -> None:
        """A new policy may classify the client differently."""
        self._family = None

    # -- life cycle ---------------------------------------------------------------------------

    def client_connected(self, transport: asyncio.Transport) -> None:
        self.client = transport
        transport.set_write_buffer_limits(self.limits.high_water_bytes, self.limits.low_water_bytes)
        # Nothing is read until the broker connection is up: no buffering, no reordering.
        self.pause_reading("client", "connecting")
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
        self.resume_reading("client", "connecting")
        if self._early:
            early, self._early = b"".join(self._early), []
            self.from_client(early)

    def close(self, reason: str, detail: str = "", level: str = "info") -> None:
        if self.closed:
            return
        self.closed = True
        getattr(self.log, level)("connection_closed", reason=reason, detail=detail, in_flight=len(self._order))
        self.metrics.connection_closes.labels(reason).inc()
        for side in self._paused:
            for cause in list(self._paused[side]):
                self.resume_reading(side, cause)
        if self.client is not None:
            self.client.close()
        if self.upstream is not None:
            self.upstream.close()
        if self._upstream_task is not None and not self._upstream_task.done():
            self._upstream_task.cancel()
        for task in list(self._checks):
            task.cancel()
        self.proxy.session_closed(self)

    def drain(self) -> None:
        """Stop reading new requests; close once every in-flight response is delivered."""
        self.draining = True
        self.pause_reading("client", "draining")
        if not self._order:
            self.close("draining", "proxy shutting down")

    # -- backpressure -------------------------------------------------------------------------

    def pause_reading(self, side: str, cause: str) -> None:
        causes = self._paused[side]
        if cause in causes:
            return
        transport = self.client if side == "client" else self.upstream
        if not causes and transport is not None and not transport.is_closing():
            transport.pause_reading()
        causes[cause] = time.monotonic()

    def resume_reading(self, side: str, cause: str) -> None:
        causes = self._paused[side]
        started = causes.pop(cause, None)
        if started is None:
            return
        if cause != "connecting":
            self.metrics.paused_seconds.labels(side).inc(time.monotonic() - started)
        transport = self.client if side == "client" else self.upstream
        if not causes and transport is not None and not transport.is_closing():
            transport.resume_reading()

    # -- client -> broker ---------------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self.upstream is None:
            # Reading is paused until the broker connection is up, but a transport may deliver
            # what it had already read. Keep it unexamined: decisions need the connection.
            self._early.append(data)
            return
        if self.raw_mode:
            self._to_upstream(data)
            return
        try:
            frames = self.requests.feed(data)
        except CodecError as e:
            self.metrics.frame_errors.labels(e.reason, CLIENT_TO_BROKER).inc()
            self.close(e.reason, str(e), level="warning")
            return
        self.partial_since = (self.partial_since or self.last_activity) if self.requests.buffered else None
        if frames:
            self._process(frames)

    def _process(self, frames: list[memoryview]) -> None:
        out: list[memoryview | bytes] = []
        for i, frame in enumerate(frames):
            if self._holding:
                self._held.extend(frames[i:])
                break
            try:
                forward = self._request(frame)
            except CodecError as e:
                self.metrics.frame_errors.labels(e.reason, CLIENT_TO_BROKER).inc()
                self.close(e.reason, str(e), level="warning")
                return
            if self.closed:
                return
            if forward is not None:
                out.append(forward)
        if out:
            self._to_upstream(out[0] if len(out) == 1 else b"".join(out))
        if len(self._order) >= self.limits.max_in_flight:
            self.pause_reading("client", "max_in_flight")
        self._flush()

    def _to_upstream(self, data: bytes | memoryview) -> None:
        if self.upstream is not None:
            self.upstream.write(data)

    def _request(self, frame: memoryview) -> bytes | memoryview | None:
        """Book-keep one request; what to forward (the frame, or a reduced one), None if nothing."""
        body = frame[4:]
        head = peek_request(body)
        key, version = head.api_key, head.api_version
        self.metrics.count_frame(key, CLIENT_TO_BROKER, len(frame))
        if self.client_id is None and key != SASL_HANDSHAKE:
            self.client_id = peek_client_id(body) or ""
            self.log = self.log.bind(client_id=self.client_id)
        if key == PRODUCE:
            acks, txn_id_null = produce_acks_and_txn_id_null(body, head)
            if not txn_id_null and self.proxy.guard.wants(key, version):
                return self._verify(frame, head, self.proxy.guard.check_produce(self, frame, version),
                                    expect_response=acks != 0)
            if acks == 0:
                return frame  # no response will come, so it never enters the queue
        elif key == TXN_OFFSET_COMMIT and self.proxy.guard.wants(key, version):
            return self._verify(frame, head, self.proxy.guard.check_txn_offset_commit(self, frame, version),
                                expect_response=True)
        action = self._classify(frame, body, head)
        if action is None:
            return None  # answered here, or held for verification
        entry = InFlight(head.correlation_id, key, version, action, time.monotonic())
        if action == OBSERVE:
            entry.context = self.proxy.guard.observe_request(key, version, body)
        self._order.append(entry)
        self._forwarded.append(entry)
        if self.proxy.debug:
            self.log.debug("request", api=schemas.api_name(key), version=version, correlation_id=head.correlation_id)
        return frame

    def _classify(self, frame: memoryview, body: memoryview, head: RequestHead) -> int | None:
        """What to do with a request's response (an action), or None if the proxy took the request."""
        key, version = head.api_key, head.api_version
        if key in OBSERVED:
            return OBSERVE
        if key == API_VERSIONS:
            if version > api_versions.proxy_api_versions_range()[1]:
                # A broker answers a too-new ApiVersions with v0 and UNSUPPORTED_VERSION (KIP-511).
                self._answer(head.correlation_id, key, version, api_versions_unsupported(
                    head.correlation_id, self.proxy.advertised_api_versions()), "unsupported_version")
                return None
            self._note_client_software(body, version)
            return REWRITE_API_VERSIONS
        if addresses.carries_addresses(key, version):
            return REWRITE_ADDRESSES
        return {SASL_HANDSHAKE: SASL_HANDSHAKE_DONE, SASL_AUTHENTICATE: SASL_AUTH_DONE}.get(key, PASS)

    def _verify(self, frame: memoryview, head: RequestHead, check: Decision | Coroutine[Any, Any, Decision],
                expect_response: bool) -> bytes | memoryview | None:
        """Apply a verification's decision: now when the guard decided alone, else once it has asked.

        While a check waits on a coordinator or leader, the connection is held (reading paused,
        later frames queued) so that requests still reach the broker in the client's order.
        """
        entry = InFlight(head.correlation_id, head.api_key, head.api_version, PASS, time.monotonic())
        if expect_response:
            self._order.append(entry)
        if isinstance(check, Decision):
            return self._apply(check, entry, expect_response)
        self._holding = True
        self.pause_reading("client", "verification")
        task = asyncio.get_running_loop().create_task(check)
        task.add_done_callback(lambda t: self._decided(t, entry, expect_response))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)
        return None

    def _decided(self, task: asyncio.Task[Decision], entry: InFlight, expect_response: bool) -> None:
        if self.closed or task.cancelled():
            return
        error = task.exception()
        if error is not None:
            reason = getattr(error, "reason", "verification_error")
            self.log.error("verification_error", error=repr(error), api=schemas.api_name(entry.api_key))
            self.close(reason, f"verifying a request failed: {error!r}", level="warning")
            return
        forward = self._apply(task.result(), entry, expect_response)
        if self.closed:
            return
        if forward is not None:
            self._to_upstream(forward)
        self._holding = False
        self.resume_reading("client", "verification")
        held, self._held = self._held, []
        if held:
            self._process(held)
        else:
            self._flush()

    def _apply(self, decision: Decision, entry: InFlight, expect_response: bool) -> bytes | memoryview | None:
        """Book-keep a decision; what to forward (None: answered here, or the connection closed)."""
        if decision.rejections and not expect_response:
            # acks=0 has no response to carry an error: the broker closes the connection instead.
            self.close("rejected_without_response", "a transactional acks=0 write failed verification",
                       level="warning")
            return None
        if decision.forward is None:
            if expect_response:
                entry.response = decision.local_response
                self.metrics.local_responses.labels(schemas.api_name(entry.api_key), "verification").inc()
            return None
        entry.sent_at = time.monotonic()
        entry.context = decision
        if decision.rejections:
            entry.action = MERGE_PRODUCE
        elif addresses.carries_addresses(entry.api_key, entry.api_version):
            entry.action = REWRITE_ADDRESSES
        if expect_response:
            self._forwarded.append(entry)
        return decision.forward

    def _note_client_software(self, body: memoryview, version: int) -> None:
        if version < 3:
            return
        try:
            _, req = schemas.decode_request(body)
        except CodecError:
            return  # the broker will judge the request; we only wanted names for the logs
        self.software_name = str(req.client_software_name)
        self.software_version = str(req.client_software_version)
        self._family = None
        self.log = self.log.bind(client_software=req.client_software_name,
                                 client_software_version=req.client_software_version)

    def _answer(self, correlation_id: int, api_key: int, api_version: int, response: bytes, reason: str) -> None:
        entry = InFlight(correlation_id, api_key, api_version, PASS, time.monotonic())
        entry.response = response
        self._order.append(entry)
        self.metrics.local_responses.labels(schemas.api_name(api_key), reason).inc()
        self.log.info("answered_locally", api=schemas.api_name(api_key), version=api_version,
                      correlation_id=correlation_id, reason=reason)

    # -- broker -> client ---------------------------------------------------------------------

    def from_upstream(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self.raw_mode:
            assert self.client is not None
            self.client.write(data)
            return
        try:
            frames = self.responses.feed(data)
            for frame in frames:
                self._response(frame)
        except CodecError as e:
            self.metrics.frame_errors.labels(e.reason, BROKER_TO_CLIENT).inc()
            self.close(e.reason, f"broker response: {e}", level="warning")
            return
        self._flush()

    def _response(self, frame: memoryview) -> None:
        body = frame[4:]
        correlation_id = peek_correlation_id(body)
        if not self._forwarded:
            raise _ProtocolBreak(f"response {correlation_id} with no request in flight")
        entry = self._forwarded.popleft()
        if entry.correlation_id != correlation_id:
            raise _ProtocolBreak(f"response {correlation_id} arrived for request {entry.correlation_id}")
        self.metrics.observe_rtt(entry.api_key, time.monotonic() - entry.sent_at)
        self.metrics.count_frame(entry.api_key, BROKER_TO_CLIENT, len(frame))
        if entry.context is not None and entry.action != OBSERVE and entry.context.evidence_at is not None:
            self.metrics.verification_window.labels(entry.context.evidence).observe(
                (time.perf_counter() - entry.context.evidence_at) * 1000)
        if entry.action == PASS:
            entry.response = frame
        elif entry.action == REWRITE_ADDRESSES:
            entry.response = self._rewrite_addresses(entry, frame)
        elif entry.action == REWRITE_API_VERSIONS:
            entry.response = self._rewrite_api_versions(entry, frame)
        elif entry.action == OBSERVE:
            entry.response = frame
            self.proxy.guard.observe_response(entry.api_key, entry.api_version, entry.context, frame)
        elif entry.action == MERGE_PRODUCE:
            entry.response = self._merge_produce(entry, frame)
        else:
            entry.response = frame
            self._sasl_progress(entry, body)

    def _rewrite_addresses(self, entry: InFlight, frame: memoryview) -> bytes | memoryview:
        header, body = schemas.decode_response(frame[4:], entry.api_key, entry.api_version)
        self.proxy.learn_brokers(addresses.broker_addresses(entry.api_key, body))
        new = addresses.rewrite_addresses(entry.api_key, body, self.proxy.client_address_for)
        if new is body:
            return frame
        self.metrics.rewrites.labels(schemas.api_name(entry.api_key), "addresses").inc()
        return schemas.encode(header, new)

    def _merge_produce(self, entry: InFlight, frame: memoryview) -> bytes:
        """The broker's answer for the forwarded partitions plus the proxy's rejections, in request order."""
        decision: Decision = entry.context
        header, broker = schemas.decode_response(frame[4:], entry.api_key, entry.api_version)
        merged = merged_produce_response(decision.request, decision.api_version, broker, decision.rejections)
        if addresses.carries_addresses(entry.api_key, entry.api_version):
            merged = addresses.rewrite_addresses(entry.api_key, merged, self.proxy.client_address_for)
        return schemas.encode(header, merged)

    def _rewrite_api_versions(self, entry: InFlight, frame: memoryview) -> bytes | memoryview:
        body = frame[4:]
        # The response header is v0 (correlation id only) for every ApiVersions version. A broker
        # that does not support the request's version answers in v0 with UNSUPPORTED_VERSION.
        if len(body) >= 6 and int.from_bytes(body[4:6], "big", signed=True) == ErrorCode.unsupported_version:
            return frame
        header, decoded = schemas.decode_response(body, entry.api_key, entry.api_version)
        self.proxy.remember_broker_api_versions(decoded)
        new = api_versions.intersect(decoded, self.proxy.version_policy)
        if new is decoded:
            return frame
        self.metrics.rewrites.labels("api_versions", "intersect").inc()
        return schemas.encode(header, new)

    def _sasl_progress(self, entry: InFlight, body: memoryview) -> None:
        _, decoded = schemas.decode_response(body, entry.api_key, entry.api_version)
        if decoded.error_code != ErrorCode.none:
            return
        if entry.action == SASL_HANDSHAKE_DONE and entry.api_version == 0:
            # SASL v0: raw, header-less tokens follow. Nothing more to inspect on this connection.
            self._raw_mode_after_flush = True
        elif entry.action == SASL_AUTH_DONE:
            self.requests.max_frame = self.limits.max_frame_bytes
            self.log.debug("authenticated")

    _raw_mode_after_flush = False

    def _flush(self) -> None:
        if self.client is None:
            return
        out: list[bytes | memoryview] = []
        order = self._order
        while order and order[0].response is not None:
            out.append(order.popleft().response)  # type: ignore[arg-type]
        if out:
            self.client.write(out[0] if len(out) == 1 else b"".join(out))
            if self.proxy.response_observer is not None:
                self.proxy.response_observer(out)
        if self._raw_mode_after_flush and not order:
            self._enter_raw_mode()
        if len(order) < self.limits.max_in_flight:
            self.resume_reading("client", "max_in_flight")
        if self.draining and not order:
            self.close("draining", "proxy shutting down")

    def _enter_raw_mode(self) -> None:
        self.raw_mode = True
        self._raw_mode_after_flush = False
        self.log.info("raw_mode", reason="sasl_handshake_v0")
        leftover = self.requests.take_buffered()
        if leftover:
            self._to_upstream(leftover)

    # -- housekeeping -------------------------------------------------------------------------

    def check_timers(self, now: float) -> None:
        if self.closed:
            return
        if self.partial_since is not None and now - self.partial_since > self.limits.partial_frame_timeout_s:
            self.metrics.frame_errors.labels("partial_frame_timeout", CLIENT_TO_BROKER).inc()
            self.close("partial_frame_timeout",
                       f"{self.requests.buffered} bytes of an incomplete frame for "
                       f"{self.limits.partial_frame_timeout_s}s", level="warning")
        elif not self._order and now - self.last_activity > self.limits.idle_timeout_s:
            self.close("idle", f"no traffic for {self.limits.idle_timeout_s}s")


class _ProtocolBreak(CodecError):
    reason = "response_out_of_order"

"""The proxy's own Kafka connections: Metadata refreshes now, coordinator queries next.

Never a client's connection: the proxy's requests use their own sockets, their
own correlation ids and (when configured) their own TLS, so nothing the proxy
asks can ever interleave with a client's in-flight requests.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import scramp
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from txnguard.codecs import schemas
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import FrameSplitter
from txnguard.proxy.config import SaslMechanism

if TYPE_CHECKING:
    from txnguard.proxy.config import UpstreamAuth

CLIENT_ID = "txnguard-proxy"


class UpstreamError(ConnectionError):
    """A broker could not be reached or broke the connection."""


class UpstreamAuthError(UpstreamError):
    """The broker refused the proxy's own SASL authentication; `code` is Kafka's error code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class UnsupportedApi(Exception):
    """The broker does not list this API (or this version of it) in its ApiVersions: the request was not sent.

    A definite answer, never "no answer yet": a broker closes the connection on an API key it does not
    know (Kafka 2.8 on DescribeTransactions: `Unexpected api key: 65`), and asking again changes nothing.
    """

    def __init__(self, api_key: int, version: int, offered: tuple[int, int] | None) -> None:
        super().__init__(f"the broker offers API {api_key} v{offered[0]}-v{offered[1]}, not v{version}" if offered
                         else f"the broker's ApiVersions does not list API {api_key}")
        self.api_key = api_key
        self.version = version
        self.offered = offered


ApiRanges = dict[int, tuple[int, int]]
# A callback for an answer: (the response frame without its length, None), or (None, the error).
Answered = Callable[[memoryview | None, Exception | None], None]
# (correlation id, api key, version, the future or callback its answer goes to, deadline (loop time), timeout)
_Waiter = tuple[int, int, int, "asyncio.Future[Any] | Answered", float, float]


class BrokerConnection(asyncio.Protocol):
    """One pipelined connection; responses are matched to requests in order.

    `api_versions` is what the broker listed in its ApiVersions answer on this connection (None until
    asked, or when the answer could not be read): a request outside it is never sent (`UnsupportedApi`).
    """

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._splitter = FrameSplitter()
        self._waiting: deque[_Waiter] = deque()
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        self.closed = self._loop.create_future()
        self.api_versions: ApiRanges | None = None
        # One timer watches every waiter's deadline (armed for the earliest), not one timer per request: the log
        # follower asks several times per transaction, and a timer armed and cancelled each time was a good part
        # of a round's cost.
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_at = 0.0

    async def learn_api_versions(self, timeout: float) -> ApiRanges | None:
        """Ask ApiVersions (v3, every broker from 2.4 answers it) once; None when the answer is unreadable."""
        if self.api_versions is None:
            try:
                resp = await self.request(ApiVersionsRequest(client_software_name="txnguard",
                                                             client_software_version="proxy"), timeout)
            except CodecError:
                return None
            if resp.error_code == ErrorCode.none:
                self.api_versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                                     for k in resp.api_keys}
        return self.api_versions

    def supports(self, api_key: int, version: int) -> bool:
        """Listed by the broker (True while its list is unknown: the broker judges, as before)."""
        if self.api_versions is None:
            return True
        offered = self.api_versions.get(api_key)
        return offered is not None and offered[0] <= version <= offered[1]

    @classmethod
    async def open(
        cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None, timeout: float = 10.0,
        auth: UpstreamAuth | None = None,
    ) -> BrokerConnection:
        """Connect (TLS when given a context) and, with `auth`, authenticate as the proxy's own principal."""
        proto = await cls._connect(host, port, ssl_context, timeout)
        if auth is not None:
            try:
                await proto._authenticate(auth, timeout)
            except BaseException:
                proto.close()
                raise
        return proto

    @classmethod
    async def _connect(cls, host: str, port: int, ssl_context: ssl.SSLContext | None,
                       timeout: float) -> BrokerConnection:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(cls, host, port, ssl=ssl_context,
                                       server_hostname=host if ssl_context else None),
                timeout,
            )
        except (TimeoutError, OSError, ssl.SSLError) as e:
            raise UpstreamError(f"cannot connect to {host}:{port}: {e!r}") from e
        return proto

    async def _authenticate(self, auth: UpstreamAuth, timeout: float) -> None:
        """SaslHandshake v1 then SaslAuthenticate v2 (KIP-152), as Kafka's own clients do.

        SCRAM through scramp (RFC 5802/7677, the server's signature checked, so a broker that does not
        know the password cannot pass itself off); PLAIN in one message. The password is read here, per
        connection, and never logged: errors name the user and the mechanism only.
        """
        who = f"{auth.principal} ({auth.mechanism})"
        hs = await self.request(SaslHandshakeRequest(mechanism=auth.mechanism.value), timeout)
        if hs.error_code != ErrorCode.none:
            raise UpstreamAuthError(f"SASL as {who}: the broker offers only {', '.join(hs.mechanisms)}",
                                    int(hs.error_code))
        if auth.mechanism is SaslMechanism.PLAIN:
            await self._sasl_step(f"\0{auth.username}\0{auth.secret()}".encode(), who, timeout)
            return
        scram = scramp.ScramClient([auth.mechanism.value], auth.username, auth.secret())
        server_first = await self._sasl_step(scram.get_client_first().encode(), who, timeout)
        try:
            scram.set_server_first(server_first.decode())
            server_final = await self._sasl_step(scram.get_client_final().encode(), who, timeout)
            scram.set_server_final(server_final.decode())
        except (scramp.ScramException, UnicodeDecodeError) as e:
            raise UpstreamAuthError(f"SASL as {who}: the broker's SCRAM answer does not check out: {e}",
                                    int(ErrorCode.sasl_authentication_failed)) from None

    async def _sasl_step(self, auth_bytes: bytes, who: str, timeout: float) -> bytes:
        resp = await self.request(SaslAuthenticateRequest(auth_bytes=auth_bytes), timeout)
        if resp.error_code != ErrorCode.none:
            raise UpstreamAuthError(f"SASL as {who} refused: {resp.error_message or 'no message'}",
                                    int(resp.error_code))
        return bytes(resp.auth_bytes)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._splitter.feed(data)
        except CodecError as e:
            self._fail(UpstreamError(f"bad frame from broker: {e}"))
            return
        for frame in frames:
            body = frame[4:]
            (correlation_id,) = struct.unpack_from(">i", body, 0)
            if not self._waiting:
                self._fail(UpstreamError(f"unexpected response {correlation_id}"))
                return
            want, api_key, api_version, handler, _, _ = self._waiting.popleft()
            if want != correlation_id:
                self._fail(UpstreamError(f"response {correlation_id} arrived for request {want}"))
                return
            if not isinstance(handler, asyncio.Future):
                handler(body, None)  # an answer for a callback: handled here, in the read's turn
            elif not handler.done():
                handler.set_result((api_key, api_version, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(UpstreamError(f"broker closed the connection: {exc!r}"))

    def _fail(self, error: Exception) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if not self.closed.done():
            self.closed.set_result(None)  # first: a callback told of the error cannot send on this connection
        while self._waiting:
            handler = self._waiting.popleft()[3]
            if not isinstance(handler, asyncio.Future):
                handler(None, error)
            elif not handler.done():
                handler.set_exception(error)
                # The waiter may be gone (timed out, cancelled at shutdown): mark the exception
                # retrieved so asyncio does not print "Future exception was never retrieved".
                handler.exception()
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        self._fail(UpstreamError("closed by the proxy"))

    @property
    def is_open(self) -> bool:
        return not self.closed.done()

    async def request(self, payload: Any, timeout: float = 10.0) -> Any:
        """Send one request; return kio's decoded response body."""
        api_key, api_version, body = await self.request_raw(payload, timeout)
        return schemas.decode_response(body, api_key, api_version)[1]

    async def request_raw(self, payload: Any, timeout: float = 10.0) -> tuple[int, int, memoryview]:
        """Send one request; return (api key, version, response frame without its length)."""
        api_key, version = int(payload.__api_key__), int(payload.__version__)
        body = await self.request_encoded(
            api_key, version, lambda correlation_id: schemas.encode_request(payload, correlation_id, CLIENT_ID),
            timeout)
        return api_key, version, body

    async def request_encoded(self, api_key: int, version: int, encode: Callable[[int], bytes],
                              timeout: float = 10.0) -> memoryview:
        """Send one request that `encode(correlation_id)` writes whole (length prefix included; the log follower
        packs its Fetch by hand); return the response frame without its length. Past the timeout every waiter
        fails: a late answer would desynchronise the pipeline, so the connection is dropped. A waiter cancelled
        meanwhile cancels only its future; its answer, when it comes, is still matched to it and dropped."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        self.send_encoded(api_key, version, encode, timeout, fut)
        answer: tuple[int, int, memoryview] = await fut
        return answer[2]

    def send_encoded(self, api_key: int, version: int, encode: Callable[[int], bytes], timeout: float,
                     handler: asyncio.Future[Any] | Answered) -> None:
        """Send one request, its answer to `handler`: a future (`request_encoded`) or a callback called with
        (the response frame without its length, None) in the turn that read it, or (None, the error) when the
        connection fails or the deadline passes first (the log follower's long poll: no task woken per round).
        Raises UpstreamError / UnsupportedApi at once, as `request_encoded`."""
        if not self.is_open or self._transport is None:
            raise UpstreamError("connection is closed")
        if not self.supports(api_key, version):
            assert self.api_versions is not None
            raise UnsupportedApi(api_key, version, self.api_versions.get(api_key))
        correlation_id = next(self._ids)
        frame = encode(correlation_id)
        deadline = self._loop.time() + timeout
        self._waiting.append((correlation_id, api_key, version, handler, deadline, timeout))
        self._transport.write(frame)
        if self._watchdog is None or deadline < self._watchdog_at:
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog, self._watchdog_at = self._loop.call_at(deadline, self._check_deadlines), deadline

    def _check_deadlines(self) -> None:
        """The watchdog: fail every waiter once one still waited for is past its deadline; else armed again for
        the earliest (a waiter whose future was cancelled is not waited for)."""
        self._watchdog = None
        now = self._loop.time()
        earliest: tuple[float, float] | None = None
        for _, _, _, handler, deadline, timeout in self._waiting:
            if isinstance(handler, asyncio.Future) and handler.done():
                continue
            if earliest is None or deadline < earliest[0]:
                earliest = (deadline, timeout)
        if earliest is None:
            return
        if earliest[0] <= now:
            self._fail(UpstreamError(f"no response within {earliest[1]}s"))
        else:
            self._arm(earliest[0])


class BrokerConnections:
    """The proxy's own connections, one per broker address, reused while open.

    Opening is single-flight: questions that need the same broker while its connection is being
    opened wait for that one attempt instead of opening one each (a burst of verifications after a
    coordinator moved would otherwise open a connection per question). Addresses are (host, port)
    pairs (config.HostPort).
    """

    def __init__(self, *, ssl_context: Any = None, connect_timeout_s: float = 10.0,
                 auth: UpstreamAuth | None = None, on_open: Any = None, on_versions: Any = None) -> None:
        self.ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self.auth = auth
        self.on_open = on_open  # called after each successful open (e.g. SASL proved)
        # Every connection asks the broker's ApiVersions right after it opens (a broker restarted with
        # another version answers differently: a rolling upgrade), and calls this with (address, ranges).
        self.on_versions = on_versions
        self._open: dict[Any, BrokerConnection] = {}
        self._opening: dict[Any, asyncio.Future[BrokerConnection]] = {}

    def ready(self, address: Any) -> BrokerConnection | None:
        """The open connection to `address`, if there is one (no await: the follower's every round asks)."""
        conn = self._open.get(address)
        return conn if conn is not None and conn.is_open else None

    async def get(self, address: Any) -> BrokerConnection:
        conn = self._open.get(address)
        if conn is not None and conn.is_open:
            return conn
        pending = self._opening.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[BrokerConnection] = asyncio.get_running_loop().create_future()
        self._opening[address] = fut
        try:
            conn = await BrokerConnection.open(address.host, address.port, ssl_context=self.ssl_context,
                                               timeout=self.connect_timeout_s, auth=self.auth)
            if self.on_open is not None:
                self.on_open()
            try:
                ranges = await conn.learn_api_versions(self.connect_timeout_s)
            except BaseException:
                conn.close()
                raise
            if self.on_versions is not None and ranges is not None:
                self.on_versions(address, ranges)
            self._open[address] = conn
            fut.set_result(conn)
            return conn
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: the waiters (if any) re-raise it
            raise
        finally:
            del self._opening[address]

    def drop(self, address: Any) -> None:
        """Close this broker's connection (it stopped answering): the next question opens a fresh one."""
        conn = self._open.pop(address, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._open.values():
            conn.close()
        self._open.clear()

"""The proxy process: listeners, the cluster's layout, background upkeep, draining.

Gateway mode: a bootstrap listener plus one listener per broker (port base +
node id, or an explicit mapping), opened as soon as any response names a new
broker, so the client's next connection finds it. Every address a client can
learn is rewritten to one of these listeners.

Sidecar mode: one listener in front of one broker, which advertises the
sidecar's address itself (see deploy/sidecar/README.md); responses keep the
addresses the broker wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.metadata.v9.request import MetadataRequest

from txnguard.codecs import addresses, native
from txnguard.codecs.addresses import AddressUnavailable
from txnguard.codecs.api_versions import VersionPolicy, advertised_range
from txnguard.codecs.errors import CodecError
from txnguard.policies.policy import policy_from_config
from txnguard.proxy import audit_sink, hanging_monitor, logs
from txnguard.proxy.config import HostPort, LogLevel, ProxyConfig, ProxyMode
from txnguard.proxy.guard import TransactionGuard
from txnguard.proxy.kafka_client import BrokerConnection, UpstreamAuthError, UpstreamError
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.proxy.session import ClientProtocol, Session
from txnguard.proxy.tasks import cancel_and_wait
from txnguard.proxy.tls import server_ssl_context, upstream_ssl_context
from txnguard.verification.access import missing_acl
from txnguard.verification.capabilities import LACKS_API, UNREAD

TLS_HANDSHAKE = 0x16
# /readyz's reasons, each a label of txnguard_not_ready (exported at 0 from the start).
LOG_CATCHING_UP = "transaction_log_catching_up"
NATIVE_MISSING_NOTE = "no native data path: the general path reads every frame (txnguard_native_data_path 0)"
NOT_READY_REASONS = ("draining", "not_authorized", "no_metadata", "stale_metadata", UNREAD, LACKS_API, LOG_CATCHING_UP)
API_VERSIONS_FIRST_RETRY_S = 0.25  # a broker whose ApiVersions could not be read: retried after this, doubling


@dataclass
class Listener:
    name: str
    address: HostPort
    node_id: int | None           # None: the bootstrap listener
    sock: socket.socket
    task: asyncio.Task[None] | None = None
    sessions: set[Session] = field(default_factory=set)


class Proxy:
    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or ProxyMetrics()
        self.log = logs.get(component="proxy", mode=config.mode)
        self.debug = config.log_level is LogLevel.DEBUG
        self.version_policy = VersionPolicy(unknown_keys=config.unknown_api_keys,
                                            max_version=dict(config.api_max_versions),
                                            hide_transaction_version_2=config.hide_transaction_version_2)
        self.server_ssl = server_ssl_context(config)
        self.upstream_ssl = upstream_ssl_context(config)
        self.policy = policy_from_config(config.policy.as_mapping())
        self.guard = TransactionGuard(config, self.metrics, self.policy, self.upstream_ssl)
        self.listeners: dict[int | None, Listener] = {}
        self._unavailable_listeners: set[int] = set()  # brokers whose listener could not open (logged once)
        self.sessions: set[Session] = set()
        self.brokers: dict[int, HostPort] = {}          # node id -> the broker's real address
        self._broker_api_versions: dict[int, tuple[int, int]] = {}
        self.last_metadata_ok: float | None = None
        self.started_at = time.monotonic()
        # /readyz as a metric: TxnguardNotReady fires for every reason /readyz gives (a proxy that never
        # reached its cluster, stale metadata, its own principal lacking a right, a broker's APIs), not only
        # stale metadata; txnguard_not_ready{reason} says which.
        self.metrics.ready.set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        for reason in NOT_READY_REASONS:
            self.metrics.not_ready.labels(reason).set_function(functools.partial(self._not_ready_because, reason))
        # What each broker lacks decides readiness: read at start and for each broker Metadata names
        # (`_read_api_versions`), not first when a client's write needs it.
        follower = self.guard.follower
        self.guard.verifier.capabilities.watch(config.upstream, sidecar=config.mode is ProxyMode.SIDECAR,
                                               enforcing=self._may_refuse,
                                               log_evidence=(lambda: follower.gives_evidence) if follower else None)
        if follower is not None:
            follower.on_usable = self.guard.verifier.capabilities.reconsider
        self._api_version_reads: dict[HostPort, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._serving: set[asyncio.Task[None]] = set()
        self._bootstrap_rr = 0
        self.stopping = False
        self.audit_publisher: audit_sink.AuditPublisher | None = None
        self.hanging: hanging_monitor.HangingMonitor | None = None
        # Sees every batch of bytes written to clients; tests use it to prove no broker address leaks.
        self.response_observer: Callable[[list[bytes | memoryview]], None] | None = None

    # -- start and stop -------------------------------------------------------------------------

    async def start(self) -> None:
        self._open_listener(None, self.config.listen)
        port = self.bootstrap_address.port
        self.audit_publisher = audit_sink.attach(self.config, self.metrics, self.guard.audit, port)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._metadata_loop()))
        self._tasks.append(loop.create_task(self._timer_loop()))
        self.hanging = hanging_monitor.attach(self.config, self.metrics, self.guard.audit, self.upstream_ssl,
                                              self.guard.follower)
        if self.hanging is not None:  # health.hanging_scan_interval_s: the periodic hanging-transaction scan
            self._tasks.append(loop.create_task(self.hanging.run()))
        for target in self.config.upstream:
            self.read_api_versions(target)
        if self.guard.follower is not None:
            if self.config.mode is ProxyMode.SIDECAR:
                # Its own broker's partitions straight from the broker (readiness waits for those only); the
                # others through the sidecars Metadata names, as the verifier asks them.
                upstream = self.config.upstream[0]
                self.guard.follower.local = lambda a: upstream if self._is_own_listener(a) else None
            self.guard.follower.start()
        self.metrics.native_data_path.set(1 if native.AVAILABLE else 0)
        if not native.AVAILABLE:
            self.log.warning("native_data_path_missing", detail=native.MISSING,
                             effect="the general path reads every frame: correct, more CPU per frame")
        self.log.info("proxy_started", listen=str(self.config.listen),
                      upstream=[str(u) for u in self.config.upstream], native_data_path=native.VERSION)

    @property
    def bootstrap_address(self) -> HostPort:
        return self.listeners[None].address

    async def drain_and_stop(self, deadline_s: float | None = None) -> None:
        """SIGTERM: stop accepting, let in-flight requests finish (up to a deadline), close."""
        deadline_s = self.config.limits.drain_timeout_s if deadline_s is None else deadline_s
        self.stopping = True
        for listener in list(self.listeners.values()):
            self._close_listener(listener)
        for s in list(self.sessions):
            s.drain()
        end = time.monotonic() + deadline_s
        while self.sessions and time.monotonic() < end:
            await asyncio.sleep(0.05)
        for s in list(self.sessions):
            s.close("drain_deadline", f"still in flight after {deadline_s}s")
        await self.stop()

    async def stop(self) -> None:
        self.stopping = True
        for listener in list(self.listeners.values()):
            self._close_listener(listener)
        for s in list(self.sessions):
            s.close("proxy_stopped", "proxy stopped")
        await cancel_and_wait([*self._tasks, *self._api_version_reads.values()], self.log)
        self._tasks.clear()
        await self.guard.close()
        await audit_sink.detach(self.audit_publisher, self.config)  # bounded: audit.flush_timeout_s
        self.log.info("proxy_stopped")

    def reload_policy(self, raw: Any) -> None:
        """SIGHUP: swap the policy object; connections and the registry stay."""
        self.policy = policy_from_config(raw)
        self.guard.policy = self.policy
        for s in self.sessions:
            s.forget_family()
        self.guard.verifier.capabilities.reconsider()  # monitor <-> enforce: an enforcing sidecar's readiness
        self.log.info("policy_reloaded", mode=self.policy.enforcement.default.value,
                      rules=len(self.policy.enforcement.rules))

    # -- listeners --------------------------------------------------------------------------------

    def _open_listener(self, node_id: int | None, address: HostPort) -> Listener:
        sock = socket.socket(socket.AF_INET6 if ":" in address.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot listen on {address}: {e.strerror}") from None
        sock.listen(1024)
        sock.setblocking(False)
        bound = HostPort(address.host, sock.getsockname()[1])
        name = "bootstrap" if node_id is None else f"broker-{node_id}"
        listener = Listener(name, bound, node_id, sock)
        listener.task = asyncio.get_running_loop().create_task(self._accept_loop(listener))
        self.listeners[node_id] = listener
        self.metrics.listeners.set(len(self.listeners))
        self.log.info("listener_opened", listener=name, address=str(bound))
        return listener

    def _close_listener(self, listener: Listener) -> None:
        if listener.task is not None:
            listener.task.cancel()
        listener.sock.close()
        self.listeners.pop(listener.node_id, None)

    def ensure_broker_listener(self, node_id: int) -> HostPort:
        """Our listener for broker `node_id`, opened on first need. Its port taken (the admin server, another
        process): AddressUnavailable, logged once per broker, and the connection that needed it closes with
        that reason (a client given that port would reach whatever holds it)."""
        listener = self.listeners.get(node_id)
        if listener is None:
            if self.stopping:
                return HostPort(self.config.advertised, self.config.broker_port(node_id))
            address = HostPort(self.config.listen.host, self.config.broker_port(node_id))
            try:
                listener = self._open_listener(node_id, address)
            except OSError as e:
                if node_id not in self._unavailable_listeners:
                    self._unavailable_listeners.add(node_id)
                    self.log.error("broker_listener_unavailable", node_id=node_id, address=str(address),
                                   error=str(e), reason="broker_listener_unavailable",
                                   hint="give this broker a free port (broker_ports or broker_port_base), or "
                                        "move what listens there (the admin address?)")
                raise AddressUnavailable(f"no listener for broker {node_id}: {e}") from None
            self._unavailable_listeners.discard(node_id)
        return listener.address

    async def _accept_loop(self, listener: Listener) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listener.sock)
            except asyncio.CancelledError:
                raise
            except OSError as e:
                self.log.warning("accept_failed", listener=listener.name, error=repr(e))
                await asyncio.sleep(0.1)
                continue
            if len(self.sessions) >= self.config.limits.max_connections:
                self.metrics.connection_closes.labels("max_connections").inc()
                self.log.warning("connection_refused", reason="max_connections", client=f"{peer[0]}:{peer[1]}")
                conn.close()
                continue
            # Keep a reference: the loop holds tasks only weakly.
            task = loop.create_task(self._serve(listener, conn, f"{peer[0]}:{peer[1]}"))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, listener: Listener, conn: socket.socket, peer: str) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = Session(self, listener, peer)
        if self.server_ssl is not None and not await self._looks_like_tls(conn, session):
            return
        self.sessions.add(session)
        self.metrics.connections_total.labels(listener.name).inc()
        self.metrics.connections_active.labels(listener.name).inc()
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: ClientProtocol(session), conn, ssl=self.server_ssl,
                ssl_handshake_timeout=self.config.limits.connect_timeout_s if self.server_ssl else None,
            )
        except (TimeoutError, OSError, ssl.SSLError) as e:
            session.close("tls_handshake_failed", repr(e), level="warning")
            conn.close()

    async def _looks_like_tls(self, conn: socket.socket, session: Session) -> bool:
        """Peek the first byte: a plaintext Kafka client on a TLS listener gets a clear log line."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), readable)
        try:
            await asyncio.wait_for(ready, self.config.limits.connect_timeout_s)
            first = conn.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            first = b""
        finally:
            loop.remove_reader(conn.fileno())
        if first and first[0] == TLS_HANDSHAKE:
            return True
        reason = "plaintext_on_tls" if first else "no_tls_handshake"
        self.metrics.connection_closes.labels(reason).inc()
        session.log.warning("connection_closed", reason=reason,
                            detail="the client did not start a TLS handshake on a TLS listener: "
                                   "is it configured with security.protocol=PLAINTEXT?")
        conn.close()
        return False

    def session_closed(self, session: Session) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            self.metrics.connections_active.labels(session.listener.name).dec()

    # -- upstream ----------------------------------------------------------------------------------

    async def upstream_for(self, listener: Listener) -> list[HostPort]:
        """Where a new client connection may go, in the order to try.

        The bootstrap listener may use any broker: it rotates the start of the list so
        connections spread, and the caller moves on when one refuses (a broker that is down).
        """
        if self.config.mode is ProxyMode.SIDECAR or listener.node_id is None:
            ups = list(self.config.upstream)
            self._bootstrap_rr = (self._bootstrap_rr + 1) % len(ups)
            return ups[self._bootstrap_rr:] + ups[:self._bootstrap_rr]
        address = self.brokers.get(listener.node_id)
        if address is None:
            await self.refresh_metadata()
            address = self.brokers.get(listener.node_id)
        if address is None:
            raise UpstreamError(f"broker {listener.node_id} is not in the cluster's metadata")
        return [address]

    async def connect_upstream(self, target: HostPort, factory: Callable[[], asyncio.Protocol]) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.create_connection(factory, target.host, target.port, ssl=self.upstream_ssl,
                                       server_hostname=target.host if self.upstream_ssl else None),
                self.config.limits.connect_timeout_s,
            )
        except ssl.SSLError as e:
            self.metrics.upstream_connect_failures.labels(str(target)).inc()
            raise ConnectionError(f"TLS handshake with broker {target} failed ({e.reason}): "
                                  "is the broker listener plaintext, or the CA wrong?") from e
        except (TimeoutError, OSError):
            self.metrics.upstream_connect_failures.labels(str(target)).inc()
            raise

    # -- cluster layout ---------------------------------------------------------------------------

    def learn_brokers(self, found: list[tuple[int, str, int]]) -> None:
        if self.config.mode is not ProxyMode.GATEWAY:
            return
        for node_id, host, port in found:
            address = HostPort(host, port)
            if self.brokers.get(node_id) != address:
                self.brokers[node_id] = address
                self.log.info("broker_learned", node_id=node_id, address=str(address))
            with contextlib.suppress(AddressUnavailable):  # logged; a client that needs it is refused then
                self.ensure_broker_listener(node_id)

    def client_address_for(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """The address a client must use for a broker: our listener in gateway mode."""
        if self.config.mode is not ProxyMode.GATEWAY:
            return host, port
        return self.config.advertised, self.ensure_broker_listener(node_id).port

    def remember_broker_api_versions(self, body: Any) -> None:
        self._broker_api_versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys
        }

    def advertised_api_versions(self) -> list[tuple[int, int, int]]:
        out = []
        for key, (lo, hi) in self._broker_api_versions.items():
            r = advertised_range(key, lo, hi, self.version_policy)
            if r is not None:
                out.append((key, r[0], r[1]))
        return out

    def _may_refuse(self) -> bool:
        """Can this proxy refuse a write it cannot verify (verification on, and `enforce` the policy's default
        or a rule's mode)? The current policy's answer: SIGHUP may change it."""
        return self.config.verification.enabled and self.policy.enforcement.may_enforce

    def read_api_versions(self, address: HostPort) -> None:
        """Read `address`'s ApiVersions on the verifier's own connection, once per address, in the background:
        a broker that cannot be reached is retried with backoff (up to `metadata_refresh_s` apart) and start
        never waits for it; meanwhile capabilities say "not read yet" (/readyz, the log)."""
        if self.stopping or address in self._api_version_reads:
            return
        self.guard.verifier.capabilities.expect(address)
        self._api_version_reads[address] = asyncio.get_running_loop().create_task(self._read_api_versions(address))

    async def _read_api_versions(self, address: HostPort) -> None:
        verifier = self.guard.verifier
        delay = API_VERSIONS_FIRST_RETRY_S
        while True:
            try:
                await verifier.read_api_versions(address)
                return
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                verifier.capabilities.unread(address, str(e) or repr(e))
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.metadata_refresh_s)

    def _read_brokers_named_in(self, body: Any) -> None:
        """A broker Metadata names is read too (where the verifier will ask it: a coordinator, a leader). A
        sidecar skips its own listener (its broker is its upstream, read already): it would only relay to it."""
        for _, host, port in addresses.broker_addresses(addresses.METADATA, body):
            address = self.guard.verifier.address_of(host, port)
            if self.config.mode is ProxyMode.SIDECAR and self._is_own_listener(address):
                continue
            self.read_api_versions(address)

    def _is_own_listener(self, address: HostPort) -> bool:
        """A sidecar's own listener, as its broker advertises it (the address Metadata names for that broker)."""
        own = self.listeners.get(None)
        return own is not None and address.port == own.address.port and \
            address.host in (self.config.advertised, own.address.host)

    async def refresh_metadata(self) -> bool:
        for target in self.config.upstream:
            conn = None
            try:
                conn = await BrokerConnection.open(target.host, target.port, ssl_context=self.upstream_ssl,
                                                   timeout=self.config.limits.connect_timeout_s,
                                                   auth=self.config.upstream_auth)
                body = await conn.request(MetadataRequest(
                    topics=(), allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                    include_topic_authorized_operations=False), timeout=self.config.limits.connect_timeout_s)
            except (UpstreamError, OSError) as e:
                self.log.warning("metadata_refresh_failed", broker=str(target), error=str(e))
                auth = self.config.upstream_auth
                missing = missing_acl("sasl_authenticate", e.code, auth.mechanism) if isinstance(
                    e, UpstreamAuthError) and auth else None
                if missing is not None:  # the proxy's own credentials: /readyz says so
                    self.guard.verifier.access.refused(missing)
                continue
            finally:
                if conn is not None:
                    conn.close()
            if self.config.mode is ProxyMode.GATEWAY:
                self.learn_brokers(addresses.broker_addresses(addresses.METADATA, body))
            self._read_brokers_named_in(body)
            self.last_metadata_ok = time.monotonic()
            if self.config.upstream_auth is not None:
                self.guard.verifier.access.proved(("AUTHENTICATE", "SASL", self.config.upstream_auth.mechanism))
            return True
        return False

    def not_ready(self) -> list[tuple[str, str]]:
        """Every reason /readyz fails now: (its NOT_READY_REASONS label, the sentence), empty when ready."""
        if self.stopping:
            return [("draining", "draining")]
        reasons: list[tuple[str, str]] = []
        why = self.guard.verifier.access.not_ready()  # the proxy's own principal lacks a right it needs
        if why is not None:
            reasons.append(("not_authorized", why))
        if self.last_metadata_ok is None:
            reasons.append(("no_metadata", "no successful Metadata request to the cluster yet"))
        elif (age := time.monotonic() - self.last_metadata_ok) > self.config.ready_max_metadata_age_s:
            reasons.append(("stale_metadata", f"last successful Metadata request {age:.0f}s ago"))
        reasons += [(n.reason, n.text) for n in self.guard.verifier.capabilities.readiness().blocked]
        follower = self.guard.follower
        if follower is not None and not follower.caught_up_once and not follower.denied:
            # Until it has read the log once, the log's evidence is missing: a sidecar would refuse or ask for
            # what it will know in a moment.
            reasons.append((LOG_CATCHING_UP, follower.detail()))
        return reasons

    def _not_ready_because(self, reason: str) -> float:
        return 1.0 if any(code == reason for code, _ in self.not_ready()) else 0.0

    def ready(self) -> tuple[bool, str]:
        """(ready, /readyz's body): every reason it is not, then what the proxy cannot do (ready or not: a
        gateway or a monitoring proxy on 2.8 stays ready and says what it cannot verify)."""
        reasons = self.not_ready()
        if reasons == [("draining", "draining")]:
            return False, "draining"
        notes = list(self.guard.verifier.capabilities.readiness().notes)
        if not native.AVAILABLE:
            notes.append(NATIVE_MISSING_NOTE)
        follower = self.guard.follower
        if follower is not None and follower.problem is not None and (follower.caught_up_once or follower.denied):
            notes.append(follower.detail())  # healthy, it says nothing here: its lag is a metric
        if not reasons:
            return True, "; ".join(["ok", *notes])
        return False, "; ".join([text for _, text in reasons] + notes)

    async def _metadata_loop(self) -> None:
        while True:
            await self.refresh_metadata()
            await asyncio.sleep(self.config.metadata_refresh_s)

    async def _timer_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self._tick()
            except (Exception, native.PanicException) as e:  # noqa: BLE001 - a bug: said, and the next tick runs
                # Without this, one failing tick ended the loop for good: no session's timers, no expiry, no
                # ledger recording by the timer until a restart. A panic in the native registry or EndTxn
                # ledger (their expiry runs here) is a bug like any other.
                self.log.error("timer_tick_failed", error=repr(e), reason="a bug: this tick's work was cut short")

    def _tick(self) -> None:
        """Once a second: the metadata's age, every session's timers, the guard's housekeeping."""
        now = time.monotonic()
        # Never reached: the age counts from the start, so a proxy that never saw its cluster ages too.
        self.metrics.metadata_age.set(now - (self.last_metadata_ok or self.started_at))
        for s in list(self.sessions):
            s.check_timers()
        self.guard.housekeeping()


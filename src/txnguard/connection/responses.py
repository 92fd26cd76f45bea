"""Broker -> client, the general path: responses paired with their requests, read, rewritten or absorbed.

Responses are read as a stream, not as frames (`ResponseReader`, connection/reader.py): a response that
needs no rewrite and is next in order is relayed as it arrives; only responses the core must read
(ApiVersions, addresses, the transaction life cycle, merges, SASL) are assembled and decoded here. The
relay's fast path for responses (connection/relay.py) passes the ones that need none of this.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from txnguard.codecs import addresses, api_versions, node_endpoints, schemas
from txnguard.codecs.lifecycle_scan import AddOffsetsSeen, AddPartitionsSeen
from txnguard.codecs.produce import merged_produce_response
from txnguard.connection.apis import ApiKey, ResponseAction
from txnguard.connection.base import ConnectionBase, ResponseOutOfOrder
from txnguard.connection.commands import (
    Authenticated,
    Chunk,
    Command,
    ConcurrentAbsorbed,
    RawMode,
    Rewritten,
    SendToBroker,
    SendToClient,
    StartTimer,
)
from txnguard.connection.holds import Pause
from txnguard.connection.in_flight import InFlight
from txnguard.connection.modes import Event, Mode

_PASS = ResponseAction.PASS
_NOTHING: list[Chunk] = []  # no responses ready (never appended to)
_RAW_PENDING, _DRAINING, _LINGERING = Mode.RAW_PENDING, Mode.DRAINING, Mode.LINGERING
_END_TXN = ApiKey.END_TXN.value


class ResponseSide(ConnectionBase):
    """Broker -> client on the general path: pairing a response with its request (the reader asks:
    `response_started`, `response_done`), the responses the core must read or rewrite, CONCURRENT_TRANSACTIONS
    absorbed, and what waits for the queue to empty (a byte pipe, draining, lingering)."""

    def response_started(self, size: int, correlation_id: int, out: list[Command]) -> tuple[bool, list[Chunk]]:
        """The reader saw a response's head: pair it with its request, count it (`ResponseReader` asks)."""
        if not self._forwarded:
            raise ResponseOutOfOrder(f"response {correlation_id} with no request in flight")
        entry = self._forwarded.popleft()
        if entry.correlation_id != correlation_id:
            raise ResponseOutOfOrder(f"response {correlation_id} arrived for request {entry.correlation_id}")
        self.traffic.count_out(entry.api_key, size + 4, self._now - entry.sent_at)  # and its round trip
        if entry.evidence is not None:
            self.ledger.windows.append((entry.evidence, (self._now - entry.evidence_at) * 1000))
        self._answering = entry
        if entry.action is not _PASS:
            return False, _NOTHING
        order = self._order
        if order[0] is entry:
            return True, _NOTHING
        ready: list[Chunk] = []  # earlier responses (local answers, buffered ones) may be complete
        self._take_ready(ready)
        return order[0] is entry, ready

    def response_done(self, parts: list[Chunk] | None, out: list[Command]) -> None:
        entry = self._answering
        assert entry is not None
        self._answering = None
        if parts is None:
            self._order.popleft()  # streamed: it was the head of the queue all along
            return
        if entry.action is _PASS:
            entry.response = parts  # complete, waiting its turn
            return
        frame = memoryview(b"".join(parts))
        response = self._rewrite(entry, frame, out)
        if response is not None:
            entry.response = [response]

    def _rewrite(self, entry: InFlight, frame: memoryview, out: list[Command]) -> Chunk | None:
        """The response for the client; None while the request is being asked again."""
        action = entry.action
        if action is ResponseAction.REWRITE_ADDRESSES:
            return self._rewrite_addresses(entry, frame, out)
        if action is ResponseAction.REWRITE_API_VERSIONS:
            return self._rewrite_api_versions(entry, frame, out)
        if action is ResponseAction.OBSERVE:
            concurrent = self.rules.observe_response(entry.api_key, entry.api_version, entry.observed, frame[4:],
                                                     self.clock.wall_ms())
            if concurrent and entry.request is not None:
                return self._absorb(entry, frame, out)
            if entry.retries:
                self._end_absorbing(entry, "absorbed", out)
            return frame
        if action is ResponseAction.MERGE_PRODUCE:
            return self._merge_produce(entry, frame)
        self._sasl_progress(entry, frame[4:], out)
        return frame

    # -- rewriting: addresses, a merged Produce answer, ApiVersions, SASL's progress ---------------------

    def _rewrite_addresses(self, entry: InFlight, frame: memoryview, out: list[Command]) -> Chunk:
        if node_endpoints.endpoints_absent(frame[4:], entry.api_key, entry.api_version):
            return frame  # no broker named: nothing to learn or rewrite (codecs/node_endpoints.py)
        header, body = schemas.decode_response(frame[4:], entry.api_key, entry.api_version)
        self.cluster.learn_brokers(addresses.broker_addresses(entry.api_key, body))
        new = addresses.rewrite_addresses(entry.api_key, body, self.cluster.client_address_for)
        if new is body:
            return frame
        out.append(Rewritten(entry.api_key, "addresses"))
        return schemas.encode(header, new)

    def _merge_produce(self, entry: InFlight, frame: memoryview) -> bytes:
        """The broker's answer for the forwarded partitions plus the proxy's rejections, in request order."""
        decision = entry.merge
        assert decision is not None and decision.context is not None
        header, broker = schemas.decode_response(frame[4:], entry.api_key, entry.api_version)
        merged = merged_produce_response(decision.context.decoded()[1], entry.api_version, broker,
                                         decision.rejections)
        if addresses.carries_addresses(entry.api_key, entry.api_version):
            merged = addresses.rewrite_addresses(entry.api_key, merged, self.cluster.client_address_for)
        return schemas.encode(header, merged)

    def _rewrite_api_versions(self, entry: InFlight, frame: memoryview, out: list[Command]) -> Chunk:
        body = frame[4:]
        # The response header is v0 (correlation id only) for every ApiVersions version. A broker
        # that does not support the request's version answers in v0 with UNSUPPORTED_VERSION.
        if len(body) >= 6 and int.from_bytes(body[4:6], "big", signed=True) == ErrorCode.unsupported_version:
            return frame
        header, decoded = schemas.decode_response(body, entry.api_key, entry.api_version)
        self.cluster.remember_broker_api_versions(decoded)
        new, kind = api_versions.rewrite(decoded, self.cluster.version_policy)
        if kind is None:
            return frame
        out.append(Rewritten(entry.api_key, kind))
        return schemas.encode(header, new)

    def _sasl_progress(self, entry: InFlight, body: memoryview, out: list[Command]) -> None:
        _, decoded = schemas.decode_response(body, entry.api_key, entry.api_version)
        if decoded.error_code != ErrorCode.none:
            return
        if entry.action is ResponseAction.SASL_HANDSHAKE and entry.api_version == 0:
            # SASL v0: raw, header-less tokens follow, once every earlier response is out.
            self._to(Event.SASL_V0)
        elif entry.action is ResponseAction.SASL_AUTHENTICATE:
            self.requests.max_frame = self.settings.max_frame_bytes
            out.append(Authenticated())

    # -- CONCURRENT_TRANSACTIONS absorbed: asked again after a pause (verification/concurrent.py) --------

    def _absorb(self, entry: InFlight, frame: memoryview, out: list[Command]) -> Chunk | None:
        """CONCURRENT_TRANSACTIONS for the whole request: ask again after a short pause, or (the budget
        spent) give the client this answer, as the coordinator gave it."""
        absorbing = self.holds.of(Pause.CONCURRENT_TRANSACTIONS)
        if absorbing is not None and absorbing.entry is not entry:
            # One absorption per connection (one timer, one entry asked again): a second refusal in flight
            # behind it (AddOffsetsToTxn and AddPartitionsToTxn sent back to back) goes back as the
            # coordinator said it, after the first one's answer; the client retries it as it would direct.
            self._end_absorbing(entry, "behind_another", out)  # counted: the client does receive this 51
            return frame
        now = self._now
        if entry.refused_at is None:
            entry.refused_at = now
        waited_ms = (now - entry.refused_at) * 1000
        delay_ms = self.rules.retry_delay_ms(entry.retries, waited_ms)
        if delay_ms is None:
            self._end_absorbing(entry, "budget_spent", out)
            return frame
        if absorbing is None:
            absorbing = self._hold(Pause.CONCURRENT_TRANSACTIONS, entry, out)
        else:
            absorbing.id = self.holds.next_id()
        observed = entry.observed
        txn_id = observed.transactional_id if isinstance(observed, AddPartitionsSeen | AddOffsetsSeen) else None
        out.append(StartTimer(absorbing.id, delay_ms / 1000, txn_id))
        return None

    def _end_absorbing(self, entry: InFlight, ending: str, out: list[Command]) -> None:
        waited_ms = (self._now - entry.refused_at) * 1000 if entry.refused_at is not None else 0.0
        out.append(ConcurrentAbsorbed(entry.api_key, entry.retries, waited_ms, ending))
        entry.request = None
        absorbing = self.holds.of(Pause.CONCURRENT_TRANSACTIONS)
        if absorbing is not None and absorbing.entry is entry:
            self._end_hold(absorbing, out)  # held requests go on after this chunk's responses

    # -- in order to the client, and what waits for an empty queue ---------------------------------------

    def _take_ready(self, to_client: list[Chunk]) -> None:
        order = self._order
        while order and order[0].response is not None:
            to_client.extend(order.popleft().response)  # type: ignore[arg-type]

    def _after_responses(self, out: list[Command], to_client: list[Chunk]) -> None:
        """Send what is ready, then the state changes that wait for an empty queue."""
        order = self._order
        if order and order[0].response is not None:
            self._take_ready(to_client)
        if to_client:
            out.append(SendToClient(to_client))
        if self.mode is _RAW_PENDING and not order and not self.holds:
            self._enter_raw_mode(out)
        if self._paused and len(order) < self.settings.max_in_flight and Pause.MAX_IN_FLIGHT in self._paused:
            self._resume(Pause.MAX_IN_FLIGHT, out)
        if self.mode is _DRAINING:
            self._close_when_drained(out)
        elif self.mode is _LINGERING:
            self._linger_over(out)

    def _enter_raw_mode(self, out: list[Command]) -> None:
        self._to(Event.FLUSHED)
        out.append(RawMode("sasl_handshake_v0"))
        leftover = self.requests.take_buffered()
        if leftover:
            out.append(SendToBroker([leftover]))
        head = self.responses.take_partial_head()
        if head:
            out.append(SendToClient([head]))

    def _close_when_drained(self, out: list[Command]) -> None:
        """Draining (`Connection.drain`): the connection closes once no response is owed the client. The one
        place a drain ends."""
        if self.mode is _DRAINING and not self._order:
            out.append(self._close("draining", "proxy shutting down"))

    # -- the client left while an EndTxn is unanswered (KAFKA-17754, verification/in_doubt.py) ----------

    def _end_txns_unanswered(self) -> bool:
        # An EndTxn entry observes its SentEndTxn while the defence is on (None when off).
        self._spill()
        return any(e.api_key == _END_TXN and e.observed is not None for e in self._forwarded)

    def _linger_over(self, out: list[Command]) -> None:
        if self.mode is _LINGERING and not self._end_txns_unanswered():
            out.append(self._close("client_closed", "the EndTxn the client left unanswered was answered", "info"))

"""One client connection and its broker connection, as a pure state machine.

Bytes from either side, the verifier's answers, timers and the shell's own events go in (the methods of
`Connection`); commands come out. The connection is built in layers, one module each:

    base.py       ConnectionBase: what a connection knows (the splitter, the response reader, the in-order
                  queue, holds, mode, who the client is), pausing, closing, holds beginning and ending
    responses.py  ResponseSide: broker -> client on the general path (pairing, rewriting, merging,
                  CONCURRENT_TRANSACTIONS absorbed, what waits for an empty queue, draining's end)
    requests.py   RequestSide: client -> broker on the general path (peeked, checked, held, answered here,
                  cut through, forwarded)
    relay.py      the fast paths, both ways: frames that need no reading, booked in one loop per read
    core.py       Connection: the events in

Requests are framed whole (`FrameSplitter`), peeked, book-kept and forwarded as their original bytes.
Kafka answers a connection's requests in order, so an in-order queue (`_order`) pairs every response
with its request; requests the proxy answers itself sit in the same queue and leave in turn. Responses
are read as a stream (`ResponseReader`, connection/reader.py). What the verification side decides, the
core asks through one interface (connection/rules.py) and relays.

What the connection does is one `Mode`, changed only through the table in connection/modes.py. While a
verification, the EndTxn hold or an absorption is on (a `Hold`, connection/holds.py), the connection
holds (HOLDING): reading the client pauses and later frames queue, so the broker sees requests in the
client's order.
"""

from __future__ import annotations

from txnguard.codecs import native
from txnguard.codecs.addresses import AddressUnavailable
from txnguard.codecs.errors import CodecError
from txnguard.connection.apis import ApiKey
from txnguard.connection.base import Cluster, ConnectionBase, ResponseOutOfOrder, Settings
from txnguard.connection.commands import (
    Ask,
    Chunk,
    Command,
    Direction,
    SendToBroker,
    SendToClient,
)
from txnguard.connection.holds import Pause
from txnguard.connection.modes import Event, Mode
from txnguard.connection.relay import FAST_PRODUCE_VERSIONS, SLOW_KEYS, relay_requests, relay_responses
from txnguard.connection.requests import CUT_THROUGH_REQUESTS_ABOVE, RequestSide
from txnguard.verification.checks import Answer
from txnguard.verification.decisions import PendingCheck

_END_TXN = ApiKey.END_TXN.value
_PanicException = native.PanicException

__all__ = ["CUT_THROUGH_REQUESTS_ABOVE", "FAST_PRODUCE_VERSIONS", "SLOW_KEYS", "Cluster", "Connection",
           "ConnectionBase", "ResponseOutOfOrder", "Settings"]

_RAW, _LINGERING, _CLOSED = Mode.RAW, Mode.LINGERING, Mode.CLOSED


class Connection(RequestSide):
    """One client connection: the events in, each a method; the commands out, a list (connection/commands.py).

    The shell calls `relay_from_client` / `relay_from_broker` first with every read (the fast paths,
    connection/relay.py), then `receive_from_client` / `receive_from_broker` with what they left."""

    # -- events in ----------------------------------------------------------------------------------

    def receive_from_client(self, data: Chunk, relayed: int = 0) -> list[Command]:
        """A read from the client. `relayed`: how many bytes at its start `relay_from_client` already
        booked (the shell's fast call); they leave with the rest of the read, or not at all if the
        rest closes the connection, exactly as when this method takes the whole read."""
        mode = self.mode
        if mode is _CLOSED:
            return []
        self._now = self.last_activity = self.clock.perf()
        if mode is _RAW:
            return [SendToBroker([data])]
        out: list[Command] = []
        if self.requests.through:
            # The rest of a request being cut through: forwarded as it arrives, never assembled.
            through, data = self.requests.take_cut_through(data)
            if not data:
                return [SendToBroker([through])]
            out.append(SendToBroker([through]))
        to_broker: list[Chunk] = []
        done = relayed or self.relay_from_client(data)
        if self._panicked is not None:
            return self._closed_on_panic(out, SendToBroker([memoryview(data)[:done]]) if done else None)
        if done:
            if done == len(data):
                out.append(SendToBroker([data]))  # one write of the read as it came
                return out
            to_broker.append(memoryview(data)[:done])
            data = memoryview(data)[done:]
        self._spill()  # the general path reads and adds to the queue
        try:
            frames = self.requests.feed(data)
        except CodecError as e:
            return [*out, self._close_on(e, Direction.CLIENT_TO_BROKER)]
        self.partial_since = (self.partial_since or self._now) if self.requests.buffered else None
        if frames or to_broker:
            try:
                self._requests(frames, out, to_broker)
            except _PanicException as e:  # a bug in native code (a reader, the registry), never the input's fault
                return [*out, self._close("native_panic", f"native code panicked on a request: {e}", "error")]
            self._after_requests(out, to_broker)
        if self.requests.buffered >= CUT_THROUGH_REQUESTS_ABOVE and self.mode is not _CLOSED:
            self._cut_through(out)
        return out

    relay_from_client = relay_requests

    def _closed_on_panic(self, out: list[Command], booked: Command | None) -> list[Command]:
        """Native code panicked in the relay (`_panicked` says where): what it booked before leaves (`booked`), the
        frame it panicked on does not, and this connection closes; every other goes on."""
        assert self._panicked is not None
        return [*out, *([booked] if booked is not None else []), self._close("native_panic", self._panicked, "error")]

    def receive_from_broker(self, data: Chunk, relayed: int = 0) -> list[Command]:
        """A read from the broker; `relayed` as in `receive_from_client`, from `relay_from_broker`."""
        mode = self.mode
        if mode is _CLOSED:
            return []
        self._now = self.last_activity = self.clock.perf()
        if mode is _RAW:
            return [SendToClient([data])]
        out: list[Command] = []
        to_client: list[Chunk] = []
        done = relayed or self.relay_from_broker(data)
        if self._panicked is not None:
            return self._closed_on_panic(out, SendToClient([memoryview(data)[:done]]) if done else None)
        if done:
            to_client.append(data if done == len(data) else memoryview(data)[:done])
            if done == len(data):
                self._after_responses(out, to_client)
                return out
            data = memoryview(data)[done:]  # read as any buffer
        self._spill()  # the general path pairs responses with the queue
        try:
            to_client += self.responses.read(data, self, out)
        except AddressUnavailable as e:  # not a broken frame: the proxy has no address of its own to give
            out.append(self._close(e.reason, f"broker response: {e}", "error"))
            return out
        except _PanicException as e:  # as for requests
            out.append(self._close("native_panic", f"native code panicked on a response: {e}", "error"))
            return out
        except CodecError as e:
            out.append(self._close_on(e, Direction.BROKER_TO_CLIENT, "broker response: "))
            return out
        self._after_responses(out, to_client)
        if self.holds.queued and not self.holds and self.mode is not _CLOSED:
            # An absorption ended inside this chunk: held requests go on only now, after the
            # responses above, so nothing the client reads can overtake them.
            self._release_held(out)
        return out

    relay_from_broker = relay_responses

    def answered(self, check_id: int, answer: Answer) -> list[Command]:
        """The verifier's answer to an Ask."""
        hold = self.holds.find(check_id, Pause.VERIFICATION)
        if self.mode is _CLOSED or hold is None or hold.check is None:
            return []  # the connection closed while the question was out
        self._now = self.clock.perf()
        out: list[Command] = []
        try:
            result = self.rules.resume(hold.check, answer, self.clock)
        except CodecError as e:
            return [self._close_on(e, Direction.CLIENT_TO_BROKER)]
        if isinstance(result, PendingCheck):
            hold.check = result
            out.append(Ask(check_id, result.question))
            return out
        to_broker: list[Chunk] = []
        self._spill()
        forward = self._apply(result, hold.entry, hold.expect_response, out)
        if self.mode is _CLOSED:
            return out
        if forward is not None:
            to_broker.append(forward)
        self._end_hold(hold, out)
        self._release_held(out, to_broker)
        return out

    def timer_fired(self, token: int) -> list[Command]:
        """A StartTimer ran out: ask the coordinator again with the refused request's own bytes."""
        hold = self.holds.find(token, Pause.CONCURRENT_TRANSACTIONS)
        request = None if hold is None else hold.entry.request
        if self.mode is _CLOSED or hold is None or request is None:
            return []
        entry = hold.entry
        self._now = self.clock.perf()
        hold.id = self.holds.next_id()  # this pause is over: its timer cannot fire twice
        entry.retries += 1
        entry.sent_at = self._now
        self._spill()
        self._forwarded.append(entry)  # the broker answers in order: after whatever is already out
        return [SendToBroker([request])]

    def verification_failed(self, check_id: int, reason: str, detail: str) -> list[Command]:
        hold = self.holds.find(check_id, Pause.VERIFICATION)
        if self.mode is _CLOSED or hold is None:
            return []
        return [self._close(reason, f"verifying a request failed: {detail}", "warning")]

    def connection_lost(self) -> None:
        """The shell closed (either side went away): nothing more comes out."""
        self._orphan_end_txns()
        if self.mode is not _CLOSED:
            self._to(Event.CLOSE)

    # -- the client leaves while an EndTxn is unanswered (KAFKA-17754, verification/in_doubt.py) ---------

    def client_gone(self) -> list[Command]:
        """The client closed its side. An EndTxn already forwarded and unanswered may still be processed
        (bytes sent are not taken back): keep the broker connection, read its answers, and close once
        that EndTxn is answered, so the proxy learns its outcome. Otherwise close now."""
        if self.mode is _CLOSED or self.mode is _LINGERING:
            return []
        if self._end_txns_unanswered():
            self._to(Event.CLIENT_GONE)
            self._paused.clear()  # nothing more is read from a client that left
            return []
        return [self._close("client_closed", "client closed the connection", "debug")]

    def _orphan_end_txns(self) -> None:
        """Closing with EndTxns unanswered: their outcome will never be seen here (they stay in doubt)."""
        now = self.clock.wall_ms()
        self._spill()
        for e in self._forwarded:
            if e.api_key == _END_TXN and e.observed is not None:
                self.rules.end_txn_orphaned(e.observed, now)

    # -- draining and timeouts --------------------------------------------------------------------------

    def drain(self) -> list[Command]:
        """Stop reading new requests; close once every in-flight response is delivered."""
        if self.mode is _CLOSED:
            return []
        self._to(Event.DRAIN)
        out: list[Command] = []
        self._pause(Pause.DRAINING, out)
        self._close_when_drained(out)
        return out

    def tick(self) -> list[Command]:
        """Timeouts: a partial frame sitting too long, an idle connection."""
        if self.mode is _CLOSED:
            return []
        now, s = self.clock.perf(), self.settings
        if self.partial_since is not None and now - self.partial_since > s.partial_frame_timeout_s:
            return [self._close("partial_frame_timeout",
                                f"{self.requests.buffered} bytes of an incomplete frame for "
                                f"{s.partial_frame_timeout_s}s", "warning", Direction.CLIENT_TO_BROKER)]
        if not self.in_flight and now - self.last_activity > s.idle_timeout_s:
            return [self._close("idle", f"no traffic for {s.idle_timeout_s}s")]
        return []

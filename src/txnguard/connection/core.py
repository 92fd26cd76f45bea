"""One client connection and its broker connection, as a pure state machine.

Requests are framed whole (`FrameSplitter`), peeked, book-kept and forwarded as
their original bytes. Kafka answers a connection's requests in order, so an
in-order queue (`_order`) pairs every response with its request; requests the
proxy answers itself sit in the same queue and leave in turn. acks=0 Produce
gets no response and never enters the queue.

Responses are read as a stream, not as frames (`ResponseReader`, connection/reader.py):
a response that needs no rewrite and is next in order is relayed as it arrives; only
responses the core must read (ApiVersions, addresses, the transaction life cycle,
merges, SASL) are assembled and decoded.

What the connection does is one `Mode`, changed only through the table in
connection/modes.py. While a verification, the EndTxn hold or an absorption is on
(a `Hold`, connection/holds.py), the connection holds: reading the client pauses and
later frames queue, so the broker sees requests in the client's order.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from txnguard.codecs import addresses, api_versions, native, node_endpoints, schemas
from txnguard.codecs.addresses import AddressUnavailable
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import FrameSplitter
from txnguard.codecs.header import (
    RequestHead,
    peek_client_id,
    peek_request,
    produce_acks_and_txn_id_null,
    read_produce_head,
)
from txnguard.codecs.produce import merged_produce_response
from txnguard.codecs.synthesis import api_versions_unsupported
from txnguard.connection.apis import ACTION_BY_KEY, ApiKey, ResponseAction
from txnguard.connection.commands import (
    AnsweredLocally,
    Ask,
    Authenticated,
    Chunk,
    ClientIdentified,
    ClientSoftware,
    Close,
    Command,
    ConcurrentAbsorbed,
    Decided,
    Direction,
    PauseReading,
    RawMode,
    RequestSeen,
    ResumeReading,
    Rewritten,
    SendToBroker,
    SendToClient,
    Side,
    StartTimer,
)
from txnguard.connection.holds import Hold, Holds, Pause
from txnguard.connection.in_flight import InFlight
from txnguard.connection.ledger import Ledger, PassedOffsets
from txnguard.connection.modes import Event, Mode, next_mode
from txnguard.connection.reader import ResponseReader
from txnguard.connection.rules import Rules
from txnguard.connection.traffic import RTT_BUCKETS, Traffic
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import Answer
from txnguard.verification.decisions import Clock, Decision, PendingCheck
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.passed import UNCHECKED

# A request at least this large that the proxy need not read (a Produce it does not verify) is
# forwarded as its bytes arrive: assembling 100 MiB first cost a copy that stalled every connection.
CUT_THROUGH_REQUESTS_ABOVE = 1024 * 1024
_RESPONSE_HEAD = struct.Struct(">ii")  # length, correlation id
_REQUEST_HEAD = struct.Struct(">ihhi")  # length, api key, api version, correlation id

_PASS = ResponseAction.PASS
_NOTHING: list[Chunk] = []  # no responses ready (never appended to)
_PRODUCE, _TXN_OFFSET_COMMIT = ApiKey.PRODUCE.value, ApiKey.TXN_OFFSET_COMMIT.value
_SASL_HANDSHAKE, _API_VERSIONS = ApiKey.SASL_HANDSHAKE.value, ApiKey.API_VERSIONS.value
_LIFECYCLE = frozenset({ApiKey.END_TXN.value, ApiKey.INIT_PRODUCER_ID.value})  # checked for coordinator timeouts
_REWRITE_ADDRESSES = ResponseAction.REWRITE_ADDRESSES
_END_TXN = ApiKey.END_TXN.value
_OBSERVE = ResponseAction.OBSERVE
# The life-cycle requests the relay's fast path observes itself (their answers too), read in place.
_OBSERVED_FAST = frozenset(key for key, action in ACTION_BY_KEY.items() if action is _OBSERVE)
_OPENS_TRANSACTION = frozenset({ApiKey.ADD_PARTITIONS_TO_TXN.value, ApiKey.ADD_OFFSETS_TO_TXN.value})

# The relay's fast path (`relay_from_client`) books a frame without the general path's helpers only
# when nothing about it needs reading: these keys take the general path (a rule reads their response
# or body, the client's software name, or the inventory notes them), except the life-cycle requests
# it reads in place (_OBSERVED_FAST) and a TxnOffsetCommit with local evidence; so does a Produce with
# a transactional id and no local evidence, or of a version the pinned kio cannot name.
SLOW_KEYS = frozenset({*ACTION_BY_KEY, _API_VERSIONS, _TXN_OFFSET_COMMIT, _SASL_HANDSHAKE})
_PRODUCE_KIO = schemas.kio_version_range(_PRODUCE)
FAST_PRODUCE_VERSIONS = range(3, (_PRODUCE_KIO[1] if _PRODUCE_KIO else 2) + 1)
# A transactional Produce the guard verifies (KIP-890 part 1: up to v11) may be checked on the fast path.
_RELAY, _RAW_PENDING, _RAW, _DRAINING, _LINGERING, _CLOSED = (Mode.RELAY, Mode.RAW_PENDING, Mode.RAW, Mode.DRAINING,
                                                              Mode.LINGERING, Mode.CLOSED)
# Responses take the fast path in RELAY and HOLDING, tested by identity: hashing an Enum member is a Python call.
_HOLDING = Mode.HOLDING
_PanicException = native.PanicException
_ADDRESSES_FROM: dict[int, int] = dict(addresses.ADDRESS_BEARING)  # api key -> first version with addresses
_NO_ADDRESSES = 1 << 15  # above every version


@dataclass(frozen=True, slots=True)
class Settings:
    connection_id: int
    listener: str
    max_frame_bytes: int
    pre_auth_max_frame_bytes: int | None   # the limit until SASL completes; None: no SASL expected
    max_in_flight: int
    partial_frame_timeout_s: float
    idle_timeout_s: float
    debug: bool = False                    # a RequestSeen fact per request
    fast_path: bool = True                 # relay frames that need no reading without the general path's helpers


class Cluster(Protocol):
    """The shell's view of the cluster, consulted synchronously (addresses, ApiVersions)."""

    version_policy: api_versions.VersionPolicy

    # May raise AddressUnavailable (no listener of ours for that broker): the connection closes with its reason.
    def client_address_for(self, node_id: int, host: str, port: int) -> tuple[str, int]: ...
    def learn_brokers(self, found: list[tuple[int, str, int]]) -> None: ...
    def remember_broker_api_versions(self, body: Any) -> None: ...
    def advertised_api_versions(self) -> list[tuple[int, int, int]]: ...


class ResponseOutOfOrder(CodecError):
    reason = "response_out_of_order"


class Connection:
    def __init__(self, settings: Settings, rules: Rules, cluster: Cluster, clock: Clock,
                 traffic: Traffic | None = None, inventory: ConnectionInventory | None = None) -> None:
        self.settings = settings
        self.inventory = inventory  # what the client showed of itself, for the audit's connection record
        self.rules = rules
        self.cluster = cluster
        self.clock = clock
        self.traffic = traffic or Traffic()
        self.ledger = Ledger()  # what the shell records without commands (connection/ledger.py)
        self._info: ClientInfo | None = None
        limit = settings.pre_auth_max_frame_bytes or settings.max_frame_bytes
        self.requests = FrameSplitter(limit)
        # debug wants a RequestSeen per request; without the native readers nothing is read in place (native.py)
        self._fast = settings.fast_path and not settings.debug and native.AVAILABLE
        self._panicked: str | None = None  # a native reader's panic: this connection closes (receive_from_client)
        self._order: deque[InFlight] = deque()      # every request awaiting its response, in request order
        self._forwarded: deque[InFlight] = deque()  # the subset sent to the broker, to pair its responses
        # A verification, the EndTxn hold, an absorption: later requests queue behind them (connection/holds.py).
        self.holds = Holds()
        self._paused: set[Pause] = set()
        self.mode = Mode.RELAY  # what the connection does; changed only through the table in connection/modes.py
        self.client_id: str | None = None
        self.software_name: str | None = None
        self.software_version: str | None = None
        self._family: str | None = None
        self.last_activity = clock.perf()
        self.partial_since: float | None = None
        self._now = self.last_activity
        self.responses = ResponseReader()
        self._answering: InFlight | None = None  # the request of the response being read

    # -- who the client is ----------------------------------------------------------------------------

    @property
    def family(self) -> str:
        if self._family is None:
            self._family = self.rules.family(self.software_name, self.client_id, self.settings.listener)
        return self._family

    def forget_family(self) -> None:
        """A new policy may classify the client differently."""
        self._family = None
        self._info = None

    def client_info(self) -> ClientInfo:
        """Who the client is, as decisions and audit records name it (kept until any part of it changes)."""
        info = self._info
        if info is None:
            info = self._info = ClientInfo(self.client_id, self.software_name, self.software_version, self.family,
                                           self.settings.listener, self.settings.connection_id)
        return info

    @property
    def closed(self) -> bool:
        return self.mode is _CLOSED

    @property
    def lingering(self) -> bool:
        return self.mode is _LINGERING

    def _to(self, event: Event) -> None:
        self.mode = next_mode(self.mode, event)

    @property
    def in_flight(self) -> int:
        return len(self._order)

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
        if self._panicked is not None:  # what was booked before it leaves; the frame that panicked does not
            if done:
                out.append(SendToBroker([memoryview(data)[:done]]))
            return [*out, self._close("native_panic", self._panicked, "error")]
        if done:
            if done == len(data):
                out.append(SendToBroker([data]))  # one write of the read as it came
                return out
            to_broker.append(memoryview(data)[:done])
            data = memoryview(data)[done:]
        try:
            frames = self.requests.feed(data)
        except CodecError as e:
            return [*out, self._close_on(e, Direction.CLIENT_TO_BROKER)]
        self.partial_since = (self.partial_since or self._now) if self.requests.buffered else None
        if frames or to_broker:
            self._requests(frames, out, to_broker)
            self._after_requests(out, to_broker)
        if self.requests.buffered >= CUT_THROUGH_REQUESTS_ABOVE and self.mode is not _CLOSED:
            self._cut_through(out)
        return out

    def relay_from_client(self, data: Chunk) -> int:  # noqa: C901 - the relay loop: one frame per turn, no helper calls
        """The fast path: book the whole frames at the start of `data` that need no reading; how many bytes.

        When that is the whole read, the read goes to the broker as it is (the shell's common case:
        one call here and one write, no command objects); otherwise the shell hands the read to
        `receive_from_client` with `relayed` set, which forwards those bytes with the rest. Nothing
        is taken outside the RELAY mode, nor while a request is read in part (buffered, or being cut
        through), nor before the client id is known (the first request names the client).

        A frame qualifies when its length is within the limit, all of it is here, it would not fill
        the in-flight queue (the general path pauses reading then), and its key is not in SLOW_KEYS,
        with three kinds read in place instead: a transactional Produce whose partitions all have
        local evidence; a TxnOffsetCommit (v0-v4) whose group has local evidence and passes at once
        (the __consumer_offsets partition count known; the policy's mode off: forwarded unchecked,
        as the general path does); and the life-cycle requests (InitProducerId, AddPartitionsToTxn,
        AddOffsetsToTxn, EndTxn) the in-place reader reads, unless the coordinator-timeout check
        or the EndTxn defence's hold wants them. Such a frame gets exactly the general path's
        book-keeping (counters, the in-flight entry with its check-to-append window, the inventory,
        the registry, acks=0 outside the queue, and in the ledger what a checked write's `Decided`
        would have recorded), read straight from the bytes.
        At the first frame that does not qualify the general path takes over (and judges it:
        errors are raised there).
        """
        # Only while relaying (no hold, no byte pipe, not draining...), with the fast path on, the client
        # identified, and no request read in part (buffered, or being cut through).
        if (self.mode is not _RELAY or not self._fast or self.client_id is None or self.requests.through
                or self.requests.buffered):
            return 0
        clock = self.clock
        self._now = self.last_activity = now = clock.perf()
        end, pos = len(data), 0
        limit = self.requests.max_frame
        t = self.traffic
        frames_in, bytes_in = t.frames_in, t.bytes_in
        order, forwarded = self._order, self._forwarded
        inventory = self.inventory
        room = self.settings.max_in_flight - 1 - len(order)  # queue places before the limit
        rules = self.rules
        view: memoryview | None = None
        while end - pos >= 14:
            size, key, version, correlation_id = _REQUEST_HEAD.unpack_from(data, pos)
            stop = pos + 4 + size
            if size < 10 or size > limit or stop > end:
                break
            if key in SLOW_KEYS:
                if key == _TXN_OFFSET_COMMIT:
                    # A TxnOffsetCommit the rules pass at once on local evidence (`pass_offset_commit_locally`), or
                    # that the policy leaves unchecked; anything else: the general path.
                    if room <= 0:
                        break
                    head = RequestHead(key, version, correlation_id)
                    passed = rules.pass_offset_commit_locally(data, head, pos + 4, stop, self.client_info(), clock,
                                                              len(self.ledger.passed))
                    if passed is None:
                        break
                    entry = InFlight(correlation_id, key, version, _PASS, now)
                    if passed is not UNCHECKED:
                        assert isinstance(passed, PassedOffsets)
                        self.ledger.offsets.append(passed)
                        entry.evidence, entry.evidence_at = passed.verdict.evidence.value, passed.decided_at
                    room -= 1
                    frames_in[key] += 1
                    bytes_in[key] += 4 + size
                    if inventory is not None:
                        inventory.request(head, memoryview(data)[pos + 4:stop])
                    order.append(entry)
                    forwarded.append(entry)
                    pos = stop
                    continue
                # A life-cycle request read in place and observed as the general path would (what its answer
                # teaches the registry, the EndTxn in doubt); anything else of SLOW_KEYS, and what the rules
                # leave to the general path (`observe_request_in_place`): the general path.
                if key not in _OBSERVED_FAST or room <= 0:
                    break
                if view is None:
                    view = memoryview(data)
                body = view[pos + 4:stop]
                head = RequestHead(key, version, correlation_id)
                seen = rules.observe_request_in_place(head, body, clock, self.settings.connection_id)
                if seen is None:
                    break
                room -= 1
                frames_in[key] += 1
                bytes_in[key] += 4 + size
                if inventory is not None:
                    inventory.request(head, body)
                entry = InFlight(correlation_id, key, version, _OBSERVE, now)
                entry.observed, keep = seen
                if keep:
                    entry.request = bytes(view[pos:stop])  # a few hundred bytes, kept to ask again
                order.append(entry)
                forwarded.append(entry)
                pos = stop
                continue
            if key == _PRODUCE:
                if version not in FAST_PRODUCE_VERSIONS:
                    break
                found = read_produce_head(data, pos + 4, stop, version)
                if found is None:
                    break
                at, acks = found
                if acks is None:
                    # A transactional write the rules pass at once on local evidence (`pass_produce_locally`):
                    # what its `Decided` would have recorded goes to the ledger.
                    if room <= 0:
                        break
                    try:
                        passed_write = rules.pass_produce_locally(data, at, stop, version, self.client_info(), clock)
                    except _PanicException as e:  # a bug in the native reader, never the input's fault
                        self._panicked = f"the native Produce reader panicked: {e}"
                        break
                    if passed_write is None:
                        break
                    self.ledger.passed.append(passed_write)
                    if inventory is not None:
                        inventory.produce_versions.add(version)
                        inventory.used_transactions = True
                        if inventory.first_transactional_id is None:
                            inventory.first_transactional_id = passed_write.transactional_id
                    room -= 1
                    frames_in[_PRODUCE] += 1
                    bytes_in[_PRODUCE] += 4 + size
                    entry = InFlight(correlation_id, _PRODUCE, version,
                                     _REWRITE_ADDRESSES if version >= _ADDRESSES_FROM[_PRODUCE] else _PASS, now)
                    entry.evidence = passed_write.verdict.evidence.value
                    entry.evidence_at = passed_write.decided_at
                    order.append(entry)
                    forwarded.append(entry)
                    pos = stop
                    continue
                if not acks:  # acks=0: no response, never in the queue
                    if inventory is not None:
                        inventory.produce_versions.add(version)
                    frames_in[key] += 1
                    bytes_in[key] += 4 + size
                    pos = stop
                    continue
                if room <= 0:
                    break
                if inventory is not None:
                    inventory.produce_versions.add(version)
            elif room <= 0:
                break
            room -= 1
            slot = key if 0 <= key < 127 else 127
            frames_in[slot] += 1
            bytes_in[slot] += 4 + size
            entry = InFlight(correlation_id, key, version,
                             _REWRITE_ADDRESSES if version >= _ADDRESSES_FROM.get(key, _NO_ADDRESSES) else _PASS, now)
            order.append(entry)
            forwarded.append(entry)
            pos = stop
        if pos == end:
            self.partial_since = None
        return pos

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
        if done:
            to_client.append(data if done == len(data) else memoryview(data)[:done])
            if done == len(data):
                self._after_responses(out, to_client)
                return out
            data = memoryview(data)[done:]  # read as any buffer
        try:
            to_client += self.responses.read(data, self, out)
        except AddressUnavailable as e:  # not a broken frame: the proxy has no address of its own to give
            out.append(self._close(e.reason, f"broker response: {e}", "error"))
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

    def relay_from_broker(self, data: Chunk) -> int:
        """The fast path for responses: the whole frames at the start of `data` that pass untouched; how many bytes.

        The whole read goes to the client as it is; otherwise `receive_from_broker(data, relayed)`.
        A response qualifies when all of it is here, it answers the request at the head of the
        queue (nothing waits before it), passes as it is (no merge; no rewrite, which a Produce
        or Fetch answer read in place shows when it names no broker; a life-cycle answer
        the registry learns from is read in place, unless it is being asked again or refused whole
        with CONCURRENT_TRANSACTIONS, which the general path absorbs), and no local answer is ready
        behind it. It gets `response_started`'s counting,
        and the check-to-append window it closes goes to the ledger. Nothing is taken outside RELAY and
        HOLDING (an answer may change the mode: draining, lingering, a byte pipe next), while a response
        is read in part, or while the in-flight limit pauses the client (an answer resumes it).
        """
        # Only while relaying (a hold does not matter here), with the fast path on, no response read in part,
        # and reading the client not paused on the in-flight limit (an answer may resume it).
        mode = self.mode
        if ((mode is not _RELAY and mode is not _HOLDING) or not self._fast or not self.responses.idle
                or (self._paused and Pause.MAX_IN_FLIGHT in self._paused)):
            return 0
        self._now = self.last_activity = now = self.clock.perf()
        end, pos = len(data), 0
        order, forwarded = self._order, self._forwarded
        t = self.traffic
        frames_out, bytes_out, rtt_buckets, rtt_sum = t.frames_out, t.bytes_out, t.rtt_buckets, t.rtt_sum
        view: memoryview | None = None
        while end - pos >= 8 and forwarded:
            size, correlation_id = _RESPONSE_HEAD.unpack_from(data, pos)
            entry = forwarded[0]
            stop = pos + 4 + size
            if (size < 4 or stop > end or entry.correlation_id != correlation_id
                    or order[0] is not entry or (len(order) > 1 and order[1].response is not None)):
                break
            action = entry.action
            if action is not _PASS:
                if view is None:
                    view = memoryview(data)
                if action is _REWRITE_ADDRESSES:
                    # A Produce or Fetch answer that names no broker has nothing to rewrite: it passes as it is.
                    if not node_endpoints.endpoints_absent(data, entry.api_key, entry.api_version, pos + 4, stop):
                        break
                # A life-cycle answer the registry learns from, read in place, passes as it is; one being asked
                # again (CONCURRENT_TRANSACTIONS absorbed) or not readable in place: the general path.
                elif action is not _OBSERVE or entry.retries or not self.rules.observe_response_in_place(
                        entry.api_key, entry.api_version, entry.observed, view[pos + 4:stop], self.clock.wall_ms(),
                        entry.request is not None):
                    break
            forwarded.popleft()
            order.popleft()
            if entry.evidence is not None:
                self.ledger.windows.append((entry.evidence, (now - entry.evidence_at) * 1000))
            key = entry.api_key
            slot = key if 0 <= key < 127 else 127
            frames_out[slot] += 1
            bytes_out[slot] += 4 + size
            seconds = now - entry.sent_at
            buckets = rtt_buckets[slot]
            if buckets is None:
                buckets = rtt_buckets[slot] = [0] * (len(RTT_BUCKETS) + 1)
            buckets[bisect_left(RTT_BUCKETS, seconds)] += 1
            rtt_sum[slot] += seconds
            pos = stop
        return pos

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

    def _end_txns_unanswered(self) -> bool:
        # An EndTxn entry observes its SentEndTxn while the defence is on (None when off).
        return any(e.api_key == _END_TXN and e.observed is not None for e in self._forwarded)

    def _linger_over(self, out: list[Command]) -> None:
        if self.mode is _LINGERING and not self._end_txns_unanswered():
            out.append(self._close("client_closed", "the EndTxn the client left unanswered was answered", "info"))

    def _orphan_end_txns(self) -> None:
        """Closing with EndTxns unanswered: their outcome will never be seen here (they stay in doubt)."""
        now = self.clock.wall_ms()
        for e in self._forwarded:
            if e.api_key == _END_TXN and e.observed is not None:
                self.rules.end_txn_orphaned(e.observed, now)

    def _hold_for_end_txn(self, entry: InFlight, frame: memoryview, out: list[Command]) -> bool:
        """An AddPartitionsToTxn/AddOffsetsToTxn that would open a transaction while an EndTxn of the
        same producer is in doubt waits (as a verification does: later requests queue behind it)."""
        if entry.observed is None:
            return False
        check = self.rules.end_txn_hold(entry.api_key, entry.api_version, frame, entry.observed,
                                        self.client_info(), self.settings.connection_id, self.clock)
        if check is None:
            return False
        self._order.append(entry)
        self._wait_for(check, entry, True, out)
        return True

    def drain(self) -> list[Command]:
        """Stop reading new requests; close once every in-flight response is delivered."""
        if self.mode is _CLOSED:
            return []
        self._to(Event.DRAIN)
        out: list[Command] = []
        self._pause(Pause.DRAINING, out)
        if not self._order:
            out.append(self._close("draining", "proxy shutting down"))
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
        if not self._order and now - self.last_activity > s.idle_timeout_s:
            return [self._close("idle", f"no traffic for {s.idle_timeout_s}s")]
        return []

    # -- client -> broker ---------------------------------------------------------------------------

    def _requests(self, frames: list[memoryview], out: list[Command], to_broker: list[Chunk]) -> None:
        for i, frame in enumerate(frames):
            if self.holds:
                self.holds.queued.extend(frames[i:])
                return
            try:
                forward = self._request(frame, out)
            except CodecError as e:
                out.append(self._close_on(e, Direction.CLIENT_TO_BROKER))
                return
            if self.mode is _CLOSED:
                return
            if forward is not None:
                to_broker.append(forward)

    def _after_requests(self, out: list[Command], to_broker: list[Chunk]) -> None:
        if self.mode is _CLOSED:
            return
        if to_broker:
            out.append(SendToBroker(to_broker))
        if len(self._order) >= self.settings.max_in_flight:
            self._pause(Pause.MAX_IN_FLIGHT, out)
        to_client: list[Chunk] = []
        self._take_ready(to_client)
        self._after_responses(out, to_client)

    def _note_request(self, head: RequestHead, body: memoryview, size: int, out: list[Command]) -> None:
        """Count a request and learn who the client is (its header and first bytes are enough)."""
        key = head.api_key
        t, slot = self.traffic, (key if 0 <= key < 127 else 127)
        t.frames_in[slot] += 1
        t.bytes_in[slot] += size
        if self.inventory is not None:
            self.inventory.request(head, body)
        if self.client_id is None and key != _SASL_HANDSHAKE:
            self.client_id = peek_client_id(body) or ""
            self._family = self._info = None
            out.append(ClientIdentified(self.client_id))
        if self.settings.debug:
            out.append(RequestSeen(key, head.api_version, head.correlation_id))

    def _cut_through(self, out: list[Command]) -> None:
        """Forward a large request that needs no reading as its bytes arrive, instead of assembling it.

        Only a Produce the proxy does not verify qualifies (verification reads every batch header),
        and only when nothing is held: requests reach the broker in the client's order.
        """
        if self.mode is not _RELAY or self.holds.queued:
            return
        found = self.requests.incomplete()
        if found is None:
            return
        size, first = found
        body = memoryview(first)[4:]
        try:
            head = peek_request(body)
            if head.api_key != _PRODUCE:
                return
            acks, txn_id_null = produce_acks_and_txn_id_null(body, head)
        except CodecError:
            return  # the header has not all arrived (or is broken: the whole frame will be judged)
        if not txn_id_null and self.rules.wants(_PRODUCE, head.api_version):
            return
        parts = self.requests.cut_through()
        self.partial_since = None
        self._note_request(head, body, size, out)
        if self.inventory is not None:
            self.inventory.produce(head, body, not txn_id_null)
        if acks != 0:
            action = self._classify(body, head, out) or _PASS
            entry = InFlight(head.correlation_id, head.api_key, head.api_version, action, self._now)
            self._order.append(entry)
            self._forwarded.append(entry)
        out.append(SendToBroker(parts))
        if len(self._order) >= self.settings.max_in_flight:
            self._pause(Pause.MAX_IN_FLIGHT, out)

    def _request(self, frame: memoryview, out: list[Command]) -> Chunk | None:
        """Book-keep one request; what to forward (the frame, or a reduced one), None if nothing."""
        body = frame[4:]
        head = peek_request(body)
        key, version, correlation_id = head.api_key, head.api_version, head.correlation_id
        self._note_request(head, body, len(frame), out)
        if key == _PRODUCE:
            acks, txn_id_null = produce_acks_and_txn_id_null(body, head)
            if self.inventory is not None:
                self.inventory.produce(head, body, not txn_id_null)
            if not txn_id_null and self.rules.wants(key, version):
                return self._check(head, self.rules.check_produce(frame, version, self.client_info(), self.clock),
                                   acks != 0, out)
            if acks == 0:
                return frame  # no response will come, so it never enters the queue
        elif key == _TXN_OFFSET_COMMIT and self.rules.wants(key, version):
            return self._check(head, self.rules.check_txn_offset_commit(frame, version, self.client_info(),
                                                                         self.clock), True, out)
        elif key in _LIFECYCLE and self.rules.wants_lifecycle(key, version):
            return self._check(head, self.rules.check_lifecycle(frame, version, self.client_info(), self.clock),
                               True, out)
        action = self._classify(body, head, out)
        if action is None:
            return None  # answered here
        entry = InFlight(correlation_id, key, version, action, self._now)
        if action is ResponseAction.OBSERVE:
            entry.observed = self.rules.observe_request(key, version, body, self.clock.wall_ms(),
                                                        self.settings.connection_id)
            if self.rules.absorbs(key, entry.observed):
                entry.request = bytes(frame)  # a few hundred bytes, kept until the answer
            if key in _OPENS_TRANSACTION and self._hold_for_end_txn(entry, frame, out):
                return None  # held: forwarded (or answered) when the doubt ends
        self._order.append(entry)
        self._forwarded.append(entry)
        return frame

    def _classify(self, body: memoryview, head: RequestHead, out: list[Command]) -> ResponseAction | None:
        """What to do with a request's response, or None if the proxy answered the request itself."""
        key, version = head.api_key, head.api_version
        action = ACTION_BY_KEY.get(key)
        if action is not None:
            return action
        if key == _API_VERSIONS:
            if version > api_versions.proxy_api_versions_range()[1]:
                # A broker answers a too-new ApiVersions with v0 and UNSUPPORTED_VERSION (KIP-511).
                response = api_versions_unsupported(head.correlation_id, self.cluster.advertised_api_versions())
                self._answer(head, response, "unsupported_version", out)
                return None
            self._note_client_software(body, version, out)
            return ResponseAction.REWRITE_API_VERSIONS
        if addresses.carries_addresses(key, version):
            return ResponseAction.REWRITE_ADDRESSES
        return _PASS

    def _check(self, head: RequestHead, result: Decision | PendingCheck, expect_response: bool,
               out: list[Command]) -> Chunk | None:
        """A checked request: apply the decision now, or ask and hold the connection until the answer."""
        entry = InFlight(head.correlation_id, head.api_key, head.api_version, _PASS, self._now)
        if expect_response:
            self._order.append(entry)
        if isinstance(result, Decision):
            return self._apply(result, entry, expect_response, out)
        self._wait_for(result, entry, expect_response, out)
        return None

    def _wait_for(self, check: PendingCheck, entry: InFlight, expect_response: bool, out: list[Command]) -> None:
        """Ask the verifier and hold the connection (later requests queue) until `answered`."""
        hold = self._hold(Pause.VERIFICATION, entry, out, check, expect_response)
        out.append(Ask(hold.id, check.question))

    def _apply(self, decision: Decision, entry: InFlight, expect_response: bool,
               out: list[Command]) -> Chunk | None:
        """Book-keep a decision; what to forward (None: answered here, or the connection closed)."""
        if decision.context is not None:
            out.append(Decided(decision))
        if decision.rejections and not expect_response:
            # acks=0 has no response to carry an error: the broker closes the connection instead.
            out.append(self._close("rejected_without_response", "a transactional acks=0 write failed verification",
                                   "warning"))
            return None
        if decision.forward is None:
            if expect_response:
                entry.response = [decision.local_response or b""]
                out.append(AnsweredLocally(entry.api_key, entry.api_version, entry.correlation_id,
                                           decision.local_reason))
            return None
        entry.sent_at = self._now
        if decision.observe is not None:  # a checked life-cycle request: its answer still feeds the registry
            entry.action = ResponseAction.OBSERVE
            entry.observed = decision.observe
        elif decision.rejections:
            entry.action = ResponseAction.MERGE_PRODUCE
            entry.merge = decision
        elif addresses.carries_addresses(entry.api_key, entry.api_version):
            entry.action = ResponseAction.REWRITE_ADDRESSES
        if decision.evidence_at is not None and decision.evidence is not None:
            entry.evidence, entry.evidence_at = decision.evidence, decision.evidence_at
        if expect_response:
            self._forwarded.append(entry)
        return decision.forward

    def _note_client_software(self, body: memoryview, version: int, out: list[Command]) -> None:
        if version < 3:
            return
        try:
            _, req = schemas.decode_request(body)
        except CodecError:
            return  # the broker will judge the request; we only wanted names for the logs
        self.software_name = str(req.client_software_name)
        self.software_version = str(req.client_software_version)
        self._family = self._info = None
        out.append(ClientSoftware(self.software_name, self.software_version))

    def _answer(self, head: RequestHead, response: bytes, reason: str, out: list[Command]) -> None:
        entry = InFlight(head.correlation_id, head.api_key, head.api_version, _PASS, self._now)
        entry.response = [response]
        self._order.append(entry)
        out.append(AnsweredLocally(head.api_key, head.api_version, head.correlation_id, reason))

    # -- broker -> client ---------------------------------------------------------------------------

    def response_started(self, size: int, correlation_id: int, out: list[Command]) -> tuple[bool, list[Chunk]]:
        """The reader saw a response's head: pair it with its request, count it (`ResponseReader` asks)."""
        if not self._forwarded:
            raise ResponseOutOfOrder(f"response {correlation_id} with no request in flight")
        entry = self._forwarded.popleft()
        if entry.correlation_id != correlation_id:
            raise ResponseOutOfOrder(f"response {correlation_id} arrived for request {entry.correlation_id}")
        key = entry.api_key
        t, slot = self.traffic, (key if 0 <= key < 127 else 127)
        t.frames_out[slot] += 1
        t.bytes_out[slot] += size + 4
        # The round trip, in its bucket (per API key: the last slot takes keys above 126).
        seconds = self._now - entry.sent_at
        buckets = t.rtt_buckets[slot]
        if buckets is None:
            buckets = t.rtt_buckets[slot] = [0] * (len(RTT_BUCKETS) + 1)
        buckets[bisect_left(RTT_BUCKETS, seconds)] += 1
        t.rtt_sum[slot] += seconds
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
        out.append(StartTimer(absorbing.id, delay_ms / 1000))
        return None

    def _end_absorbing(self, entry: InFlight, ending: str, out: list[Command]) -> None:
        waited_ms = (self._now - entry.refused_at) * 1000 if entry.refused_at is not None else 0.0
        out.append(ConcurrentAbsorbed(entry.api_key, entry.retries, waited_ms, ending))
        entry.request = None
        absorbing = self.holds.of(Pause.CONCURRENT_TRANSACTIONS)
        if absorbing is not None and absorbing.entry is entry:
            self._end_hold(absorbing, out)  # held requests go on after this chunk's responses

    def _hold(self, reason: Pause, entry: InFlight, out: list[Command], check: PendingCheck | None = None,
              expect_response: bool = True) -> Hold:
        """Later requests queue behind `entry` until the hold ends; reading the client pauses for `reason`."""
        hold = self.holds.start(reason, entry, check, expect_response)
        self._to(Event.HOLD)
        self._pause(reason, out)
        return hold

    def _end_hold(self, hold: Hold, out: list[Command]) -> None:
        self.holds.end(hold)
        if self.holds.of(hold.reason) is None:
            self._resume(hold.reason, out)
        if not self.holds:
            self._to(Event.RELEASE)

    def _release_held(self, out: list[Command], to_broker: list[Chunk] | None = None) -> None:
        """Requests queued behind holds go on once no hold is left."""
        to_broker = [] if to_broker is None else to_broker
        if not self.holds:
            held = self.holds.take_queued()
            if held:
                self._requests(held, out, to_broker)
        if self.mode is not _CLOSED:
            self._after_requests(out, to_broker)

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
        if self.mode is _DRAINING and not order:
            out.append(self._close("draining", "proxy shutting down"))
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

    # -- pausing and closing --------------------------------------------------------------------------

    def _pause(self, cause: Pause, out: list[Command]) -> None:
        if cause not in self._paused:
            self._paused.add(cause)
            out.append(PauseReading(Side.CLIENT, cause.value))

    def _resume(self, cause: Pause, out: list[Command]) -> None:
        if cause in self._paused:
            self._paused.discard(cause)
            out.append(ResumeReading(Side.CLIENT, cause.value))

    def _close(self, reason: str, detail: str, level: str = "info", frame_error: Direction | None = None) -> Close:
        self._to(Event.CLOSE)
        return Close(reason, detail, level, frame_error)

    def _close_on(self, error: CodecError, direction: Direction, prefix: str = "") -> Close:
        return self._close(error.reason, f"{prefix}{error}", "warning", direction)

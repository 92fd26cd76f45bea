"""The relay's fast paths: the whole frames of a read that need no reading, booked without the general path.

One call per socket read (`Connection.relay_from_client`, `relay_from_broker`: these functions), one turn
of a loop per frame. A frame that needs no reading is counted and queued as the general path would have
(connection/requests.py, responses.py); three kinds are read in place first, each by a helper of its own
here, and passed when the rules say so (connection/rules.py): a transactional Produce with local evidence,
a TxnOffsetCommit with local evidence, and the life-cycle requests the registry learns from. The first
frame that does not qualify ends the loop: the general path takes it and the rest of the read (and judges
it: errors are raised there). The two paths book exactly the same (tests/unit/test_connection_relay.py,
tests/unit/test_fast_path_recording.py: over whole client conversations).

Requests (`relay_requests`). Nothing is taken outside the RELAY mode, nor while a request is read in part
(buffered, or being cut through), nor before the client id is known (the first request names the client).
A frame qualifies when its length is within the limit, all of it is here, it would not fill the in-flight
queue (the general path pauses reading then), and its key is not in SLOW_KEYS, with three kinds read in
place instead: a transactional Produce whose partitions all have local evidence; a TxnOffsetCommit (v0-v4)
whose group has local evidence and passes at once (the __consumer_offsets partition count known; the
policy's mode off: forwarded unchecked, as the general path does); and the life-cycle requests
(InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) the in-place reader reads, unless the
coordinator-timeout check or the EndTxn defence's hold wants them. Such a frame gets exactly the general
path's book-keeping (counters, the in-flight entry with its check-to-append window, the inventory, the
registry, acks=0 outside the queue, and in the ledger what a checked write's `Decided` would have
recorded), read straight from the bytes.
"""

from __future__ import annotations

import struct
from bisect import bisect_left

from txnguard.codecs import addresses, native, node_endpoints, schemas
from txnguard.codecs.header import RequestHead, read_produce_head
from txnguard.connection.apis import ACTION_BY_KEY, ApiKey, ResponseAction
from txnguard.connection.base import ConnectionBase
from txnguard.connection.commands import Chunk
from txnguard.connection.holds import Pause
from txnguard.connection.in_flight import InFlight
from txnguard.connection.modes import Mode
from txnguard.connection.traffic import RTT_BUCKETS
from txnguard.verification.passed import UNCHECKED, PassedOffsets

_RESPONSE_HEAD = struct.Struct(">ii")  # length, correlation id
_REQUEST_HEAD = struct.Struct(">ihhi")  # length, api key, api version, correlation id
_PASS, _OBSERVE, _REWRITE_ADDRESSES = ResponseAction.PASS, ResponseAction.OBSERVE, ResponseAction.REWRITE_ADDRESSES
_PRODUCE, _TXN_OFFSET_COMMIT = ApiKey.PRODUCE.value, ApiKey.TXN_OFFSET_COMMIT.value
# The life-cycle requests the relay's fast path observes itself (their answers too), read in place.
_OBSERVED_FAST = frozenset(key for key, action in ACTION_BY_KEY.items() if action is _OBSERVE)

# The relay's fast path books a frame without the general path's helpers only when nothing about it needs
# reading: these keys take the general path (a rule reads their response or body, the client's software
# name, or the inventory notes them), except the life-cycle requests it reads in place (_OBSERVED_FAST) and
# a TxnOffsetCommit with local evidence; so does a Produce with a transactional id and no local evidence, or
# of a version the pinned kio cannot name.
SLOW_KEYS = frozenset({*ACTION_BY_KEY, ApiKey.API_VERSIONS.value, _TXN_OFFSET_COMMIT, ApiKey.SASL_HANDSHAKE.value})
_PRODUCE_KIO = schemas.kio_version_range(_PRODUCE)
FAST_PRODUCE_VERSIONS = range(3, (_PRODUCE_KIO[1] if _PRODUCE_KIO else 2) + 1)
# Tested by identity: hashing an Enum member is a Python call.
_RELAY, _HOLDING = Mode.RELAY, Mode.HOLDING
_PanicException = native.PanicException
_ADDRESSES_FROM: dict[int, int] = dict(addresses.ADDRESS_BEARING)  # api key -> first version with addresses
_NO_ADDRESSES = 1 << 15  # above every version
_new_head = tuple.__new__  # a NamedTuple from its fields, without its generated __new__ (a Python call)
_PRODUCE_ADDRESSES_FROM = _ADDRESSES_FROM[_PRODUCE]


def relay_requests(conn: ConnectionBase, data: Chunk) -> int:  # noqa: C901 - the loop: one frame per turn
    """The fast path for requests: book the whole frames at the start of `data` that need no reading; how many
    bytes (all of them: the read goes to the broker as it is; else `Connection.receive_from_client(data, relayed)`
    forwards them with the rest). Which frames qualify, and when nothing is taken: the module's docstring."""
    requests = conn.requests
    if conn.mode is not _RELAY or not conn._fast or conn.client_id is None or requests.through or requests.buffered:
        return 0
    inventory = conn.inventory
    conn._now = conn.last_activity = now = conn.clock.perf()
    end, pos, limit = len(data), 0, requests.max_frame
    frames_in, bytes_in = conn.traffic.frames_in, conn.traffic.bytes_in
    order, forwarded = conn._order, conn._forwarded
    room = conn.settings.max_in_flight - 1 - len(order)  # queue places before the limit
    entry: InFlight | None
    try:
        while end - pos >= 14:
            size, key, version, correlation_id = _REQUEST_HEAD.unpack_from(data, pos)
            stop = pos + 4 + size
            if size < 10 or size > limit or stop > end:
                break
            if key == _PRODUCE:
                if version not in FAST_PRODUCE_VERSIONS:
                    break
                found = read_produce_head(data, pos + 4, stop, version)
                if found is None:
                    break
                at, acks = found
                if acks == 0:  # acks=0: no response, never in the queue
                    if inventory is not None:
                        inventory.produce_versions.add(version)
                    frames_in[key] += 1
                    bytes_in[key] += 4 + size
                    pos = stop
                    continue
                if room <= 0:
                    break
                action = _REWRITE_ADDRESSES if version >= _PRODUCE_ADDRESSES_FROM else _PASS
                if acks is None:  # a transactional write: the rules pass it at once on local evidence, or not here
                    entry = _transactional_produce(conn, data, at, stop, version, correlation_id, action, now)
                    if entry is None:
                        break
                else:
                    if inventory is not None:
                        inventory.produce_versions.add(version)
                    entry = InFlight(correlation_id, key, version, action, now)
            elif room <= 0:
                break
            elif key in SLOW_KEYS:  # read in place by a helper of its kind, or the general path's
                if key == _TXN_OFFSET_COMMIT:
                    entry = _offset_commit(conn, data, pos, stop, version, correlation_id, now)
                elif key in _OBSERVED_FAST:
                    entry = _life_cycle(conn, data, pos, stop, key, version, correlation_id, now)
                else:
                    break
                if entry is None:
                    break
            else:
                rewrites = version >= _ADDRESSES_FROM.get(key, _NO_ADDRESSES)
                entry = InFlight(correlation_id, key, version, _REWRITE_ADDRESSES if rewrites else _PASS, now)
            room -= 1
            slot = key if 0 <= key < 127 else 127
            frames_in[slot] += 1
            bytes_in[slot] += 4 + size
            order.append(entry)
            forwarded.append(entry)
            pos = stop
    except _PanicException as e:  # a bug in native code (a reader, the registry), never the input's fault
        conn._panicked = f"native code panicked on a request: {e}"  # this connection closes
    if pos == end:
        conn.partial_since = None
    return pos


def _transactional_produce(conn: ConnectionBase, data: Chunk, at: int, stop: int, version: int, correlation_id: int,
                           action: ResponseAction, now: float) -> InFlight | None:
    """A transactional Produce (read in place from its transactional id at `at`) the rules pass at once on local
    evidence (`pass_produce_locally`: what its `Decided` would have recorded goes to the ledger); its in-flight
    entry. None: the general path (no local evidence for a partition, the policy's mode off, a shape the in-place
    reader does not read)."""
    passed = conn.rules.pass_produce_locally(data, at, stop, version, conn.client_info(), conn.clock)
    if passed is None:
        return None
    conn.ledger.passed.append(passed)
    if conn.inventory is not None:
        conn.inventory.transactional_write(version, passed.transactional_id)
    entry = InFlight(correlation_id, _PRODUCE, version, action, now)
    # `_value_`, the member's own attribute: `.value` is a descriptor call (a Python function on 3.11)
    entry.evidence, entry.evidence_at = passed.verdict.evidence._value_, passed.decided_at
    return entry


def _offset_commit(conn: ConnectionBase, data: Chunk, pos: int, stop: int, version: int, correlation_id: int,
                   now: float) -> InFlight | None:
    """A TxnOffsetCommit the rules pass at once on local evidence (`pass_offset_commit_locally`: what its
    `Decided` would have recorded goes to the ledger, in its place among the writes), or that the policy
    leaves unchecked (forwarded as it is, as the general path does); its in-flight entry. None: the general
    path (no evidence, a verdict that fails, the offsets partition count not known yet, a shape the in-place
    reader does not read)."""
    head = _new_head(RequestHead, (_TXN_OFFSET_COMMIT, version, correlation_id))
    ledger = conn.ledger
    passed = conn.rules.pass_offset_commit_locally(data, head, pos + 4, stop, conn.client_info(), conn.clock,
                                                   len(ledger.passed))
    if passed is None:
        return None
    entry = InFlight(correlation_id, _TXN_OFFSET_COMMIT, version, _PASS, now)
    if passed is not UNCHECKED:
        assert isinstance(passed, PassedOffsets)
        ledger.offsets.append(passed)
        entry.evidence, entry.evidence_at = passed.verdict.evidence._value_, passed.decided_at
    if conn.inventory is not None:
        conn.inventory.request(head, data, pos + 4, stop)
    return entry


def _life_cycle(conn: ConnectionBase, data: Chunk, pos: int, stop: int, key: int, version: int, correlation_id: int,
                now: float) -> InFlight | None:
    """A life-cycle request read in place and observed as the general path would (what its answer teaches the
    registry, the EndTxn in doubt); its in-flight entry. None: what the rules leave to the general path
    (`observe_request_in_place`: the coordinator-timeout check, the EndTxn defence's hold, a shape the
    in-place reader does not read)."""
    head = _new_head(RequestHead, (key, version, correlation_id))
    seen = conn.rules.observe_request_in_place(head, data, pos + 4, stop, conn.clock, conn.settings.connection_id)
    if seen is None:
        return None
    if conn.inventory is not None:
        conn.inventory.request(head, data, pos + 4, stop)
    entry = InFlight(correlation_id, key, version, _OBSERVE, now)
    entry.observed, keep = seen
    if keep:
        entry.request = bytes(memoryview(data)[pos:stop])  # a few hundred bytes, kept to ask again
    return entry


def relay_responses(conn: ConnectionBase, data: Chunk) -> int:
    """The fast path for responses: the whole frames at the start of `data` that pass untouched; how many bytes.

    The whole read goes to the client as it is; otherwise `Connection.receive_from_broker(data, relayed)`.
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
    mode = conn.mode
    if ((mode is not _RELAY and mode is not _HOLDING) or not conn._fast or not conn.responses.idle
            or (conn._paused and Pause.MAX_IN_FLIGHT in conn._paused)):
        return 0
    conn._now = conn.last_activity = now = conn.clock.perf()
    end, pos = len(data), 0
    order, forwarded = conn._order, conn._forwarded
    t = conn.traffic
    frames_out, bytes_out, rtt_buckets, rtt_sum = t.frames_out, t.bytes_out, t.rtt_buckets, t.rtt_sum
    try:
        while end - pos >= 8 and forwarded:
            size, correlation_id = _RESPONSE_HEAD.unpack_from(data, pos)
            entry = forwarded[0]
            stop = pos + 4 + size
            if (size < 4 or stop > end or entry.correlation_id != correlation_id
                    or order[0] is not entry or (len(order) > 1 and order[1].response is not None)):
                break
            action = entry.action
            if action is not _PASS:
                if action is _REWRITE_ADDRESSES:
                    # A Produce or Fetch answer that names no broker has nothing to rewrite: it passes as it is.
                    if not node_endpoints.endpoints_absent(data, entry.api_key, entry.api_version, pos + 4, stop):
                        break
                # A life-cycle answer the registry learns from, read in place, passes as it is; one being asked
                # again (CONCURRENT_TRANSACTIONS absorbed) or not readable in place: the general path.
                elif action is not _OBSERVE or entry.retries or not conn.rules.observe_response_in_place(
                        entry.api_key, entry.api_version, entry.observed, data, pos + 4, stop, conn.clock.wall_ms(),
                        entry.request is not None):
                    break
            forwarded.popleft()
            order.popleft()
            if entry.evidence is not None:
                conn.ledger.windows.append((entry.evidence, (now - entry.evidence_at) * 1000))
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
    except _PanicException as e:  # as in relay_requests
        conn._panicked = f"native code panicked on a response: {e}"  # this connection closes
    return pos

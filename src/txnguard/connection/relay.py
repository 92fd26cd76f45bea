"""The relay's fast paths: the whole frames of a read that need no reading, booked without the general path.

One call per socket read (`Connection.relay_from_client`, `relay_from_broker`: these functions), one turn
of a loop per frame. A frame that needs no reading is counted and queued as the general path would have
(connection/requests.py, responses.py); three kinds are read in place first, each by a helper of its own
here, and passed when the rules say so (connection/rules.py): a transactional Produce with local evidence,
a TxnOffsetCommit with local evidence, and the life-cycle requests the registry learns from. The first
frame that does not qualify ends the loop: the general path takes it and the rest of the read (and judges
it: errors are raised there). The two paths book exactly the same (tests/unit/test_connection_relay.py,
tests/unit/test_fast_path_recording.py: over whole client conversations).

Every frame the fast paths book goes into the connection's native book (native/src/book.rs): requests are
pushed there as they are forwarded, and the response fast path is one native call over it
(`Book.responses`). The book holds what was forwarded after the Python queues' entries; the general path
moves its entries onto them before it reads or adds to them (`ConnectionBase._spill`).

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
from typing import TYPE_CHECKING

from txnguard.codecs import addresses, native, schemas
from txnguard.codecs.header import RequestHead, read_produce_head
from txnguard.connection.apis import ACTION_BY_KEY, ApiKey, ResponseAction
from txnguard.connection.base import BOOK_CODES, ConnectionBase
from txnguard.connection.commands import Chunk
from txnguard.connection.holds import Pause
from txnguard.connection.modes import Mode
from txnguard.verification.passed import UNCHECKED, PassedOffsets

if TYPE_CHECKING:  # the module may be missing at run time (codecs/native.py); its stub is not
    from txnguard._native import Book

_REQUEST_HEAD = struct.Struct(">ihhi")  # length, api key, api version, correlation id
# The book's action codes (native/src/book.rs).
_PASS, _OBSERVE, _REWRITE_ADDRESSES = (BOOK_CODES[action] for action in (
    ResponseAction.PASS, ResponseAction.OBSERVE, ResponseAction.REWRITE_ADDRESSES))
_PRODUCE, _TXN_OFFSET_COMMIT = ApiKey.PRODUCE.value, ApiKey.TXN_OFFSET_COMMIT.value
# The life-cycle requests the relay's fast path observes itself (their answers too), read in place.
_OBSERVED_FAST = frozenset(key for key, action in ACTION_BY_KEY.items() if action is ResponseAction.OBSERVE)

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
    requests, book = conn.requests, conn._book
    if (conn.mode is not _RELAY or not conn._fast or book is None or conn.client_id is None or requests.through
            or requests.buffered):
        return 0
    inventory = conn.inventory
    conn._now = conn.last_activity = now = conn.clock.perf()
    end, pos, limit = len(data), 0, requests.max_frame
    count_in, push = conn.traffic.count_in, book.push
    room = conn.settings.max_in_flight - 1 - len(conn._order) - len(book)  # queue places before the limit
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
                    count_in(key, 4 + size)
                    pos = stop
                    continue
                if room <= 0:
                    break
                action = _REWRITE_ADDRESSES if version >= _PRODUCE_ADDRESSES_FROM else _PASS
                if acks is None:  # a transactional write: the rules pass it at once on local evidence, or not here
                    if not _transactional_produce(conn, book, data, at, stop, version, correlation_id, action, now):
                        break
                else:
                    if inventory is not None:
                        inventory.produce_versions.add(version)
                    push(correlation_id, key, version, action, now)
            elif room <= 0:
                break
            elif key in SLOW_KEYS:  # read in place by a helper of its kind, or the general path's
                if key == _TXN_OFFSET_COMMIT:
                    booked = _offset_commit(conn, book, data, pos, stop, version, correlation_id, now)
                elif key in _OBSERVED_FAST:
                    booked = _life_cycle(conn, book, data, pos, stop, key, version, correlation_id, now)
                else:
                    break
                if not booked:
                    break
            else:
                rewrites = version >= _ADDRESSES_FROM.get(key, _NO_ADDRESSES)
                push(correlation_id, key, version, _REWRITE_ADDRESSES if rewrites else _PASS, now)
            room -= 1
            count_in(key, 4 + size)
            pos = stop
    except _PanicException as e:  # a bug in native code (a reader, the registry), never the input's fault
        conn._panicked = f"native code panicked on a request: {e}"  # this connection closes
    if pos == end:
        conn.partial_since = None
    return pos


def _transactional_produce(conn: ConnectionBase, book: Book, data: Chunk, at: int, stop: int, version: int,
                           correlation_id: int, action: int, now: float) -> bool:
    """A transactional Produce (read in place from its transactional id at `at`) the rules pass at once on local
    evidence (`pass_produce_locally`: what its `Decided` would have recorded goes to the ledger), booked. False:
    the general path (no local evidence for a partition, the policy's mode off, a shape the in-place reader does
    not read)."""
    passed = conn.rules.pass_produce_locally(data, at, stop, version, conn.client_info(), conn.clock)
    if passed is None:
        return False
    conn.ledger.passed.append(passed)
    if conn.inventory is not None:
        conn.inventory.transactional_write(version, passed.transactional_id)
    # `_value_`, the member's own attribute: `.value` is a descriptor call (a Python function on 3.11)
    book.push(correlation_id, _PRODUCE, version, action, now, passed.verdict.evidence._value_, passed.decided_at)
    return True


def _offset_commit(conn: ConnectionBase, book: Book, data: Chunk, pos: int, stop: int, version: int,
                   correlation_id: int, now: float) -> bool:
    """A TxnOffsetCommit the rules pass at once on local evidence (`pass_offset_commit_locally`: what its
    `Decided` would have recorded goes to the ledger, in its place among the writes), or that the policy
    leaves unchecked (forwarded as it is, as the general path does), booked. False: the general path (no
    evidence, a verdict that fails, the offsets partition count not known yet, a shape the in-place reader
    does not read)."""
    head = _new_head(RequestHead, (_TXN_OFFSET_COMMIT, version, correlation_id))
    ledger = conn.ledger
    passed = conn.rules.pass_offset_commit_locally(data, head, pos + 4, stop, conn.client_info(), conn.clock,
                                                   len(ledger.passed))
    if passed is None:
        return False
    if passed is not UNCHECKED:
        assert isinstance(passed, PassedOffsets)
        ledger.offsets.append(passed)
        book.push(correlation_id, _TXN_OFFSET_COMMIT, version, _PASS, now, passed.verdict.evidence._value_,
                  passed.decided_at)
    else:
        book.push(correlation_id, _TXN_OFFSET_COMMIT, version, _PASS, now)
    if conn.inventory is not None:
        conn.inventory.request(head, data, pos + 4, stop)
    return True


def _life_cycle(conn: ConnectionBase, book: Book, data: Chunk, pos: int, stop: int, key: int, version: int,
                correlation_id: int, now: float) -> bool:
    """A life-cycle request read in place and observed as the general path would (what its answer teaches the
    registry, the EndTxn in doubt), booked. False: what the rules leave to the general path
    (`observe_request_in_place`: the coordinator-timeout check, the EndTxn defence's hold, a shape the
    in-place reader does not read)."""
    head = _new_head(RequestHead, (key, version, correlation_id))
    seen = conn.rules.observe_request_in_place(head, data, pos + 4, stop, conn.clock, conn.settings.connection_id)
    if seen is None:
        return False
    if conn.inventory is not None:
        conn.inventory.request(head, data, pos + 4, stop)
    observed, keep = seen
    # A kept request: a few hundred bytes, to ask again.
    book.push(correlation_id, key, version, _OBSERVE, now, None, 0.0, observed,
              bytes(memoryview(data)[pos:stop]) if keep else None)
    return True


def relay_responses(conn: ConnectionBase, data: Chunk) -> int:
    """The fast path for responses: the whole frames at the start of `data` that pass untouched; how many bytes.

    The whole read goes to the client as it is; otherwise `Connection.receive_from_broker(data, relayed)`.
    One native call over the book (`Book.responses`, native/src/book.rs). A response qualifies when all of it
    is here and it answers the request at the head of the queue, which is the book's (the Python queues are
    empty: nothing waits before it, no local answer is ready behind it), and passes as it is (no rewrite, which
    a Produce or Fetch answer read in place shows when it names no broker; a life-cycle answer the registry
    learns from is read in place, unless it is refused whole with CONCURRENT_TRANSACTIONS where the core may
    ask again, which the general path absorbs). It gets `response_started`'s counting, and the check-to-append
    window it closes goes to the ledger. Nothing is taken outside RELAY and HOLDING (an answer may change the
    mode: draining, lingering, a byte pipe next), while a response is read in part, or while the in-flight
    limit pauses the client (an answer resumes it).
    """
    mode, book = conn.mode, conn._book
    if ((mode is not _RELAY and mode is not _HOLDING) or not conn._fast or book is None or conn._order
            or not conn.responses.idle or (conn._paused and Pause.MAX_IN_FLIGHT in conn._paused)):
        return 0
    conn._now = conn.last_activity = now = conn.clock.perf()
    # A panic sets conn._panicked (this connection closes) and answers what was booked before it.
    return book.responses(conn, data, now)

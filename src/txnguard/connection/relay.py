"""The relay's fast paths: the whole frames of a read that need no reading, booked without the general path.

`relay_requests(conn, data)` and `relay_responses(conn, data)` are native (native/src/relay.rs): one call per
socket read, the shell's first with every read, one turn of a loop per frame; each answers how many bytes at
the start of `data` it booked (all of them: the read leaves as it came; else `Connection.receive_from_*`
takes the rest, with `relayed`). This module is their account of the rules and their setup (what they
compare with, once). Three kinds of request are read in place and passed when the rules say so
(connection/rules.py): a transactional Produce with local evidence, a TxnOffsetCommit with local evidence,
and the life-cycle requests the registry learns from; the loops ask the rules and book the answer. The first
frame that does not qualify ends the loop: the general path takes it and the rest of the read (and judges
it: errors are raised there). The two paths book exactly the same (tests/unit/test_connection_relay.py,
tests/unit/test_fast_path_recording.py: over whole client conversations). Without the native module both
take nothing: the general path takes every frame, correct and slower (codecs/native.py).

Requests. Nothing is taken outside the RELAY mode, nor while a request is read in part (buffered, or being
cut through), nor before the client id is known (the first request names the client). A frame qualifies
when its length is within the limit, all of it is here, it would not fill the in-flight queue (the general
path pauses reading then), and its key is not in SLOW_KEYS, with three kinds read in place instead: a
transactional Produce whose partitions all have local evidence; a TxnOffsetCommit (v0-v4) whose group has
local evidence and passes at once (the __consumer_offsets partition count known; the policy's mode off:
forwarded unchecked, as the general path does); and the life-cycle requests (InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) the in-place reader reads, unless the coordinator-timeout check
or the EndTxn defence's hold wants them. A Produce qualifies in the versions kio names from v3
(FAST_PRODUCE_VERSIONS) when its header has no tagged fields; acks=0 is counted and never queued (no answer
comes). Such a frame gets exactly the general path's book-keeping (counters, the in-flight entry with its
check-to-append window, the inventory, the registry, and in the ledger what a checked write's `Decided`
would have recorded), read straight from the bytes.

Responses. A response qualifies when all of it is here, it answers the request at the head of the queue
(nothing waits before it), passes as it is (no merge; no rewrite, which a Produce or Fetch answer read in
place shows when it names no broker; a life-cycle answer the registry learns from is read in place by
`rules.observe_response_in_place`, unless it is being asked again or refused whole with
CONCURRENT_TRANSACTIONS, which the general path absorbs), and no local answer is ready behind it. It gets
`response_started`'s counting, and the check-to-append window it closes goes to the ledger. Nothing is taken
outside RELAY and HOLDING (an answer may change the mode: draining, lingering, a byte pipe next), while a
response is read in part, or while the in-flight limit pauses the client (an answer resumes it).

A panic of the native loops or readers (a bug, never the input's fault) leaves the frames booked before it
standing and sets the connection's `_panicked`: the core closes that connection with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from txnguard.codecs import addresses, native, schemas
from txnguard.codecs.header import RequestHead
from txnguard.connection.apis import ACTION_BY_KEY, ApiKey, ResponseAction
from txnguard.connection.base import ConnectionBase
from txnguard.connection.commands import Chunk
from txnguard.connection.holds import Pause
from txnguard.connection.modes import Mode
from txnguard.connection.traffic import RTT_BUCKETS
from txnguard.verification.passed import UNCHECKED

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


def _nothing_taken(conn: ConnectionBase, data: Chunk, /) -> int:
    """Without the native module: the general path takes every frame."""
    return 0


# `loop(conn, data)`: how many bytes at the start of `data` were booked.
relay_requests: Callable[[ConnectionBase, Chunk], int]
relay_responses: Callable[[ConnectionBase, Chunk], int]
if native.relay_setup is not None:
    native.relay_setup(
        Mode.RELAY, Mode.HOLDING, _PASS, _OBSERVE, _REWRITE_ADDRESSES, Pause.MAX_IN_FLIGHT, list(RTT_BUCKETS),
        (FAST_PRODUCE_VERSIONS.start, FAST_PRODUCE_VERSIONS.stop - 1),
        sorted(SLOW_KEYS - _OBSERVED_FAST - {_TXN_OFFSET_COMMIT, _PRODUCE}), _TXN_OFFSET_COMMIT, sorted(_OBSERVED_FAST),
        sorted(addresses.ADDRESS_BEARING.items()), RequestHead, tuple.__new__, UNCHECKED)
    relay_requests = native.relay_requests
    relay_responses = native.relay_responses
else:
    relay_requests = relay_responses = _nothing_taken

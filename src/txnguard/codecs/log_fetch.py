"""The transaction log follower's Fetch (v12), written and read by hand.

The follower long-polls `__transaction_state` for every partition a broker leads, and every answer lists each
of them, most without records. Built and decoded with kio, one such round cost about 1 ms of CPU at 50 partitions
(building the request's objects, encoding them, decoding the answer): more than the client path of the
transaction it reported, once per record the coordinator appends. Here the request is packed with `struct` and
the answer read in place by the native reader (native/src/fetch.rs), with kio as the fallback and the oracle:
the unit tests compare the request's bytes with kio's encoding, the property tests the answer with kio's
decoding. An answer the native reader does not read whole goes to kio, which decodes it or refuses it
(`DecodeFailed`), as before.

The long poll runs in an incremental fetch session (KIP-227, `FetchSession`): once the broker holds the
partitions and their offsets, a request lists only the partitions whose offset moved, and the answer only the
partitions with records or a new watermark, so a round costs the same at 50 partitions as at one. The Fetches
that read a partition to its end for a write (`sync`) stay sessionless: they ask once and are done.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from txnguard.codecs import native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError, DecodeFailed
from txnguard.codecs.transaction_log import PartitionRead, from_native, latest, python_decoded

VERSION = 12
_HEAD = struct.Struct(">hhih")  # api key, version, correlation id, client id length (then tags)
# replica id, max wait, min bytes, max bytes, isolation level, session id, session epoch
_TOP = struct.Struct(">iiiibii")
# partition, current leader epoch, fetch offset, last fetched epoch, log start offset, partition max bytes, tags
_PARTITION = struct.Struct(">iiqiqib")
NO_SESSION, FINAL_EPOCH, INITIAL_EPOCH = 0, -1, 0  # sessionless: id 0 and the final epoch
_UNKNOWN = -1
_LAST_EPOCH = 2 ** 31 - 1  # then 1 again (the broker's FetchMetadata.nextEpoch)
FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71
_READ_UNCOMMITTED = 0  # the coordinator's log has no transactions of its own
_CONSUMER = -1         # replica id: not a broker


class Wanted(NamedTuple):
    """One partition of the request: where to read from, and the leader epoch Metadata named (-1: none)."""

    partition: int
    leader_epoch: int
    fetch_offset: int
    max_bytes: int


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


class LogPartition(NamedTuple):
    """One partition of the follower's answer: its records read as the view applies them (codecs/transaction_log.py's
    `PartitionRead`, from the view's position on; None: null records) and what stopped their reading, if anything."""

    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    read: PartitionRead | None
    failure: DecodeFailed | None


_NULL_RECORDS = (None, None)  # a partition's read and failure when its answer has no record set
_new = tuple.__new__


class LogAnswer(NamedTuple):
    error_code: int
    session_id: int
    partitions: list[LogPartition]


def fetch_request(correlation_id: int, client_id: str, topic: str, partitions: Sequence[Wanted], *,
                  max_wait_ms: int, min_bytes: int, max_bytes: int, session_id: int = NO_SESSION,
                  session_epoch: int = FINAL_EPOCH) -> bytes:
    """The whole request frame (length prefix included), as kio would encode it. Sessionless unless a session's
    id and epoch are given (`FetchSession.next`). Packed by the native module (native/src/fetch.rs), by `packed`
    without it."""
    if native.AVAILABLE:
        try:
            frame: bytes = native.fetch_request(correlation_id, client_id, topic, partitions, max_wait_ms, min_bytes,
                                                max_bytes, session_id, session_epoch)
        except native.PanicException as e:  # a bug: a CodecError the follower's loops handle (`read_log_answer`)
            raise CodecError(f"the native packer of the transaction log's Fetch panicked: {e}") from e
        return frame
    return packed(correlation_id, client_id, topic, partitions, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                  max_bytes=max_bytes, session_id=session_id, session_epoch=session_epoch)


def packed(correlation_id: int, client_id: str, topic: str, partitions: Sequence[Wanted], *,
           max_wait_ms: int, min_bytes: int, max_bytes: int, session_id: int = NO_SESSION,
           session_epoch: int = FINAL_EPOCH) -> bytes:
    """`fetch_request` in Python: the fallback without the native module."""
    client = client_id.encode()
    name = topic.encode()
    parts = [_HEAD.pack(ApiKey.FETCH.value, VERSION, correlation_id, len(client)), client, b"\x00",
             _TOP.pack(_CONSUMER, max_wait_ms, min_bytes, max_bytes, _READ_UNCOMMITTED, session_id, session_epoch),
             b"\x02", _uvarint(len(name) + 1), name, _uvarint(len(partitions) + 1)]
    pack = _PARTITION.pack
    parts.extend(pack(p.partition, p.leader_epoch, p.fetch_offset, _UNKNOWN, _UNKNOWN, p.max_bytes, 0)
                 for p in partitions)
    parts.append(b"\x00\x01\x01\x00")  # topic tags, no forgotten topics, an empty rack id, top-level tags
    body = b"".join(parts)
    return struct.pack(">i", len(body)) + body


def read_log_answer(body: memoryview, positions: Mapping[int, int]) -> LogAnswer:
    """A Fetch v12 answer of the coordinator's log, its record sets decoded and reduced to what the view applies
    from each partition's next offset in `positions` on (codecs/transaction_log.py's `latest`): `body` is the frame
    after its length prefix. Read in one native call (the answer in place, then each partition's batches:
    native/src/fetch.rs, transaction_log.rs); without the native module, or for an answer it does not read whole,
    kio decodes the answer and the Python reader its records (`python_decoded`, `latest`). Raises `DecodeFailed`
    (kio's verdict) for an answer that cannot be read."""
    if native.AVAILABLE:
        try:
            found = native.read_log_answer(body, 0, len(body), positions)
        except native.PanicException as e:
            # A bug in native code, never the answer's fault: the follower handles it as an answer it cannot read
            # (it says so, drops the connection and reads again after a backoff) instead of the panic escaping into
            # the event loop with the round's waiter left unanswered.
            raise DecodeFailed(f"the native reader of the transaction log's answer panicked: {e}") from e
        if found is not None:
            error, session_id, parts = found
            return LogAnswer(error, session_id, [
                LogPartition(p, code, hw, log_start, *(_NULL_RECORDS if read is None else _native_read(read, failure)))
                for p, code, hw, log_start, read, failure in parts])
    _, answer = schemas.decode_response(body, ApiKey.FETCH.value, VERSION)
    return LogAnswer(int(answer.error_code), int(answer.session_id), [
        LogPartition(int(p.partition_index), int(p.error_code), int(p.high_watermark), int(p.log_start_offset),
                     *(_NULL_RECORDS if p.records is None
                       else _python_read(int(p.partition_index), memoryview(p.records), positions)))
        for t in answer.responses for p in t.partitions])


def _native_read(read: tuple[list[Any], tuple[int, int, int, int], int | None, list[str]],
                 failure: tuple[bool, int] | None) -> tuple[PartitionRead, DecodeFailed | None]:
    kept, counts, next_offset, ended = read
    records, error = from_native(kept, failure)
    # The NamedTuple from its fields without its generated __new__ (a Python call, per partition of every answer).
    return _new(PartitionRead, (records, counts, next_offset, ended)), error


def _python_read(partition: int, records: memoryview,
                 positions: Mapping[int, int]) -> tuple[PartitionRead, DecodeFailed | None]:
    found, error = python_decoded(records)
    return latest(found, positions.get(partition, 0)), error


class FetchSession:
    """The follower's incremental fetch session with one broker (KIP-227), as the Java consumer keeps it.

    A full request (epoch 0; it names the old session, which the broker then closes) lists every partition; the
    broker answers with a session id (0: it has no slot, and every request stays full). Then each request
    carries the next epoch and lists only the partitions whose offset, leader epoch or size moved since the last
    one, and the answer only the partitions with news (records, a new watermark or log start, an error): a
    partition it leaves out is where it was. A changed set of partitions or leader epochs (a leader moved), a
    request that got no answer, or the broker not knowing the session or its epoch: full again."""

    def __init__(self) -> None:
        self.id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self._plan: int | None = None               # the caller's version of the partitions and their epochs
        self._held: dict[int, int] = {}              # partition -> the offset the broker's session holds
        self._asked: dict[int, int] | None = None    # what the request on its way lists: partition -> offset
        self._asked_full = True                      # it lists every partition (a full request)

    def next(self, plan: int, partitions: Sequence[int], epochs: Mapping[int, int], offsets: Mapping[int, int],
             max_bytes: int, moved: set[int] | None = None) -> tuple[int, int, list[Wanted], bool]:
        """The next request: (session id, epoch, the partitions to list, whether it is full). `plan` is the
        caller's version of `partitions` and their leader `epochs` (it moves when either changes: full again);
        within one plan only `offsets` move, and an incremental request lists the partitions whose offset did.
        `moved`: the partitions whose offset may have moved since the last request (the caller's record of every
        change; those of this session are taken out of it): only they are compared, not every partition (the
        follower's long poll, several times per transaction). None: every partition is compared."""
        if self.id == NO_SESSION or self.epoch == INITIAL_EPOCH or plan != self._plan:
            self.epoch, self._plan = INITIAL_EPOCH, plan
            listed = [Wanted(p, epochs.get(p, -1), offsets.get(p, 0), max_bytes) for p in partitions]
            self._asked, self._asked_full = {w.partition: w.fetch_offset for w in listed}, True
            return self.id, INITIAL_EPOCH, listed, True
        held = self._held
        if moved is None:
            candidates: Iterable[int] = partitions
        else:
            candidates = [p for p in moved if p in held]
            moved.difference_update(candidates)
        listed = [Wanted(p, epochs.get(p, -1), offsets.get(p, 0), max_bytes) for p in candidates
                  if offsets.get(p, 0) != held.get(p)]
        self._asked, self._asked_full = {w.partition: w.fetch_offset for w in listed}, False
        return self.id, self.epoch, listed, False

    def answered(self, error_code: int, session_id: int) -> None:
        """The answer to the request `next` made came (before any other `next`)."""
        asked, self._asked = self._asked, None
        if asked is None or error_code in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
            self.lost(forget=error_code == FETCH_SESSION_ID_NOT_FOUND)
            return
        if error_code:
            self.lost()
            return
        if self.epoch == INITIAL_EPOCH:
            self.id = session_id
            self.epoch = 1 if session_id != NO_SESSION else INITIAL_EPOCH
        else:
            self.epoch = 1 if self.epoch == _LAST_EPOCH else self.epoch + 1
        if self._asked_full:
            self._held = asked
        else:
            self._held.update(asked)  # what moved (the rest the broker's session holds as it was)

    def lost(self, *, forget: bool = False) -> None:
        """Full again at the next request (`forget`: the broker no longer knows the session's id either)."""
        if forget:
            self.id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self._held = {}
        self._asked = None

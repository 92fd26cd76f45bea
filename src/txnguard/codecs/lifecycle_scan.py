"""The transaction life cycle read in place: what the registry learns from InitProducerId, AddPartitionsToTxn
(v0-3), AddOffsetsToTxn and EndTxn requests, and from the answers it reads, without kio.

Every client transaction passes an AddPartitionsToTxn or AddOffsetsToTxn and an EndTxn, each a request and an
answer the proxy reads; decoding them with kio (after the bounds check kio needs) was most of the proxy's CPU
per short transaction. These readers take the few fields the rules use, checking every length against the
bytes as they go. Whatever they cannot read plainly (a size past the end, an unknown tag, trailing bytes, a
version they do not know) they leave to kio (`from_kio_*`), which judges it as before: both give the same
`TxnRequest` / `TxnResponse`. A `TxnRequest` is one type per API (`InitProducerIdSeen`, `AddPartitionsSeen`,
`AddOffsetsSeen`, `EndTxnSeen`), each with only the fields that request has: the rules match on the type.
kio still decodes a request the proxy must answer itself (synthesis.py).
"""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.bounds import REQUEST_MAX_ELEMENTS
from txnguard.codecs.bounds import read_uvarint as _uvarint
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import RequestHead, request_body_offset

INIT_PRODUCER_ID, END_TXN, TXN_OFFSET_COMMIT = ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT
ADD_PARTITIONS, ADD_OFFSETS = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN
CONCURRENT_TRANSACTIONS = 51
# The first flexible version of each (compact strings and arrays, tagged fields), and the last one read here.
_FIRST_FLEXIBLE: dict[int, int] = {INIT_PRODUCER_ID: 2, ADD_PARTITIONS: 3, ADD_OFFSETS: 3, END_TXN: 3}
_LAST_READ: dict[int, int] = {INIT_PRODUCER_ID: 5, ADD_PARTITIONS: 3, ADD_OFFSETS: 4, END_TXN: 4}

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_KNOWN_ERRORS = frozenset(int(code) for code in ErrorCode)  # kio refuses an answer with any other


@dataclass(frozen=True, slots=True)
class InitProducerIdSeen:
    """What the rules read of an InitProducerId (v0-2 carry no producer id and epoch: -1)."""

    transactional_id: str | None                       # None: an idempotent producer's
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int


@dataclass(frozen=True, slots=True)
class AddPartitionsSeen:
    """What the rules read of an AddPartitionsToTxn (v0-3: one transaction, the client's shape)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]            # in request order


@dataclass(frozen=True, slots=True)
class AddOffsetsSeen:
    """What the rules read of an AddOffsetsToTxn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True, slots=True)
class EndTxnSeen:
    """What the rules read of an EndTxn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool


TxnRequest = InitProducerIdSeen | AddPartitionsSeen | AddOffsetsSeen | EndTxnSeen


@dataclass(frozen=True, slots=True)
class TxnResponse:
    """What the rules read of a life-cycle answer."""

    error_code: int = 0                                # all but AddPartitionsToTxn
    producer_id: int = -1                              # InitProducerId
    producer_epoch: int = -1
    accepted: frozenset[tuple[str, int]] = frozenset()  # AddPartitionsToTxn: the partitions without error
    # The whole request refused with CONCURRENT_TRANSACTIONS (AddPartitionsToTxn: every partition, at least one).
    all_concurrent: bool = False


class _Unreadable(Exception):
    pass


class _Reader:
    __slots__ = ("buf", "end", "flexible", "pos")

    def __init__(self, buf: memoryview, pos: int, flexible: bool) -> None:
        self.buf, self.pos, self.end, self.flexible = buf, pos, len(buf), flexible

    def _take(self, n: int) -> int:
        at = self.pos
        if n < 0 or at + n > self.end:
            raise _Unreadable
        self.pos = at + n
        return at

    def i16(self) -> int:
        return int(_I16.unpack_from(self.buf, self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack_from(self.buf, self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack_from(self.buf, self._take(8))[0])

    def error_code(self) -> int:
        code = self.i16()
        if code not in _KNOWN_ERRORS:
            raise _Unreadable
        return code

    def boolean(self) -> bool:
        value = self.buf[self._take(1)]
        if value > 1:
            raise _Unreadable  # kio says what a bad boolean is
        return bool(value)

    def uvarint(self) -> int:
        try:
            value, self.pos = _uvarint(self.buf, self.pos, self.end)
        except CodecError:
            raise _Unreadable from None
        return value

    def string(self, nullable: bool = False) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.i16()
        if n < 0:
            if nullable and n == -1:
                return None
            raise _Unreadable
        at = self._take(n)
        try:
            return str(self.buf[at:at + n], "utf-8")
        except UnicodeDecodeError:
            raise _Unreadable from None

    def count(self, smallest: int) -> int:
        n = self.uvarint() - 1 if self.flexible else self.i32()
        if n < 0 or n > REQUEST_MAX_ELEMENTS or n * smallest > self.end - self.pos:
            raise _Unreadable  # null arrays and impossible counts: kio's business
        return n

    def tags(self) -> None:
        if self.flexible and self.uvarint():  # any tagged field at all: kio knows which it may skip
            raise _Unreadable

    def done(self) -> None:
        self.tags()
        if self.pos != self.end:
            raise _Unreadable


def read_txn_request(body: memoryview, head: RequestHead) -> TxnRequest | None:
    """A life-cycle request (`body`: the frame without its length prefix), or None for kio to read."""
    key, version = head.api_key, head.api_version
    if key not in _LAST_READ or version > _LAST_READ[key]:
        return None
    try:
        r = _Reader(body, request_body_offset(body, head), version >= _FIRST_FLEXIBLE[key])
        (n,) = _I16.unpack_from(body, 8)  # the client id (every version here has a v1+ header): kio reads it
        if n > 0:
            str(body[10:10 + n], "utf-8")
        return _request(r, key, version)
    except (_Unreadable, CodecError, struct.error, UnicodeDecodeError):
        return None


def _request(r: _Reader, key: int, version: int) -> TxnRequest:
    if key == INIT_PRODUCER_ID:
        txn_id = r.string(nullable=True)
        timeout = r.i32()
        pid, epoch = (r.i64(), r.i16()) if version >= 3 else (-1, -1)
        r.done()
        return InitProducerIdSeen(txn_id, pid, epoch, timeout)
    txn_id = r.string()
    assert txn_id is not None
    pid, epoch = r.i64(), r.i16()
    if key == END_TXN:
        committed = r.boolean()
        r.done()
        return EndTxnSeen(txn_id, pid, epoch, committed)
    if key == ADD_OFFSETS:
        group = r.string()
        assert group is not None
        r.done()
        return AddOffsetsSeen(txn_id, pid, epoch, group)
    partitions: list[tuple[str, int]] = []
    for _ in range(r.count(2 if r.flexible else 6)):
        topic = r.string()
        assert topic is not None
        for _ in range(r.count(4)):
            partitions.append((topic, r.i32()))
        r.tags()
    r.done()
    return AddPartitionsSeen(txn_id, pid, epoch, tuple(partitions))


def read_txn_response(body: memoryview, key: int, version: int) -> TxnResponse | None:
    """A life-cycle answer (`body`: from its correlation id), or None for kio to read."""
    if key not in _LAST_READ or version > _LAST_READ[key]:
        return None
    flexible = version >= _FIRST_FLEXIBLE[key]
    try:
        r = _Reader(body, 4, flexible)  # after the correlation id
        r.tags()  # the flexible response header
        r.i32()  # throttle time
        if key != ADD_PARTITIONS:
            error = r.error_code()
            pid, epoch = (r.i64(), r.i16()) if key == INIT_PRODUCER_ID else (-1, -1)
            r.done()
            return TxnResponse(error, pid, epoch, all_concurrent=error == CONCURRENT_TRANSACTIONS)
        accepted: set[tuple[str, int]] = set()
        seen, every_concurrent = False, True
        for _ in range(r.count(2 if flexible else 6)):
            topic = r.string()
            assert topic is not None
            for _ in range(r.count(7 if flexible else 6)):
                index, code = r.i32(), r.error_code()
                r.tags()
                seen = True
                if code == 0:
                    accepted.add((topic, index))
                if code != CONCURRENT_TRANSACTIONS:
                    every_concurrent = False
            r.tags()
        r.done()
        return TxnResponse(accepted=frozenset(accepted), all_concurrent=seen and every_concurrent)
    except (_Unreadable, struct.error):
        return None


def from_kio_request(key: int, req: Any) -> TxnRequest:
    """The same as `read_txn_request` gives, from kio's decoded request."""
    if key == INIT_PRODUCER_ID:
        return InitProducerIdSeen(None if req.transactional_id is None else str(req.transactional_id),
                                  int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1)),
                                  # exact milliseconds (total_seconds() * 1000 made 1001 ms 1000)
                                  req.transaction_timeout // datetime.timedelta(milliseconds=1))
    if key == ADD_PARTITIONS:
        return AddPartitionsSeen(str(req.v3_and_below_transactional_id), int(req.v3_and_below_producer_id),
                                 int(req.v3_and_below_producer_epoch),
                                 tuple((str(t.name), int(p)) for t in req.v3_and_below_topics for p in t.partitions))
    if key == ADD_OFFSETS:
        return AddOffsetsSeen(str(req.transactional_id), int(req.producer_id), int(req.producer_epoch),
                              str(req.group_id))
    if key == END_TXN:
        return EndTxnSeen(str(req.transactional_id), int(req.producer_id), int(req.producer_epoch),
                          bool(req.committed))
    raise ValueError(f"not a life-cycle request: API key {key}")


def from_kio_response(key: int, resp: Any) -> TxnResponse:
    """The same as `read_txn_response` gives, from kio's decoded answer."""
    if key == ADD_PARTITIONS:
        codes = [(str(t.name), int(p.partition_index), int(p.partition_error_code))
                 for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]
        return TxnResponse(accepted=frozenset((t, i) for t, i, code in codes if code == 0),
                           all_concurrent=bool(codes) and all(c == CONCURRENT_TRANSACTIONS for _, _, c in codes))
    error = int(resp.error_code)
    if key == INIT_PRODUCER_ID:
        return TxnResponse(error, int(resp.producer_id), int(resp.producer_epoch),
                           all_concurrent=error == CONCURRENT_TRANSACTIONS)
    return TxnResponse(error, all_concurrent=error == CONCURRENT_TRANSACTIONS)

# -- TxnOffsetCommit (v0-4: KIP-890 part 1) --------------------------------------------------------------------

_LAST_TXN_OFFSET_COMMIT, _FIRST_FLEXIBLE_TXN_OFFSET_COMMIT = 4, 3


@dataclass(frozen=True, slots=True)
class TxnOffsetCommit:
    """What the rules read of a TxnOffsetCommit: whose, and for which group."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int


def read_txn_offset_commit(body: memoryview, head: RequestHead) -> TxnOffsetCommit | None:
    """A TxnOffsetCommit read whole and in place (every size checked, as kio's decode after the bounds check
    would); None for kio to read (and judge) instead. kio decodes it only to answer it (a rejection)."""
    version = head.api_version
    if head.api_key != TXN_OFFSET_COMMIT or version > _LAST_TXN_OFFSET_COMMIT:
        return None
    try:
        r = _Reader(body, request_body_offset(body, head), version >= _FIRST_FLEXIBLE_TXN_OFFSET_COMMIT)
        (n,) = _I16.unpack_from(body, 8)  # the client id: kio reads it
        if n > 0:
            str(body[10:10 + n], "utf-8")
        txn_id, group = str(r.string()), str(r.string())  # never None: a null one is kio's to judge
        pid, epoch = r.i64(), r.i16()
        if version >= 3:
            r.i32()  # generation id
            r.string()  # member id
            r.string(nullable=True)  # group instance id
        # A partition: index, offset, (v2+) leader epoch, then a null metadata and no tags: 2 bytes either way.
        smallest = 4 + 8 + (4 if version >= 2 else 0) + 2
        for _ in range(r.count(2 if r.flexible else 6)):
            r.string()  # topic
            for _ in range(r.count(smallest)):
                r.i32()  # partition
                r.i64()  # offset
                if version >= 2:
                    r.i32()  # leader epoch
                r.string(nullable=True)  # metadata
                r.tags()
            r.tags()
        r.done()
        return TxnOffsetCommit(txn_id, group, pid, epoch)
    except (_Unreadable, CodecError, struct.error, UnicodeDecodeError):
        return None

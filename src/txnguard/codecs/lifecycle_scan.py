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

A plain request or answer (no tags, one-byte lengths when flexible) is read in a few unpacks first, anything
else field by field: an EndTxn v3 ~16,300 instructions a call where field by field took ~40,800, its answer
~4,500 where it took ~26,000, an AddPartitionsToTxn v3 of one partition ~28,300 (was ~61,700) and its answer
~24,300 (was ~52,500) (bench/scan_cost.py --instructions). Building the frozen dataclass returned is now
about half of what is left (~7,000 for an EndTxnSeen).
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
from txnguard.codecs.runs import Runs

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
    """A life-cycle request (`body`: the frame without its length prefix), or None for kio to read.

    A plain request (no tagged fields, lengths of one byte when flexible, a non-null client id) is read first
    in a few unpacks (`_plain_request`); whatever that does not take whole goes to the field-by-field reader,
    which reads every shape and decides, as before."""
    key, version = head.api_key, head.api_version
    if key not in _LAST_READ or version > _LAST_READ[key]:
        return None
    try:
        found = _plain_request(body, key, version)
    except (struct.error, UnicodeDecodeError, IndexError):
        found = None  # not plain, or broken: the reader below decides
    if found is not None:
        return found
    return _fieldwise_request(body, head)


def _fieldwise_request(body: memoryview, head: RequestHead) -> TxnRequest | None:
    """Any request of a version read here, field by field."""
    key, version = head.api_key, head.api_version
    try:
        r = _Reader(body, request_body_offset(body, head), version >= _FIRST_FLEXIBLE[key])
        (n,) = _I16.unpack_from(body, 8)  # the client id (every version here has a v1+ header): kio reads it
        if n > 0:
            str(body[10:10 + n], "utf-8")
        return _request(r, key, version)
    except (_Unreadable, CodecError, struct.error, UnicodeDecodeError):
        return None


# -- plain requests and answers read in a few unpacks -----------------------------------------------------------
# Each takes a frame only when the field-by-field reader would take it and give the same, and leaves any other
# to it (None). unpack_from refuses to read past the view's end, so each run is in bounds once read; the last
# one must end where the frame ends. Flexible: lengths and counts are one-byte varints (value + 1), tags a 0.

_CLIENT_ID = Runs(">{}sh")            # the client id, then the transactional id's length
_CLIENT_ID_FLEXIBLE = Runs(">{}sBB")  # the client id, the header's tags, the transactional id's length
_END_TXN = Runs(">{}sqhB")            # transactional id, producer id, epoch, committed
_END_TXN_FLEXIBLE = Runs(">{}sqhBB")  # ... and the tags
_ADD_OFFSETS = Runs(">{}sqhh")        # transactional id, producer id, epoch, the group id's length
_ADD_OFFSETS_FLEXIBLE = Runs(">{}sqhB")
_GROUP = Runs(">{}s")
_GROUP_FLEXIBLE = Runs(">{}sB")       # the group id, the tags
_INIT = (Runs(">{}si"), Runs(">{}siB"), Runs(">{}siqhB"))  # transactional id, timeout: v0-1, v2, v3+
_ADD_PARTITIONS = Runs(">{}sqhi")     # transactional id, producer id, epoch, topic count
_ADD_PARTITIONS_FLEXIBLE = Runs(">{}sqhB")
_TOPIC = Runs(">{}si")                # a topic's name, its partition count
_TOPIC_FLEXIBLE = Runs(">{}sB")
_INDEXES = Runs(">{}i")               # the partitions
_INDEXES_FLEXIBLE = Runs(">{}iB")     # the partitions, the topic's tags
_ONE_BYTE = 0x80


def _plain_request(body: memoryview, key: int, version: int) -> TxnRequest | None:  # noqa: C901 - one pass
    end = len(body)
    (n,) = _I16.unpack_from(body, 8)
    if n < 0 or version < 0:
        return None  # a null client id; a version kio does not know
    if version >= _FIRST_FLEXIBLE[key]:
        client, header_tags, t = _CLIENT_ID_FLEXIBLE[n].unpack_from(body, 10)
        if header_tags or t >= _ONE_BYTE:
            return None
        t -= 1
        pos = 12 + n
        flexible = True
    else:
        client, t = _CLIENT_ID[n].unpack_from(body, 10)
        pos = 12 + n
        flexible = False
    client.decode()  # kio reads the client id: one that is not UTF-8 is not read here
    if t < 0 and (key != INIT_PRODUCER_ID or t != -1):
        return None  # a null transactional id: only InitProducerId's may be
    if key == END_TXN:
        if flexible:
            txn, pid, epoch, committed, tags = _END_TXN_FLEXIBLE[t].unpack_from(body, pos)
            if tags or pos + t + 12 != end or committed > 1:
                return None
        else:
            txn, pid, epoch, committed = _END_TXN[t].unpack_from(body, pos)
            if pos + t + 11 != end or committed > 1:
                return None
        return EndTxnSeen(txn.decode(), pid, epoch, committed == 1)
    if key == ADD_OFFSETS:
        if flexible:
            txn, pid, epoch, g = _ADD_OFFSETS_FLEXIBLE[t].unpack_from(body, pos)
            if not 0 < g < _ONE_BYTE:
                return None
            group, tags = _GROUP_FLEXIBLE[g - 1].unpack_from(body, pos + t + 11)
            if tags or pos + t + 11 + g != end:
                return None
        else:
            txn, pid, epoch, g = _ADD_OFFSETS[t].unpack_from(body, pos)
            if g < 0 or pos + t + 12 + g != end:
                return None
            (group,) = _GROUP[g].unpack_from(body, pos + t + 12)
        return AddOffsetsSeen(txn.decode(), pid, epoch, group.decode())
    if key == INIT_PRODUCER_ID:
        run = _INIT[0 if not flexible else 1 if version < 3 else 2][max(t, 0)]
        txn, timeout, *rest = run.unpack_from(body, pos)
        pid, epoch, tags = rest if version >= 3 else (-1, -1, rest[0] if flexible else 0)
        if tags or pos + run.size != end:
            return None
        return InitProducerIdSeen(None if t < 0 else txn.decode(), pid, epoch, timeout)
    return _plain_add_partitions(body, pos, t, end, flexible)


def _plain_add_partitions(body: memoryview, pos: int, t: int, end: int,
                          flexible: bool) -> TxnRequest | None:
    partitions: list[tuple[str, int]] = []
    if flexible:
        txn, pid, epoch, topics = _ADD_PARTITIONS_FLEXIBLE[t].unpack_from(body, pos)
        topics -= 1
    else:
        txn, pid, epoch, topics = _ADD_PARTITIONS[t].unpack_from(body, pos)
    pos += t + (11 if flexible else 14)
    if not 0 <= topics < _ONE_BYTE - 1:
        return None
    for _ in range(topics):
        head = _topic_head(body, pos, flexible)
        if head is None:
            return None
        name, count, pos = head
        if flexible:
            indexes = _INDEXES_FLEXIBLE[count].unpack_from(body, pos)
            if indexes[-1]:
                return None  # the topic's tags
            indexes = indexes[:-1]
            pos += 4 * count + 1
        else:
            indexes = _INDEXES[count].unpack_from(body, pos)
            pos += 4 * count
        topic = name.decode()
        partitions += [(topic, index) for index in indexes]
    if flexible:
        if body[pos]:
            return None
        pos += 1
    if pos != end:
        return None
    return AddPartitionsSeen(txn.decode(), pid, epoch, tuple(partitions))


def _topic_head(body: memoryview, pos: int, flexible: bool) -> tuple[bytes, int, int] | None:
    """A plain topic entry's name and partition count (at most 254: a one-byte length when flexible), and where
    its partitions start; None for anything else (the field-by-field reader's business)."""
    if flexible:
        m = body[pos] - 1
        if not 0 <= m < _ONE_BYTE - 1:
            return None
        name, count = _TOPIC_FLEXIBLE[m].unpack_from(body, pos + 1)
        count -= 1
        pos += m + 2
    else:
        (m,) = _I16.unpack_from(body, pos)
        if m < 0:
            return None
        name, count = _TOPIC[m].unpack_from(body, pos + 2)
        pos += m + 6
    if not 0 <= count < _ONE_BYTE - 1:
        return None
    return name, count, pos


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
        found = _plain_response(body, key, flexible)
    except (struct.error, IndexError, UnicodeDecodeError):
        found = None  # not plain, or broken: the reader below decides
    if found is not None:
        return found
    return _fieldwise_response(body, key, flexible)


def _fieldwise_response(body: memoryview, key: int, flexible: bool) -> TxnResponse | None:
    """Any answer of a version read here, field by field."""
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


# The answers of a fixed size (after the correlation id): throttle time, error code (InitProducerId: producer id,
# epoch); flexible: the header's tags first and the body's last.
_ANSWER = struct.Struct(">4xih")
_ANSWER_FLEXIBLE = struct.Struct(">4xBihB")
_INIT_ANSWER = struct.Struct(">4xihqh")
_INIT_ANSWER_FLEXIBLE = struct.Struct(">4xBihqhB")
_ADD_PARTITIONS_ANSWER = struct.Struct(">4xii")         # throttle time, topic count
_ADD_PARTITIONS_ANSWER_FLEXIBLE = struct.Struct(">4xBiB")
_PARTITION_ANSWER = struct.Struct(">ih")                # index, error code
_PARTITION_ANSWER_FLEXIBLE = struct.Struct(">ihB")      # ... and the tags
# The answers that are an error code alone, built once: building a frozen dataclass costs more than the read.
_ERROR_ANSWERS = {code: TxnResponse(code, all_concurrent=code == CONCURRENT_TRANSACTIONS) for code in _KNOWN_ERRORS}


def _plain_response(body: memoryview, key: int, flexible: bool) -> TxnResponse | None:  # noqa: C901 - one pass
    if key == INIT_PRODUCER_ID:
        if flexible:
            header_tags, _, error, pid, epoch, tags = _INIT_ANSWER_FLEXIBLE.unpack_from(body)
            size = _INIT_ANSWER_FLEXIBLE.size
        else:
            _, error, pid, epoch = _INIT_ANSWER.unpack_from(body)
            header_tags = tags = 0
            size = _INIT_ANSWER.size
        if header_tags or tags or len(body) != size or error not in _KNOWN_ERRORS:
            return None
        return TxnResponse(error, pid, epoch, all_concurrent=error == CONCURRENT_TRANSACTIONS)
    if key != ADD_PARTITIONS:  # EndTxn, AddOffsetsToTxn: an error code alone
        if flexible:
            header_tags, _, error, tags = _ANSWER_FLEXIBLE.unpack_from(body)
            size = _ANSWER_FLEXIBLE.size
        else:
            _, error = _ANSWER.unpack_from(body)
            header_tags = tags = 0
            size = _ANSWER.size
        if header_tags or tags or len(body) != size:
            return None
        return _ERROR_ANSWERS.get(error)  # None: a code kio does not know
    if flexible:
        header_tags, _, topics = _ADD_PARTITIONS_ANSWER_FLEXIBLE.unpack_from(body)
        topics -= 1
        pos = 10
    else:
        _, topics = _ADD_PARTITIONS_ANSWER.unpack_from(body)
        header_tags, pos = 0, 12
    if header_tags or not 0 <= topics < _ONE_BYTE - 1:
        return None
    accepted: set[tuple[str, int]] = set()
    seen, every_concurrent = False, True
    for _ in range(topics):
        head = _topic_head(body, pos, flexible)
        if head is None:
            return None
        name, count, pos = head
        topic = name.decode()
        for _ in range(count):
            if flexible:
                index, code, tags = _PARTITION_ANSWER_FLEXIBLE.unpack_from(body, pos)
                pos += 7
                if tags:
                    return None
            else:
                index, code = _PARTITION_ANSWER.unpack_from(body, pos)
                pos += 6
            if code not in _KNOWN_ERRORS:
                return None
            seen = True
            if code == 0:
                accepted.add((topic, index))
            if code != CONCURRENT_TRANSACTIONS:
                every_concurrent = False
        if flexible:
            if body[pos]:
                return None
            pos += 1
    if flexible:
        if body[pos]:
            return None
        pos += 1
    if pos != len(body):
        return None
    return TxnResponse(accepted=frozenset(accepted), all_concurrent=seen and every_concurrent)


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

"""The transaction coordinator's own log, `__transaction_state`, read by hand.

The coordinator appends one record per change of a transactional id (InitProducerId, each
AddPartitionsToTxn/AddOffsetsToTxn, EndTxn's PrepareCommit/PrepareAbort and the Complete* that
follows, a timeout's abort) and replicates it with acks=all before it answers the client: the log
says what DescribeTransactions would say, as of each record. Compacted, keyed by transactional id;
a null value is a tombstone (the id expired).

Record formats, from Kafka's own schemas (TransactionLogKey.json, TransactionLogValue.json, the same
bytes in every broker from 2.8 to 4.4):

* key: int16 version 0, then the transactional id (int16-length string);
* value v0 (2.8 and later): producer id int64, epoch int16, timeout int32, status int8, partitions
  (nullable int32-count array of {topic string, int32-count array of int32}), last update int64,
  start int64;
* value v1 (flexible, 3.x brokers whose metadata version allows it): the same fields with compact
  arrays and strings, and tagged fields (previous/next producer id, next epoch, client transaction
  version) that verification does not need and skips.

A version this module does not know is `UnknownVersion`: the caller logs it, counts it and asks the
coordinator instead; it never guesses. The coordinator writes its log uncompressed
(TransactionLog.EnforcedCompressionType); a compressed batch is refused the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from kio.records.readers import read_batch

from txnguard.codecs import native
from txnguard.codecs.errors import DecodeFailed

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length (after this field)
_ATTRIBUTES_AT = 21                 # the batch's int16 attributes
_BATCH_HEADER = 61                  # a v2 batch's fixed header, up to its record count
_COMPRESSION = 0x07
_CONTROL = 0x20

TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)

# TransactionState.id() in Apache Kafka, the byte the log stores, and the names DescribeTransactions gives.
STATES = {0: "Empty", 1: "Ongoing", 2: "PrepareCommit", 3: "PrepareAbort", 4: "CompleteCommit",
          5: "CompleteAbort", 6: "Dead", 7: "PrepareEpochFence"}


class UnknownVersion(DecodeFailed):
    """A key or value version, a status or a batch format this reader does not know: never guessed at."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    key: bytes | None
    value: bytes | None


class TxnLogValue(NamedTuple):
    """A transaction log value's fields (a NamedTuple: the follower builds one per record read)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int


# What one record does to the view, by index (verification/transaction_log_view.py's `Applied`, in its order):
STATE, TOMBSTONE, UNKNOWN, MALFORMED = range(4)
# (offset, what it does, its transactional id or None when the key does not decode, its value when a state)
Decoded = tuple[int, int, str | None, TxnLogValue | None]


# The states in which a transaction has ended: the coordinator accepts the id's next one (before them, in a Prepare
# state, it refuses it with CONCURRENT_TRANSACTIONS). A removed id (a tombstone) has ended too.
ENDED = frozenset({"CompleteCommit", "CompleteAbort", "Empty", "Dead"})


class PartitionRead(NamedTuple):
    """One partition's records of a read, as the view applies them (`latest`)."""

    kept: list[Decoded]             # each id's last record, and every record that could not be read, by offset
    counts: tuple[int, int, int, int]  # how many records of each kind were read (by STATE ... MALFORMED)
    next_offset: int | None         # the offset after the last record read; None: nothing new was read
    ended: list[str]                # the ids whose transaction a record ended, each once, in that record's order


def latest(records: list[Decoded], from_offset: int) -> PartitionRead:
    """`records` at or after `from_offset` (those before it were read already) reduced to what the view keeps: an
    id's earlier states are superseded by its last within the same read, so they are counted, not kept. An idle
    follower's read carries every change of a busy cluster, three or more records per transaction and mostly of
    the same ids: the view applies one record per id instead. In Python: the fallback without the native module
    (which does this in `read_log_answer`: native/src/transaction_log.rs), and its oracle."""
    fresh = [r for r in records if r[0] >= from_offset]
    counts = [0, 0, 0, 0]
    last: dict[str, int] = {}
    ended: dict[str, None] = {}
    for i, (_, kind, txn_id, value) in enumerate(fresh):
        counts[kind] += 1
        if txn_id is None:
            continue
        last[txn_id] = i
        if kind == TOMBSTONE or (kind == STATE and value is not None and value.state in ENDED):
            ended.setdefault(txn_id)
    kept = [r for i, r in enumerate(fresh)
            if r[1] == UNKNOWN or r[1] == MALFORMED or (r[2] is not None and last[r[2]] == i)]
    return PartitionRead(kept, (counts[0], counts[1], counts[2], counts[3]),
                         fresh[-1][0] + 1 if fresh else None, list(ended))


def read_decoded(data: bytes | memoryview) -> tuple[list[Decoded], DecodeFailed | None]:
    """The records of a Fetch answer's record set (as `records`), each decoded as the view applies it, and what
    stopped the reading at a batch (`UnknownVersion`, `DecodeFailed`: the records before it are kept), or None.
    By the native module in one call (batches, keys and values read in place: the follower's cost is the
    interpreter's work per answer, so it does as little of it as it can); by `decode` record by record without
    it, or the native module's oracle in the property tests."""
    if native.AVAILABLE:
        return from_native(*native.read_log_records(data, 0, len(data)))
    return python_decoded(data)


def from_native(found: list[tuple[int, int, str | None, tuple[Any, ...] | None]],
                failure: tuple[bool, int] | None) -> tuple[list[Decoded], DecodeFailed | None]:
    """The native reader's records and failure (`read_log_records`, `read_log_answer`) as `read_decoded` gives them."""
    # A NamedTuple from the reader's tuple without `_make` (a Python-level call: most of this line's cost per record).
    new, value = tuple.__new__, TxnLogValue
    decoded: list[Decoded] = [(o, a, t, None if v is None else new(value, v)) for o, a, t, v in found]
    if failure is None:
        return decoded, None
    unknown, at = failure
    return decoded, (UnknownVersion(f"a record batch at byte {at} this reader does not know (magic, compression)")
                     if unknown else DecodeFailed(f"record batch at byte {at}: not read whole"))


def python_decoded(data: bytes | memoryview) -> tuple[list[Decoded], DecodeFailed | None]:
    """`read_decoded` in Python: the fallback without the native module, and its oracle."""
    out: list[Decoded] = []
    try:
        for record in records(data):
            out.append(decode(record))
    except DecodeFailed as e:
        return out, e
    return out, None


def decode(record: LogRecord) -> Decoded:
    """One record decoded as the view applies it (the Python reader: the fallback, and the native one's oracle)."""
    try:
        if record.key is None:
            raise DecodeFailed("a transaction log record without a key")
        txn_id = transactional_id(record.key)
    except UnknownVersion:
        return record.offset, UNKNOWN, None, None
    except DecodeFailed:
        return record.offset, MALFORMED, None, None
    if record.value is None:
        return record.offset, TOMBSTONE, txn_id, None
    try:
        return record.offset, STATE, txn_id, transaction(record.value)
    except UnknownVersion:
        return record.offset, UNKNOWN, txn_id, None
    except DecodeFailed:
        return record.offset, MALFORMED, txn_id, None


def records(data: bytes | memoryview) -> Iterator[LogRecord]:
    """The records of a Fetch answer's record set, in offset order. A partial batch at the end (Fetch cuts
    at its byte limit) ends the iteration; control batches (none in this topic) are skipped."""
    view = memoryview(data)
    for pos, stop in _batches(data):
        yield from _batch_records(data, view, pos, stop)


def _batches(data: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """The bounds of each whole, uncompressed, non-control v2 batch of a record set, in order."""
    view = memoryview(data)
    pos, end = 0, len(view)
    while pos + _BATCH_HEAD.size <= end:
        _, length = _BATCH_HEAD.unpack_from(view, pos)
        stop = pos + _BATCH_HEAD.size + length
        if length <= 0 or stop > end:
            return
        if stop - pos < _BATCH_HEADER:
            raise DecodeFailed(f"a record batch of {stop - pos} bytes at byte {pos}: shorter than its header")
        if view[pos + 16] != 2:
            raise UnknownVersion(f"record batch magic {view[pos + 16]} at byte {pos}")
        (attributes,) = _I16.unpack_from(view, pos + _ATTRIBUTES_AT)
        if attributes & _COMPRESSION:
            raise UnknownVersion(f"a compressed batch (attributes {attributes:#x}): the coordinator writes none")
        if not attributes & _CONTROL:
            yield pos, stop
        pos = stop


def _batch_records(data: bytes | memoryview, view: memoryview, pos: int, stop: int) -> Iterator[LogRecord]:
    """The records of the one uncompressed, non-control batch at `data[pos:stop]`: read in place by the native
    reader (strict: a batch it does not read whole is malformed), or by kio's batch reader without the module."""
    if native.AVAILABLE:
        found = native.read_batch_records(data, pos, stop)
        if found is None:
            raise DecodeFailed(f"record batch at byte {pos}: not read whole")
        for offset, key, value in found:
            yield LogRecord(offset, key, value)
        return
    try:
        batch, _ = read_batch(view[pos:stop], 0)
    except (ValueError, IndexError, struct.error) as e:
        raise DecodeFailed(f"record batch at byte {pos}: {e}") from None
    for r in batch.records:
        yield LogRecord(int(r.offset), r.key, r.value)


def transactional_id(key: bytes) -> str:
    """The transactional id a record is about."""
    if len(key) < 4:
        raise DecodeFailed("transaction log key shorter than its version and length")
    (version,) = _I16.unpack_from(key, 0)
    if version != KEY_VERSION:
        raise UnknownVersion(f"transaction log key version {version}")
    (n,) = _I16.unpack_from(key, 2)
    if n < 0 or 4 + n > len(key):
        raise DecodeFailed(f"transaction log key: a {n}-byte id in {len(key)} bytes")
    try:
        return key[4:4 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeFailed(f"transaction log key: {e}") from None


class _Reader:
    def __init__(self, data: bytes, flexible: bool) -> None:
        self.data, self.pos, self.flexible = data, 2, flexible

    def fixed(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.data):
            raise DecodeFailed("transaction log value ends early")
        (v,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(v)

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            if self.pos >= len(self.data) or shift > 28:
                raise DecodeFailed("transaction log value: a bad varint")
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def count(self) -> int:
        """An array's length; -1 for null."""
        return self.uvarint() - 1 if self.flexible else self.fixed(_I32)

    def string(self) -> str:
        n = self.uvarint() - 1 if self.flexible else self.fixed(_I16)
        if n < 0 or self.pos + n > len(self.data):
            raise DecodeFailed("transaction log value: a bad string")
        try:
            s = self.data[self.pos:self.pos + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeFailed(f"transaction log value: {e}") from None
        self.pos += n
        return s

    def skip_tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.pos += self.uvarint()
            if self.pos > len(self.data):
                raise DecodeFailed("transaction log value: tagged fields run past its end")


def transaction(value: bytes) -> TxnLogValue:
    """A transaction log value (not a tombstone: the caller checks for None first)."""
    if len(value) < 2:
        raise DecodeFailed("transaction log value shorter than its version")
    (version,) = _I16.unpack_from(value, 0)
    if version not in VALUE_VERSIONS:
        raise UnknownVersion(f"transaction log value version {version}")
    r = _Reader(value, flexible=version >= 1)
    producer_id, epoch = r.fixed(_I64), r.fixed(_I16)
    timeout_ms = r.fixed(_I32)
    status = value[r.pos] if r.pos < len(value) else -1
    r.pos += 1
    state = STATES.get(status)
    if state is None:
        raise UnknownVersion(f"transaction status {status}")
    partitions: set[tuple[str, int]] = set()
    for _ in range(max(r.count(), 0)):
        topic = r.string()
        for _ in range(max(r.count(), 0)):
            partitions.add((topic, r.fixed(_I32)))
        r.skip_tags()
    last_update_ms, start_ms = r.fixed(_I64), r.fixed(_I64)
    r.skip_tags()
    return TxnLogValue(producer_id, epoch, timeout_ms, state, frozenset(partitions), last_update_ms, start_ms)

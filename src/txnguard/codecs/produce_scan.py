"""Read a transactional Produce request in place: its transactional id and, per partition, the batch headers.

This is the hot path of verification (every transactional Produce passes here), so it
does in one pass what decoding with kio and then bounds-checking would do in three:
every length and count is checked against the bytes left as it is read (the same
rules as `bounds`), records stay memoryviews into the frame, and nothing else is
built. kio decodes the request only when a partition is rejected and the request
must be rebuilt without it. Measured with callgrind on a one-partition Produce v9
(instructions per call): bounds check + kio decode + batch headers ~83,800; this scan ~69,800;
kio's unchecked decode alone was ~15,100, so reading safely in Python still costs ~4x it.

The relay's fast path reads a transactional Produce with `scan_transactional`, which takes the common shape
(one topic, one partition, one batch) in three unpacks before its loop: ~10,200 instructions a call on
Produce v3-v8, ~12,700 on v9+, where the loop alone took ~23,600 and ~26,800 (bench/scan_cost.py).
"""

from __future__ import annotations

import struct

from txnguard.codecs.bounds import MAX_TAGGED_FIELDS, REQUEST_MAX_ELEMENTS
from txnguard.codecs.bounds import read_uvarint as _uvarint
from txnguard.codecs.errors import BoundsExceeded, DecodeFailed, TooManyTaggedFields, TruncatedFrame
from txnguard.codecs.header import RequestHead, request_body_offset
from txnguard.codecs.produce import ProducePartition, partition_of
from txnguard.codecs.runs import Runs

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_AND_TIMEOUT = 6
FIRST_FLEXIBLE_VERSION = 9


def scan_produce(body: memoryview, head: RequestHead) -> tuple[str | None, list[ProducePartition]]:
    """(transactional id, partitions) of a Produce v3-v11 request body (the frame without its length prefix)."""
    try:
        return _scan(body, request_body_offset(body, head), head.api_version >= FIRST_FLEXIBLE_VERSION)
    except struct.error as e:
        raise TruncatedFrame(f"Produce request: {e}") from None
    except UnicodeDecodeError as e:
        raise DecodeFailed(f"Produce request: a name is not UTF-8 ({e.reason})") from None


def _scan(body: memoryview, pos: int, flexible: bool) -> tuple[str | None, list[ProducePartition]]:
    end = len(body)
    txn_id, pos = _string(body, pos, end, flexible)
    pos += _ACKS_AND_TIMEOUT
    # The smallest partition: index, an empty records length (and no tags when flexible).
    smallest = 6 if flexible else 8
    partitions: list[ProducePartition] = []
    topics, pos = _count(body, pos, end, flexible, 2 if flexible else 6)
    for _ in range(topics):
        name, pos = _string(body, pos, end, flexible)
        count, pos = _count(body, pos, end, flexible, smallest)
        if len(partitions) + count > REQUEST_MAX_ELEMENTS:
            raise BoundsExceeded(f"more than {REQUEST_MAX_ELEMENTS} partitions in one Produce")
        for _ in range(count):
            (index,) = _I32.unpack_from(body, pos)
            pos += 4
            if flexible:
                n, pos = _uvarint(body, pos, end)
                size = n - 1
            else:
                (size,) = _I32.unpack_from(body, pos)
                pos += 4
            if size < 0:
                records = None
            elif pos + size > end:
                raise BoundsExceeded(f"records of {size} bytes at byte {pos} run past the end ({end})")
            else:
                records = body[pos:pos + size]
                pos += size
            if flexible:
                pos = _skip_tags(body, pos, end)
            partitions.append(partition_of(name or "", index, records))
        if flexible:
            pos = _skip_tags(body, pos, end)
    if flexible:
        pos = _skip_tags(body, pos, end)
    if pos != end:
        raise DecodeFailed(f"Produce request: {end - pos} trailing bytes")
    return txn_id, partitions


def _string(buf: memoryview, pos: int, end: int, flexible: bool) -> tuple[str | None, int]:
    if flexible:
        n, pos = _uvarint(buf, pos, end)
        n -= 1
    else:
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
    if n < 0:
        return None, pos
    if pos + n > end:
        raise BoundsExceeded(f"string of {n} bytes at byte {pos} runs past the end ({end})")
    return str(buf[pos:pos + n], "utf-8"), pos + n


def _count(buf: memoryview, pos: int, end: int, flexible: bool, smallest: int) -> tuple[int, int]:
    if flexible:
        n, pos = _uvarint(buf, pos, end)
        n -= 1
    else:
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
    if n * smallest > end - pos:
        raise BoundsExceeded(f"{n} elements of at least {smallest} bytes claimed with {end - pos} bytes left")
    return max(n, 0), pos


def _skip_tags(buf: memoryview, pos: int, end: int) -> int:
    if pos < end and buf[pos] == 0:
        return pos + 1
    count, pos = _uvarint(buf, pos, end)
    if count > MAX_TAGGED_FIELDS:
        raise TooManyTaggedFields(f"{count} tagged fields (at most {MAX_TAGGED_FIELDS}) at byte {pos}")
    for _ in range(count):
        _, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        if pos + size > end:
            raise BoundsExceeded(f"tagged field of {size} bytes at byte {pos} runs past the end ({end})")
        pos += size
    return pos


# -- the relay's fast path: a transactional Produce read where it lies in the client's read ---------------------

_BATCH = struct.Struct(">8xi4xb4xh20xqh")  # batch length, magic, attributes, producer id, epoch: one read
_ACKS = struct.Struct(">h")
_TRANSACTIONAL = 0x10
_BATCH_HEADER_SIZE = 61
_INDEX_SIZE = struct.Struct(">ii")  # a partition's index and records size
_INDEX_SIZE_BYTE = struct.Struct(">iB")  # flexible: the index and the size's first byte

# The common shape's runs (one topic, one partition, one batch), each a name and the fixed fields after it in
# one unpack (`Runs`): the transactional id, acks, timeout, topic count, name length; then the topic name,
# partition count, index, records size and the batch's length, magic, attributes, producer id and epoch.
# Flexible: counts and lengths are one-byte varints (value + 1), the size two bytes (a 512-byte record makes a
# ~590-byte batch; a batch under 127 bytes has a one-byte size and starts a byte earlier).
_ONE_TOPIC = Runs(">{}shiih")
_ONE_PARTITION = Runs(">{}siii8xi4xb4xh20xqh")
_ONE_TOPIC_FLEXIBLE = Runs(">{}shiBB")
_ONE_PARTITION_FLEXIBLE = Runs(">{}sBiBB8xi4xb4xh20xqh")

# (transactional id, producer id, producer epoch, partitions, acks)
TransactionalWrite = tuple[str, int, int, list[tuple[str, int]], int]


def scan_transactional(body: memoryview, flexible: bool) -> TransactionalWrite | None:
    """A plain transactional Produce read in place: `body` is the request from its transactional id to the
    frame's end (a view into the client's read); None when the relay's fast path must leave it to the general
    path (`scan_produce`).

    Plain means what the general path would pass without a second look: a non-null transactional id, at least
    one partition, each with at least one record batch, every batch a v2 transactional batch of one producer
    id and epoch (the first batch's), no partition twice, no tagged fields, nothing left over. Every length is
    checked against `stop` before it is used; anything else (a size past the end, a broken batch, a name that
    is not UTF-8, more partitions than REQUEST_MAX_ELEMENTS) is not judged here but left to the general path,
    which reads the frame again and judges it as it always did. Records are never copied.

    The common shape (one topic, one partition, one batch) is read first at fixed offsets, a few unpacks in
    all; whatever that reading does not take whole goes to the loop, which reads every shape and decides.
    """
    end = len(body)
    try:
        found = _one_batch_flexible(body, end) if flexible else _one_batch(body, end)
    except (struct.error, UnicodeDecodeError, IndexError):
        found = None  # not the common shape, or broken: the loop decides
    if found is not None:
        return found
    try:
        return _scan_transactional(body, 0, end, flexible)
    except (struct.error, UnicodeDecodeError, IndexError, BoundsExceeded):
        return None


# The common shape read at fixed offsets (v3-v8, then v9+). Each takes a frame only when the loop would take it
# and give the same (the loop's checks for one topic, partition and batch), and leaves any other to the loop.
# unpack_from refuses to read past the view's end, so each run is in bounds once read; a size is used only
# once it is checked to end where the frame ends. Names are decoded as the loop decodes them (strict UTF-8).

def _one_batch(buf: memoryview, end: int) -> TransactionalWrite | None:
    (n,) = _I16.unpack_from(buf, 0)
    if n <= 0:
        return None
    txn_id, acks, _, topics, m = _ONE_TOPIC[n].unpack_from(buf, 2)
    if topics != 1 or m < 0:
        return None  # m < 0: a null name, which the loop refuses
    # The name after the id's length and the id (2 + n), acks, timeout, topic count and name length (12); the
    # records after the name, partition count, index and size (n + 14 + m + 12).
    topic, partitions, index, size, length, magic, attributes, producer_id, epoch = \
        _ONE_PARTITION[m].unpack_from(buf, n + 14)
    if partitions != 1 or n + m + 26 + size != end or size < _BATCH_HEADER_SIZE or length + 12 != size \
            or magic != 2 or not attributes & _TRANSACTIONAL or producer_id < 0:
        return None  # more than one batch, or one the loop judges
    return txn_id.decode(), producer_id, epoch, [(topic.decode(), index)], acks


def _one_batch_flexible(buf: memoryview, end: int) -> TransactionalWrite | None:
    n = buf[0] - 1
    if not 0 < n < 0x7F:
        return None  # null, empty, or a length of two bytes
    txn_id, acks, _, topics, m = _ONE_TOPIC_FLEXIBLE[n].unpack_from(buf, 1)
    if topics != 2 or not 0 < m < 0x80:
        return None  # not one topic; a null name, or a length of two bytes
    # The name (m - 1 bytes) after the id's length and the id (1 + n), acks, timeout, topic count, name length.
    name_end = n + m + 8
    topic, partitions, index, s0, s1, length, magic, attributes, producer_id, epoch = \
        _ONE_PARTITION_FLEXIBLE[m - 1].unpack_from(buf, n + 9)
    if s1 < 0x80 <= s0:
        size, records = (s0 & 0x7F | s1 << 7) - 1, name_end + 7
    elif s0 < 0x80:
        size, records = s0 - 1, name_end + 6
        length, magic, attributes, producer_id, epoch = _BATCH.unpack_from(buf, records)
    else:
        return None
    # After the records: the partition's, the topic's and the request's tags, three empty ones, and the end.
    if partitions != 2 or records + size + 3 != end or buf[end - 3] or buf[end - 2] or buf[end - 1] \
            or size < _BATCH_HEADER_SIZE or length + 12 != size or magic != 2 or not attributes & _TRANSACTIONAL \
            or producer_id < 0:
        return None
    return txn_id.decode(), producer_id, epoch, [(topic.decode(), index)], acks


def _scan_transactional(buf: memoryview, pos: int, end: int,  # noqa: C901 - one pass, no helper per field
                        flexible: bool) -> TransactionalWrite | None:
    if flexible:
        n = buf[pos]  # one byte: the common case
        if n < 0x80:
            pos += 1
        else:
            n, pos = _uvarint(buf, pos, end)
        n -= 1
    else:
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
    if n <= 0 or pos + n > end:
        return None
    txn_id = buf[pos:pos + n].tobytes().decode()
    pos += n
    (acks,) = _ACKS.unpack_from(buf, pos)
    pos += _ACKS_AND_TIMEOUT
    if flexible:
        topics = buf[pos]  # one byte: the common case
        if topics < 0x80:
            pos += 1
        else:
            topics, pos = _uvarint(buf, pos, end)
        topics -= 1
    else:
        (topics,) = _I32.unpack_from(buf, pos)
        pos += 4
    if topics <= 0 or topics > end - pos:
        return None
    partitions: list[tuple[str, int]] = []
    producer_id = epoch = -2
    for _ in range(topics):
        if flexible:
            n = buf[pos]  # one byte: the common case
            if n < 0x80:
                pos += 1
            else:
                n, pos = _uvarint(buf, pos, end)
            n -= 1
        else:
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
        if n < 0 or pos + n > end:
            return None
        topic = buf[pos:pos + n].tobytes().decode()
        pos += n
        if flexible:
            count = buf[pos]  # one byte: the common case
            if count < 0x80:
                pos += 1
            else:
                count, pos = _uvarint(buf, pos, end)
            count -= 1
        else:
            (count,) = _I32.unpack_from(buf, pos)
            pos += 4
        if count <= 0 or count > end - pos or len(partitions) + count > REQUEST_MAX_ELEMENTS:
            return None
        for _ in range(count):
            if flexible:
                index, size = _INDEX_SIZE_BYTE.unpack_from(buf, pos)  # a one-byte size: the common case
                if size < 0x80:
                    pos += 5
                else:
                    size, pos = _uvarint(buf, pos + 4, end)
                size -= 1
            else:
                index, size = _INDEX_SIZE.unpack_from(buf, pos)
                pos += 8
            records_end = pos + size
            if size < _BATCH_HEADER_SIZE or records_end > end:
                return None
            while pos < records_end:  # every batch: v2, transactional, the request's producer
                if records_end - pos < _BATCH_HEADER_SIZE:
                    return None
                length, magic, attributes, pid, e = _BATCH.unpack_from(buf, pos)
                batch_end = pos + 12 + length
                if batch_end - pos < _BATCH_HEADER_SIZE or batch_end > records_end or magic != 2 \
                        or not attributes & _TRANSACTIONAL:
                    return None
                if pid != producer_id or e != epoch:
                    if producer_id != -2 or pid < 0:
                        return None
                    producer_id, epoch = pid, e
                pos = batch_end
            if flexible:
                if buf[pos]:
                    return None
                pos += 1
            partitions.append((topic, index))
        if flexible:
            if buf[pos]:
                return None
            pos += 1
    if flexible:
        if buf[pos]:
            return None
        pos += 1
    if pos != end or (len(partitions) > 1 and len(set(partitions)) != len(partitions)):
        return None
    return txn_id, producer_id, epoch, partitions, acks

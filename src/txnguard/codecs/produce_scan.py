"""Read what KIP-890 needs from a Produce request (v3-v11) in place, without a full decode.

Verification happens on every transactional Produce, so it sits on the hot path.
A full kio decode builds an object per topic and partition and copies every
record set (about 90 us for a 1 MB request, measured in bench/), only for the
guard to look at 61-byte batch headers. The scanner walks the request once and
returns the transactional id, acks and each partition's batch headers, reading
record sets through memoryview slices. The full decode is left to the rare
request that must be answered or re-encoded (some partition rejected).

Layout (ProduceRequest.json, versions 3-11; v9+ is flexible: compact lengths
as unsigned varints holding length+1, and tagged fields after each struct):

    TransactionalId  nullable string    Acks int16    TimeoutMs int32
    TopicData [ Name string, PartitionData [ Index int32, Records nullable bytes ] ]

Malformed input raises DecodeFailed, as a failed full decode does, so the proxy
closes the connection the same way for both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from txnguard.codecs.batches import batch_heads
from txnguard.codecs.errors import CodecError, DecodeFailed
from txnguard.codecs.header import RequestHead, peek_request, read_uvarint, request_body_offset
from txnguard.codecs.produce import ProducePartition

PRODUCE = 0
FIRST_SCANNED_VERSION = 3   # transactional ids appear in v3
LAST_SCANNED_VERSION = 11   # v12 is transaction version 2; v13 names topics by id
FIRST_FLEXIBLE_VERSION = 9

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class ProduceScan:
    head: RequestHead
    transactional_id: str | None
    acks: int
    partitions: list[ProducePartition]


def scan_produce(frame: bytes | memoryview) -> ProduceScan:
    """Scan a Produce request frame (without its length prefix)."""
    view = memoryview(frame)
    try:
        head = peek_request(view)
        if head.api_key != PRODUCE or not FIRST_SCANNED_VERSION <= head.api_version <= LAST_SCANNED_VERSION:
            raise DecodeFailed(f"api {head.api_key} v{head.api_version} is not a Produce request the scanner reads")
        reader = _Reader(view, request_body_offset(view, head), head.api_version >= FIRST_FLEXIBLE_VERSION)
        return _scan_body(reader, head)
    except DecodeFailed:
        raise
    except (CodecError, struct.error, UnicodeDecodeError, IndexError) as e:
        raise DecodeFailed(f"Produce request: {e}") from None


def _scan_body(r: _Reader, head: RequestHead) -> ProduceScan:
    txn_id = r.nullable_string()
    acks, _timeout = _ACKS_TIMEOUT.unpack_from(r.buf, r.pos)
    r.pos += _ACKS_TIMEOUT.size
    partitions: list[ProducePartition] = []
    for _ in range(r.array_length()):
        topic = r.nullable_string()
        if topic is None:
            raise DecodeFailed("Produce request: null topic name")
        for _ in range(r.array_length()):
            (index,) = _INT32.unpack_from(r.buf, r.pos)
            r.pos += 4
            records = r.nullable_bytes()
            partitions.append(ProducePartition(topic, index, batch_heads(records)))
            r.skip_tagged_fields()
        r.skip_tagged_fields()
    r.skip_tagged_fields()
    if r.pos != len(r.buf):
        raise DecodeFailed(f"Produce request: {len(r.buf) - r.pos} trailing bytes")
    return ProduceScan(head, txn_id, int(acks), partitions)


class _Reader:
    """A cursor over one request; `flexible` switches lengths to compact varints."""

    __slots__ = ("buf", "flexible", "pos")

    def __init__(self, buf: memoryview, pos: int, flexible: bool) -> None:
        self.buf, self.pos, self.flexible = buf, pos, flexible

    def _compact_length(self) -> int:
        """A flexible version's length: an unsigned varint holding length+1 (0 is null)."""
        b = self.buf[self.pos]
        if b < 0x80:  # almost every length fits one byte
            self.pos += 1
            return b - 1
        n, self.pos = read_uvarint(self.buf, self.pos)
        return n - 1

    def nullable_string(self) -> str | None:
        if self.flexible:
            n = self._compact_length()
        else:
            (n,) = _INT16.unpack_from(self.buf, self.pos)
            self.pos += 2
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise DecodeFailed("Produce request: a string runs past the end of the frame")
        s = str(self.buf[self.pos:end], "utf-8")
        self.pos = end
        return s

    def nullable_bytes(self) -> memoryview | None:
        if self.flexible:
            n = self._compact_length()
        else:
            (n,) = _INT32.unpack_from(self.buf, self.pos)
            self.pos += 4
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise DecodeFailed("Produce request: a record set runs past the end of the frame")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def array_length(self) -> int:
        if self.flexible:
            n = self._compact_length()
        else:
            (n,) = _INT32.unpack_from(self.buf, self.pos)
            self.pos += 4
        if n < 0:
            raise DecodeFailed("Produce request: a null array where the schema has none")
        # Every element takes at least one byte: a larger count is a lie, not a reason to loop.
        if n > len(self.buf) - self.pos:
            raise DecodeFailed(f"Produce request: an array of {n} elements cannot fit the frame")
        return n

    def skip_tagged_fields(self) -> None:
        if not self.flexible:
            return
        count, self.pos = read_uvarint(self.buf, self.pos)
        for _ in range(count):
            _tag, self.pos = read_uvarint(self.buf, self.pos)
            size, self.pos = read_uvarint(self.buf, self.pos)
            self.pos += size
        if self.pos > len(self.buf):
            raise DecodeFailed("Produce request: tagged fields run past the end of the frame")

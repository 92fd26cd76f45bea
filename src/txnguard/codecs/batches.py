"""Peek the fixed v2 record-batch header: the only part of the records KIP-890 needs.

Offsets (DefaultRecordBatch.java): baseOffset 0, batchLength 8, magic 16,
attributes 21 (bit 4 transactional, bit 5 control), producerId 43,
producerEpoch 51, baseSequence 53; the header is 61 bytes. Records are never
decompressed, parsed, split or merged.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from txnguard.codecs.errors import DecodeFailed

BATCH_HEADER_SIZE = 61
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
_LENGTH = struct.Struct(">i")
_MAGIC_AT = 16
_ATTRIBUTES = struct.Struct(">h")
_PRODUCER = struct.Struct(">qhi")  # producer id, epoch, base sequence at byte 43


@dataclass(frozen=True, slots=True)
class BatchHead:
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool


def batch_heads(records: bytes | memoryview | None) -> list[BatchHead]:
    """Headers of every v2 batch in a partition's record set (old message formats carry no transactions)."""
    if not records:
        return []
    out: list[BatchHead] = []
    pos, end = 0, len(records)
    while end - pos >= BATCH_HEADER_SIZE:
        (batch_length,) = _LENGTH.unpack_from(records, pos + 8)
        if batch_length < BATCH_HEADER_SIZE - 12 or pos + 12 + batch_length > end:
            raise DecodeFailed(f"record batch at {pos} claims {batch_length} bytes of {end - pos - 12}")
        if records[pos + _MAGIC_AT] == 2:
            (attributes,) = _ATTRIBUTES.unpack_from(records, pos + 21)
            pid, epoch, seq = _PRODUCER.unpack_from(records, pos + 43)
            out.append(BatchHead(pid, epoch, seq, bool(attributes & TRANSACTIONAL_FLAG),
                                 bool(attributes & CONTROL_FLAG)))
        pos += 12 + batch_length
    if pos != end:
        # Produce v3+ (every transactional one) carries v2 batches only, none shorter than the header.
        raise DecodeFailed(f"record batch at {pos} is truncated: {end - pos} bytes, less than its header")
    return out

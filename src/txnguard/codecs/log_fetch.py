"""The transaction log follower's Fetch (v12), written and read by hand.

The follower long-polls `__transaction_state` for every partition a broker leads, and every answer lists each
of them, most without records. Built and decoded with kio, one such round cost about 1 ms of CPU at 50 partitions
(building the request's objects, encoding them, decoding the answer): more than the client path of the
transaction it reported, once per record the coordinator appends. Here the request is packed with `struct` and
the answer read in place by the native reader (native/src/fetch.rs), with kio as the fallback and the oracle:
the unit tests compare the request's bytes with kio's encoding, the property tests the answer with kio's
decoding. An answer the native reader does not read whole goes to kio, which decodes it or refuses it
(`DecodeFailed`), as before.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from txnguard.codecs import native, schemas
from txnguard.codecs.api_keys import ApiKey

VERSION = 12
_HEAD = struct.Struct(">hhih")  # api key, version, correlation id, client id length (then tags)
# replica id, max wait, min bytes, max bytes, isolation level, session id, session epoch
_TOP = struct.Struct(">iiiibii")
# partition, current leader epoch, fetch offset, last fetched epoch, log start offset, partition max bytes, tags
_PARTITION = struct.Struct(">iiqiqib")
_NO_SESSION, _NO_SESSION_EPOCH, _UNKNOWN = 0, -1, -1
_READ_UNCOMMITTED = 0  # the coordinator's log has no transactions of its own
_CONSUMER = -1         # replica id: not a broker


class Wanted(NamedTuple):
    """One partition of the request: where to read from, and the leader epoch Metadata named (-1: none)."""

    partition: int
    leader_epoch: int
    fetch_offset: int
    max_bytes: int


class Fetched(NamedTuple):
    """One partition of the answer; `records` is a view into the answer (None: no records)."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview | None


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fetch_request(correlation_id: int, client_id: str, topic: str, partitions: Sequence[Wanted], *,
                  max_wait_ms: int, min_bytes: int, max_bytes: int) -> bytes:
    """The whole request frame (length prefix included), as kio would encode it."""
    client = client_id.encode()
    name = topic.encode()
    parts = [_HEAD.pack(ApiKey.FETCH.value, VERSION, correlation_id, len(client)), client, b"\x00",
             _TOP.pack(_CONSUMER, max_wait_ms, min_bytes, max_bytes, _READ_UNCOMMITTED, _NO_SESSION,
                       _NO_SESSION_EPOCH),
             b"\x02", _uvarint(len(name) + 1), name, _uvarint(len(partitions) + 1)]
    pack = _PARTITION.pack
    parts.extend(pack(p.partition, p.leader_epoch, p.fetch_offset, _UNKNOWN, _UNKNOWN, p.max_bytes, 0)
                 for p in partitions)
    parts.append(b"\x00\x01\x01\x00")  # topic tags, no forgotten topics, an empty rack id, top-level tags
    body = b"".join(parts)
    return struct.pack(">i", len(body)) + body


def read_fetch_answer(body: memoryview) -> tuple[int, list[Fetched]]:
    """(top-level error, every partition) of a Fetch v12 answer: `body` is the frame after its length prefix.
    Raises `DecodeFailed` (kio's verdict) for an answer that cannot be read."""
    if native.AVAILABLE:
        found = native.read_fetch_answer(body, 0, len(body))
        if found is not None:
            error, topics = found
            return error, [Fetched(name, p, code, hw, log_start, body[s:e] if s >= 0 else None)
                           for name, parts in topics for p, code, hw, log_start, s, e in parts]
    _, answer = schemas.decode_response(body, ApiKey.FETCH.value, VERSION)
    return int(answer.error_code), [
        Fetched(str(t.topic), int(p.partition_index), int(p.error_code), int(p.high_watermark),
                int(p.log_start_offset), None if p.records is None else memoryview(p.records))
        for t in answer.responses for p in t.partitions]

"""Peek at request and response headers without decoding bodies.

Every request header starts api_key:int16, api_version:int16, correlation_id:int32
and (header v1+) client_id: a nullable int16-length string, even in flexible
headers. Flexible (v2) headers add tagged fields after it. That is all the
proxy needs to route, count and order a frame it does not inspect.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from txnguard.codecs.bounds import MAX_TAGGED_FIELDS
from txnguard.codecs.bounds import read_uvarint as bounds_read_uvarint
from txnguard.codecs.errors import BoundsExceeded, TooManyTaggedFields, TruncatedFrame, UnsupportedApiVersion
from txnguard.codecs.schemas import request_header_version

_KEY_VERSION_CORRELATION = struct.Struct(">hhi")
_new_head = tuple.__new__  # a NamedTuple from its fields' tuple, without its generated __new__ (a Python call)
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class RequestHead(NamedTuple):  # a tuple: built per request, where a frozen dataclass costs four times as much
    api_key: int
    api_version: int
    correlation_id: int


def peek_request(frame: bytes | memoryview) -> RequestHead:
    if len(frame) < 8:
        raise TruncatedFrame(f"request frame of {len(frame)} bytes has no header")
    return _new_head(RequestHead, _KEY_VERSION_CORRELATION.unpack_from(frame, 0))


def peek_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise TruncatedFrame(f"response frame of {len(frame)} bytes has no correlation id")
    return int(_INT32.unpack_from(frame, 0)[0])


def peek_client_id(frame: bytes | memoryview) -> str | None:
    """The client id of a v1+ request header (None when null or absent)."""
    if len(frame) < 10:
        return None
    (n,) = _INT16.unpack_from(frame, 8)
    if n < 0 or len(frame) < 10 + n:
        return None
    return bytes(frame[10:10 + n]).decode("utf-8", "replace")


def read_uvarint(frame: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it) of an unsigned varint; the flexible versions' lengths and tags.

    The bounded reader of codecs.bounds, with the header's own error: a header that ends early is a
    truncated frame (its close reason), not a size claim beyond the frame."""
    try:
        return bounds_read_uvarint(frame, pos, len(frame))
    except BoundsExceeded as e:
        raise TruncatedFrame(f"header: {e}") from None


def request_body_offset(frame: bytes | memoryview, head: RequestHead) -> int:
    """Where the request body starts. Raises UnsupportedApiVersion for what kio cannot name."""
    try:
        return _request_body_offset(frame, head)
    except struct.error as e:
        raise TruncatedFrame(f"request header: {e}") from None


def _request_body_offset(frame: bytes | memoryview, head: RequestHead) -> int:
    version = request_header_version(head.api_key, head.api_version)
    if version == 0:
        return 8
    n: int = _INT16.unpack_from(frame, 8)[0]
    pos: int = 10 + max(n, 0)
    if version >= 2:
        count, pos = read_uvarint(frame, pos)
        if count > MAX_TAGGED_FIELDS:
            # Millions of empty tags fit in a legal frame; walking them stalled every connection for seconds.
            raise TooManyTaggedFields(f"request header with {count} tagged fields (at most {MAX_TAGGED_FIELDS})")
        for _ in range(count):
            _, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
    if pos > len(frame):
        raise TruncatedFrame("request header runs past the end of the frame")
    return int(pos)


def produce_acks_and_txn_id_null(frame: bytes | memoryview, head: RequestHead) -> tuple[int, bool]:
    """(acks, transactional_id_is_null) of a Produce request, read in place.

    Produce v3+ starts with TransactionalId (int16-length string, or compact
    uvarint length+1 from v9), then Acks. v0-2 start with Acks and cannot be
    transactional. acks=0 means no response will come.
    """
    try:
        acks, is_null, _ = _produce_head(frame, head)
    except struct.error as e:
        raise TruncatedFrame(f"Produce request: {e}") from None
    return acks, is_null


FIRST_FLEXIBLE_PRODUCE = 9  # Produce v9+: a flexible header (tags) and a compact transactional id


def read_produce_head(data: bytes | memoryview, start: int, stop: int, version: int) -> tuple[int, int | None] | None:
    """The relay's one reader of a Produce (v3+) request's header, in place: the frame's header starts at
    `data[start]` (after the length prefix), the frame ends at `stop`. (where the transactional id starts,
    None) for a transactional write; (that place, acks) for any other; None when the general path must read
    it (a header with tagged fields, or a frame too short for its header, transactional id and acks).

    The v1/v2 request header: api key, version, correlation id, then the client id (int16 length, also in
    flexible headers), then (v2) tagged fields."""
    (n,) = _INT16.unpack_from(data, start + 8)
    at = start + 10 + (n if n > 0 else 0)
    if at + 4 > stop:
        return None
    if version >= FIRST_FLEXIBLE_PRODUCE:
        if data[at]:  # header tags
            return None
        at += 1
        if data[at]:  # a compact string's length + 1: 0 is null
            return at, None
        return at, _INT16.unpack_from(data, at + 1)[0]
    if _INT16.unpack_from(data, at)[0] != -1:
        return at, None
    return at, _INT16.unpack_from(data, at + 2)[0]


def produce_timeout_ms(frame: bytes | memoryview, head: RequestHead) -> int:
    """The Produce request's own TimeoutMs (right after Acks): how long the client lets the broker
    take. Clients send their request timeout here (Java and kafka-python `request.timeout.ms`,
    librdkafka's topic `request.timeout.ms`), so it also bounds how long the proxy may hold it."""
    try:
        _, _, pos = _produce_head(frame, head)
        if pos + 4 > len(frame):
            raise TruncatedFrame("Produce request ends before timeout_ms")
        return int(_INT32.unpack_from(frame, pos)[0])
    except struct.error as e:
        raise TruncatedFrame(f"Produce request: {e}") from None


def _produce_head(frame: bytes | memoryview, head: RequestHead) -> tuple[int, bool, int]:
    """(acks, transactional_id_is_null, offset of TimeoutMs)."""
    try:
        pos = request_body_offset(frame, head)
    except UnsupportedApiVersion:
        if head.api_version < 3:
            # kio dropped Produce v0-2; their body starts right after a v1 header.
            (n,) = _INT16.unpack_from(frame, 8)
            pos = 10 + max(n, 0)
            return int(_INT16.unpack_from(frame, pos)[0]), True, pos + 2
        raise
    if head.api_version < 3:
        return int(_INT16.unpack_from(frame, pos)[0]), True, pos + 2
    if head.api_version >= 9:
        length_plus_one, pos = read_uvarint(frame, pos)
        is_null = length_plus_one == 0
        pos += max(length_plus_one - 1, 0)
    else:
        (n,) = _INT16.unpack_from(frame, pos)
        is_null = n < 0
        pos += 2 + max(n, 0)
    if pos + 2 > len(frame):
        raise TruncatedFrame("Produce request ends before acks")
    return int(_INT16.unpack_from(frame, pos)[0]), is_null, pos + 2

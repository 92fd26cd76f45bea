"""Does a Produce (v10+) or Fetch (v16+) answer name brokers? Read in place, so that one that does not
passes untouched.

From these versions (KIP-951, Kafka 3.7) a broker may add the new leaders' addresses to its answer (the
top-level tagged field NodeEndpoints, only beside NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH errors); the
proxy must put its own listeners there. Decoding every answer with kio to find out cost ~15 us warm per
one-partition Produce, more per Fetch (its records copied into kio's objects), and took each one off the
relay's fast path, for a field that is absent in nearly all of them. This walks the answer with bounds
instead: every length and count checked against the end before use, records skipped by their length,
nothing built.

`endpoints_absent` says True only when the whole answer was read (nothing left over) and its top-level
tagged fields are empty; anything else (addresses present, any top-level tag, a version or shape it does
not read, a length past the end) is False, and kio reads the answer as before.
"""

from __future__ import annotations

import struct

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.bounds import read_uvarint
from txnguard.codecs.errors import BoundsExceeded

PRODUCE, FETCH = ApiKey.PRODUCE.value, ApiKey.FETCH.value
# The versions walked here: from the first with NodeEndpoints to the last whose layout is the one below
# (Produce v13 names topics by id: kio reads it).
READ = {PRODUCE: range(10, 13), FETCH: range(16, 19)}
# Produce: index, error code, base offset, log append time, log start offset.
_PRODUCE_PARTITION = 4 + 2 + 8 + 8 + 8
# Fetch: index, error code, high watermark, last stable offset, log start offset.
_FETCH_PARTITION = 4 + 2 + 8 + 8 + 8
_FETCH_TOP = 4 + 2 + 4  # throttle time, error code, session id
_UUID = 16


def endpoints_absent(body: memoryview, api_key: int, version: int) -> bool:
    """`body`: the answer from its correlation id on (the frame without its length prefix)."""
    versions = READ.get(api_key)
    if versions is None or version not in versions:
        return False
    try:
        return _produce(body, len(body)) if api_key == PRODUCE else _fetch(body, len(body))
    except (BoundsExceeded, struct.error, IndexError):
        return False


def _skip_tags(buf: memoryview, pos: int, end: int) -> int:
    count, pos = read_uvarint(buf, pos, end)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos, end)  # the tag
        size, pos = read_uvarint(buf, pos, end)
        pos += size
        if pos > end:
            raise BoundsExceeded("tagged field past the end")
    return pos


def _skip_bytes(buf: memoryview, pos: int, end: int) -> int:
    """A compact (nullable) string or byte array (records): its length + 1, then its bytes."""
    n, pos = read_uvarint(buf, pos, end)
    pos += max(n - 1, 0)
    if pos > end:
        raise BoundsExceeded("field past the end")
    return pos


def _count(buf: memoryview, pos: int, end: int, smallest: int, nullable: bool = False) -> tuple[int, int]:
    """A compact array's length; each element takes at least `smallest` bytes, so more cannot fit."""
    n, pos = read_uvarint(buf, pos, end)
    n -= 1
    if n == -1 and nullable:
        return 0, pos
    if n < 0 or n * smallest > end - pos:
        raise BoundsExceeded("array count past the end")  # null where it may not be, or more than fits
    return n, pos


def _top_level_tags_empty(buf: memoryview, pos: int, end: int) -> bool:
    # NodeEndpoints is tag 0; any tag at all goes to kio. Exactly one byte, a zero, must be left.
    return pos + 1 == end and buf[pos] == 0


def _produce(buf: memoryview, end: int) -> bool:
    pos = _skip_tags(buf, 4, end)  # after the correlation id: the response header's tags
    topics, pos = _count(buf, pos, end, 3)
    for _ in range(topics):
        pos = _skip_bytes(buf, pos, end)  # the topic's name
        partitions, pos = _count(buf, pos, end, _PRODUCE_PARTITION + 3)
        for _ in range(partitions):
            pos += _PRODUCE_PARTITION
            errors, pos = _count(buf, pos, end, 6)
            for _ in range(errors):
                pos = _skip_bytes(buf, pos + 4, end)  # batch index, its error message
                pos = _skip_tags(buf, pos, end)
            pos = _skip_bytes(buf, pos, end)  # the partition's error message
            pos = _skip_tags(buf, pos, end)   # CurrentLeader (an id and an epoch, no address)
        pos = _skip_tags(buf, pos, end)
    return _top_level_tags_empty(buf, pos + 4, end)  # after the throttle time


def _fetch(buf: memoryview, end: int) -> bool:
    pos = _skip_tags(buf, 4, end) + _FETCH_TOP
    topics, pos = _count(buf, pos, end, _UUID + 2)
    for _ in range(topics):
        partitions, pos = _count(buf, pos + _UUID, end, _FETCH_PARTITION + 7)
        for _ in range(partitions):
            aborted, pos = _count(buf, pos + _FETCH_PARTITION, end, 17, nullable=True)
            for _ in range(aborted):
                pos = _skip_tags(buf, pos + 16, end)  # producer id, first offset
            pos = _skip_bytes(buf, pos + 4, end)  # the preferred read replica, the records
            pos = _skip_tags(buf, pos, end)       # diverging epoch, current leader, snapshot id: no address
        pos = _skip_tags(buf, pos, end)
    return _top_level_tags_empty(buf, pos, end)

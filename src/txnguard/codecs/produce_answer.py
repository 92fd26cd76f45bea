"""Does a Produce answer (v10+) name brokers? Read in place, so that one that does not passes untouched.

From Produce v10 (KIP-951, Kafka 3.7) a broker may add the new leaders' addresses to its answer (the
top-level tagged field NodeEndpoints, only beside NOT_LEADER_OR_FOLLOWER errors); the proxy must put its
own listeners there. Decoding every answer with kio to find out cost ~15 us warm per Produce and took
each one off the relay's fast path, for a field that is absent in nearly all of them. This walks the
answer with bounds instead: every length and count checked against the end before use, nothing built.

`endpoints_absent` says True only when the whole answer was read (nothing left over) and its top-level
tagged fields are empty; anything else (addresses present, any top-level tag, a shape it does not read,
a length past the end) is False, and kio reads the answer as before.
"""

from __future__ import annotations

import struct

from txnguard.codecs.bounds import read_uvarint
from txnguard.codecs.errors import BoundsExceeded

FIRST_VERSION = 10    # NodeEndpoints appears in v10; earlier answers have no addresses at all
LAST_VERSION = 12     # v13 names topics by id (TV2 clients), not walked here: kio reads them
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8  # index, error code, base offset, log append time, log start offset
_I32 = struct.Struct(">i")


def endpoints_absent(body: memoryview, version: int) -> bool:
    """`body`: the answer from its correlation id on (the frame without its length prefix)."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        return False
    try:
        return _walk(body, len(body))
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


def _skip_string(buf: memoryview, pos: int, end: int) -> int:
    """A compact (nullable) string: its length + 1, then its bytes."""
    n, pos = read_uvarint(buf, pos, end)
    pos += max(n - 1, 0)
    if pos > end:
        raise BoundsExceeded("string past the end")
    return pos


def _count(buf: memoryview, pos: int, end: int, smallest: int) -> tuple[int, int]:
    """A compact array's length; each element takes at least `smallest` bytes, so more cannot fit."""
    n, pos = read_uvarint(buf, pos, end)
    n -= 1
    if n < 0 or n * smallest > end - pos:
        raise BoundsExceeded("array count past the end")  # null, or more elements than bytes
    return n, pos


def _walk(buf: memoryview, end: int) -> bool:
    pos = _skip_tags(buf, 4, end)  # after the correlation id: the response header's tags
    topics, pos = _count(buf, pos, end, 3)
    for _ in range(topics):
        pos = _skip_string(buf, pos, end)  # the topic's name
        partitions, pos = _count(buf, pos, end, _PARTITION_FIXED + 3)
        for _ in range(partitions):
            pos += _PARTITION_FIXED
            errors, pos = _count(buf, pos, end, 6)
            for _ in range(errors):
                pos = _skip_string(buf, pos + 4, end)  # batch index, its error message
                pos = _skip_tags(buf, pos, end)
            pos = _skip_string(buf, pos, end)  # the partition's error message
            pos = _skip_tags(buf, pos, end)    # CurrentLeader (an id and an epoch, no address)
        pos = _skip_tags(buf, pos, end)
    pos += 4  # throttle time
    if pos >= end:
        return False
    # The top-level tagged fields: NodeEndpoints is tag 0; any tag at all goes to kio.
    return buf[pos] == 0 and pos + 1 == end

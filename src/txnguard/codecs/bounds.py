"""Check every length and count of a frame against the bytes that remain, before kio reads it.

kio's native decoder sizes its arrays from the count a frame *claims*: a request
whose array count says four billion elements makes it ask the allocator for tens
of GiB and abort the whole process (no Python exception to catch). The broker
closes that one connection instead. So every frame the proxy decodes is first
walked here, field by field, following the same kio schema the decoder will use,
and refused when

* a string, bytes or records length runs past the end of the frame,
* an array claims more elements than the remaining bytes could hold at the
  element's smallest encoded size,
* a struct holds more tagged fields than `MAX_TAGGED_FIELDS`, or
* the frame holds more structs and tagged fields than its element budget
  (a frame that fits can still hold millions of tiny structs: walking and
  decoding them would stall every connection of the process).

Values are not checked (kio and the broker judge those); only sizes. A walk is
compiled once per schema class into a list of steps; consecutive fixed-width
fields collapse into one skip, and arrays of fixed-width values are skipped in
one step, so a typical Produce costs a handful of Python calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from txnguard.codecs.errors import BoundsExceeded, TooManyTaggedFields

# Generous next to Kafka's schemas (no struct defines more than a handful of tags).
MAX_TAGGED_FIELDS = 256
# Structs plus tagged fields a frame may hold. A client's inspected requests
# (Produce, AddPartitionsToTxn, TxnOffsetCommit) name at most thousands of
# partitions; a broker's Metadata for a very large cluster names a few hundred
# thousand. Walking one element costs ~0.3 us, so the caps bound a stall too.
REQUEST_MAX_ELEMENTS = 100_000
RESPONSE_MAX_ELEMENTS = 2_000_000

_FIXED_WIDTH = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
    "timedelta_i32": 4, "int64": 8, "uint64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
    "uuid": 16,
}
_LENGTH_PREFIXED = {"string": 2, "bytes": 4, "records": 4}  # legacy prefix widths


class _Walk:
    """One frame being walked: the bytes, where they end, and the element budget left."""

    __slots__ = ("budget", "buf", "end")

    def __init__(self, buf: bytes | memoryview, end: int, budget: int) -> None:
        self.buf, self.end, self.budget = buf, end, budget

    def spend(self, n: int, pos: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise BoundsExceeded(f"more structs and tagged fields than a frame may hold (at byte {pos})")

    def need(self, pos: int, n: int, what: str) -> int:
        if n < 0 or pos + n > self.end:
            raise BoundsExceeded(f"{what} of {n} bytes at byte {pos} runs past the end ({self.end})")
        return pos + n

    def uvarint(self, pos: int) -> tuple[int, int]:
        return read_uvarint(self.buf, pos, self.end)

    def int16(self, pos: int) -> int:
        self.need(pos, 2, "int16")
        return int.from_bytes(self.buf[pos:pos + 2], "big", signed=True)

    def int32(self, pos: int) -> int:
        self.need(pos, 4, "int32")
        return int.from_bytes(self.buf[pos:pos + 4], "big", signed=True)


def read_uvarint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of an unsigned varint that must end before `end`, in at most 5 bytes."""
    value = shift = 0
    while True:
        if pos >= end:
            raise BoundsExceeded(f"varint runs past the end ({end})")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise BoundsExceeded(f"unsigned varint longer than 5 bytes at byte {pos}")


Step = Callable[[_Walk, int], int]


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """How to walk one value, and the fewest bytes it can take (for count checks)."""

    walk: Step
    min_size: int
    fixed: int | None = None  # its exact width, when it has one


def _skip(n: int) -> Step:
    def step(w: _Walk, pos: int) -> int:
        return w.need(pos, n, "field")
    return step


def _length_prefixed(kind: str, flexible: bool) -> _Shape:
    """string / bytes / records: a legacy int16/int32 length or a compact uvarint length+1; -1/0 is null."""
    if flexible:
        def compact(w: _Walk, pos: int) -> int:
            if pos < w.end and w.buf[pos] < 0x80:  # a one-byte length: the common case, read inline
                n, pos = w.buf[pos], pos + 1
            else:
                n, pos = w.uvarint(pos)
            return pos if n == 0 else w.need(pos, n - 1, kind)
        return _Shape(compact, 1)
    width = _LENGTH_PREFIXED[kind]
    read = _Walk.int16 if width == 2 else _Walk.int32

    def legacy(w: _Walk, pos: int) -> int:
        n = read(w, pos)
        pos += width
        return pos if n == -1 else w.need(pos, n, kind)
    return _Shape(legacy, width)


def _primitive(kafka_type: str, flexible: bool) -> _Shape:
    width = _FIXED_WIDTH.get(kafka_type)
    if width is not None:
        return _Shape(_skip(width), width, width)
    if kafka_type in _LENGTH_PREFIXED:
        return _length_prefixed(kafka_type, flexible)
    raise TypeError(f"no size rule for kafka type {kafka_type!r}")


def _array(element: _Shape, flexible: bool, what: str) -> _Shape:
    """A legacy int32 count or a compact uvarint count+1 (-1/0: null), then the elements."""
    size, fixed, walk_element = element.min_size, element.fixed, element.walk

    def step(w: _Walk, pos: int) -> int:
        if flexible:
            n, pos = w.uvarint(pos)
            count = n - 1
        else:
            count = w.int32(pos)
            pos += 4
        if count <= 0:
            return pos  # null or empty
        if count * size > w.end - pos:
            raise BoundsExceeded(f"{what}: {count} elements of at least {size} bytes claimed with "
                                 f"{w.end - pos} bytes left (at byte {pos})")
        if fixed is not None:
            return pos + count * fixed
        for _ in range(count):
            pos = walk_element(w, pos)
        return pos
    return _Shape(step, 1 if flexible else 4)


def _field_shape(f: dataclasses.Field[Any], flexible: bool, header: bool) -> _Shape:
    kind = classify_field(f)
    if isinstance(kind, EntityTupleField):
        return _array(_entity_shape(kind.type_, header), flexible, f.name)
    if isinstance(kind, EntityField):
        inner = _entity_shape(kind.type_, header)
        if not is_optional(f):
            return inner
        # A nullable struct is an int8 marker (-1 null) then the struct, in Kafka's encoding.
        def nullable(w: _Walk, pos: int) -> int:
            w.need(pos, 1, "struct marker")
            return pos + 1 if w.buf[pos] == 0xFF else inner.walk(w, pos + 1)
        return _Shape(nullable, 1)
    kafka_type = f.metadata["kafka_type"]
    # A request header's client id stays a legacy string even in flexible headers (KIP-482).
    flex = flexible and not (header and f.name == "client_id")
    if isinstance(kind, PrimitiveTupleField):
        return _array(_primitive(kafka_type, flex), flex, f.name)
    return _primitive(kafka_type, flex)


def _tagged_fields(tagged: dict[int, _Shape]) -> Step:
    """A struct's tagged-field section: a count, then (tag, size, value) each; known tags are walked inside."""
    def step(w: _Walk, pos: int) -> int:
        if pos < w.end and w.buf[pos] == 0:
            return pos + 1  # no tagged fields: the common case
        count, pos = w.uvarint(pos)
        if count > MAX_TAGGED_FIELDS:
            raise TooManyTaggedFields(f"{count} tagged fields (at most {MAX_TAGGED_FIELDS}) at byte {pos}")
        if count * 2 > w.end - pos:
            raise BoundsExceeded(f"{count} tagged fields claimed with {w.end - pos} bytes left (at byte {pos})")
        w.spend(count, pos)
        for _ in range(count):
            tag, pos = w.uvarint(pos)
            size, pos = w.uvarint(pos)
            value_end = w.need(pos, size, f"tagged field {tag}")
            shape = tagged.get(tag)
            if shape is not None:
                outer_end, w.end = w.end, value_end  # a known tag's value must fit inside its size
                try:
                    shape.walk(w, pos)
                finally:
                    w.end = outer_end
            pos = value_end
        return pos
    return step


@cache
def _entity_shape(cls: type, header: bool = False) -> _Shape:
    flexible = bool(getattr(cls, "__flexible__", False))
    steps: list[Step] = []
    tagged: dict[int, _Shape] = {}
    min_size = 0
    run = 0  # consecutive fixed-width bytes, skipped in one step

    for f in dataclasses.fields(cls):
        shape = _field_shape(f, flexible, header)
        if "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = shape
            continue
        min_size += shape.min_size
        if shape.fixed is not None:
            run += shape.fixed
            continue
        if run:
            steps.append(_skip(run))
            run = 0
        steps.append(shape.walk)
    if run:
        steps.append(_skip(run))
    if flexible:
        steps.append(_tagged_fields(tagged))
        min_size += 1

    def walk(w: _Walk, pos: int) -> int:
        w.budget -= 1
        if w.budget < 0:
            w.spend(0, pos)  # raises
        for s in steps:
            pos = s(w, pos)
        return pos
    return _Shape(walk, min_size)


def check(header_cls: type, body_cls: type, frame: bytes | memoryview, max_elements: int) -> None:
    """Raise a CodecError unless every size in the header and body fits the frame."""
    w = _Walk(frame, len(frame), max_elements)
    pos = _entity_shape(header_cls, True).walk(w, 0)
    _entity_shape(body_cls).walk(w, pos)


def check_body(body_cls: type, body: bytes | memoryview, max_elements: int) -> None:
    """The same for a body on its own (a response whose header was already taken off)."""
    _entity_shape(body_cls).walk(_Walk(body, len(body), max_elements), 0)

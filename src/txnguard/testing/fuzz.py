"""A structure-aware mutator for Kafka frames: it knows where the counts and lengths are.

Random bytes almost never reach the interesting code: a flipped byte in a
Produce request usually breaks the header and is refused before any array is
read. This mutator parses a valid seed frame with the kio schema of its API and
version (the same dataclasses the proxy decodes with: each field's
`metadata["kafka_type"]`, arrays as tuples, `__flexible__` for compact
encodings and tagged fields), records the position of every structural
element, and then lies about exactly those elements:

* array counts, string/bytes/records lengths, tagged-field counts, tags and tag
  sizes: huge, negative, off-by-one, zero, just past the end;
* unsigned varints re-encoded in 5 to 10 bytes (same value, or all 0xff);
* truncation at every structural boundary (and one byte either side);
* millions of empty tagged fields, duplicated and unknown tags;
* record batches (61-byte v2 header): batchLength, magic, attributes,
  producer id and record count lies;
* the API version or key swapped (the same bytes read with another schema);
* the 4-byte frame length (shorter, longer, negative, huge, a TLS record);
* random byte flips, insertions and deletions.

Deterministic: `mutate(seed, random.Random(n))` gives the same case for the
same n, so `cases(seeds, s)` is reproducible from (s, index) alone. This module
never decodes with kio, so a mutation can be produced (and logged) even when
decoding it would abort the process.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from txnguard.codecs.schemas import request_schema, response_schema

_FIXED = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "timedelta_i32": 4,
    "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16,
}
BATCH_HEADER = 61
# Offsets inside a v2 record batch (DefaultRecordBatch.java) that the proxy reads or relies on.
_BATCH_FIELDS = {"batch_length": (8, 4), "magic": (16, 1), "attributes": (21, 2), "producer_id": (43, 8),
                 "producer_epoch": (51, 2), "base_sequence": (53, 4), "record_count": (57, 4)}
# Values a lying 32-bit count or length takes: the ones that abort, overflow or slip past an off-by-one.
_I32_LIES = (2**31 - 1, 2**31 - 2, 2**30, 0x10000000, 1_000_000_000, 65536, -1, -2, -(2**31), 0)
_I16_LIES = (2**15 - 1, 2**15 - 2, -1, -2, -(2**15), 0, 255, 256)
_UVARINT_LIES = (0, 1, 2**32 - 1, 2**31, 2**31 - 1, 2**28, 2**21, 2**14, 0x7F, 0x80)


class SeedParseError(ValueError):
    """A seed frame that does not follow its own schema (a bad seed, not a finding)."""


@dataclass(frozen=True, slots=True)
class Landmark:
    """One structural element of a frame, found by walking its schema."""

    kind: str  # array | string | bytes | records | tag_count | tag | tag_size | nullable | batch.<field>
    pos: int  # where its encoding starts
    width: int  # bytes of its encoding
    encoding: str  # i8 | i16 | i32 | i64 | uvarint
    value: int  # the value as encoded (compact lengths keep their +1)
    path: str  # schema path, for reports


@dataclass
class Structure:
    landmarks: list[Landmark] = field(default_factory=list)
    boundaries: set[int] = field(default_factory=set)  # offsets between fields
    records: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each records field


@dataclass(frozen=True)
class Seed:
    name: str
    api_key: int
    api_version: int
    direction: str  # request | response
    frame: bytes  # without the length prefix

    @property
    def is_request(self) -> bool:
        return self.direction == "request"


@dataclass(frozen=True)
class Case:
    """A mutated frame. `stream` is what goes on the wire (length prefix, possibly a lie, then `frame`)."""

    seed: str
    api_key: int
    api_version: int  # the version the receiver is told (a response is decoded as this)
    direction: str
    mutation: str
    frame: bytes
    stream: bytes
    records: bytes | None = None  # the mutated record set, when a batch header was mutated

    def describe(self) -> str:
        return json.dumps({"seed": self.seed, "api_key": self.api_key, "api_version": self.api_version,
                           "direction": self.direction, "mutation": self.mutation, "frame_len": len(self.frame),
                           "stream_hex": self.stream.hex() if len(self.stream) <= 4096 else
                           self.stream[:4096].hex() + "..."})


# -- reading the structure of a valid frame ------------------------------------------------------


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise SeedParseError(f"varint runs past {pos}")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def uvarint(value: int, min_width: int = 1) -> bytes:
    """An unsigned varint; `min_width` pads it with continuation bytes (same value, non-canonical)."""
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value or len(out) + 1 < min_width:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Walker:
    """Walks a frame with a kio schema, recording landmarks; raises SeedParseError if it does not fit."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.out = data, 0, Structure()

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > len(self.data):
            raise SeedParseError(f"{n} bytes at {self.pos} run past {len(self.data)}")
        start = self.pos
        self.pos += n
        return start

    def fixed(self, kind: str, width: int, encoding: str, path: str) -> int:
        start = self.take(width)
        value = int.from_bytes(self.data[start:start + width], "big", signed=True)
        self.out.landmarks.append(Landmark(kind, start, width, encoding, value, path))
        return value

    def varint(self, kind: str, path: str) -> int:
        start = self.pos
        value, self.pos = read_uvarint(self.data, self.pos)
        self.out.landmarks.append(Landmark(kind, start, self.pos - start, "uvarint", value, path))
        return value

    def length(self, kind: str, flexible: bool, legacy_width: int, path: str) -> int:
        """A length or count, as the number of items (-1 for null)."""
        if flexible:
            return self.varint(kind, path) - 1
        return self.fixed(kind, legacy_width, f"i{legacy_width * 8}", path)

    def entity(self, cls: Any, path: str, request_header: bool = False) -> None:
        tagged: dict[int, Any] = {}
        for f in fields(cls):
            tag = get_field_tag(f)
            if tag is not None:
                tagged[int(tag)] = f
                continue
            self.out.boundaries.add(self.pos)
            self.field(f, cls.__flexible__, f"{path}.{f.name}", request_header, is_tag=False)
        if cls.__flexible__:
            self.out.boundaries.add(self.pos)
            self.tagged_fields(tagged, path)
        self.out.boundaries.add(self.pos)

    def tagged_fields(self, tagged: dict[int, Any], path: str) -> None:
        for _ in range(self.varint("tag_count", f"{path}._tags")):
            self.out.boundaries.add(self.pos)
            tag = self.varint("tag", f"{path}._tag")
            size = self.varint("tag_size", f"{path}._tag{tag}")
            end = self.pos + size
            f = tagged.get(tag)
            if f is None:
                self.take(size)
            else:
                self.field(f, True, f"{path}.{f.name}", False, is_tag=True)
                if self.pos != end:
                    raise SeedParseError(f"tag {tag} of {path} holds {size} bytes, read {self.pos - end + size}")

    def field(self, f: Any, flexible: bool, path: str, request_header: bool, is_tag: bool) -> None:
        kind = classify_field(f)
        # Struct fields carry no kafka_type; primitives (and arrays of them) always do.
        kafka_type = "" if isinstance(kind, EntityField | EntityTupleField) else get_schema_field_type(f)
        if request_header and f.name == "client_id":
            self.string("string", False, path)  # always a legacy string (RequestHeader.json)
            return
        if kind.is_array:
            count = self.length("array", flexible, 4, path)
            for i in range(max(count, 0)):
                self.out.boundaries.add(self.pos)
                self.item(kind, kafka_type, flexible, f"{path}[{i}]")
            return
        if isinstance(kind, EntityField):
            if not is_tag and is_optional(f) and self.fixed("nullable", 1, "i8", path) < 0:
                return
            self.entity(kind.type_, path)
            return
        self.primitive(kafka_type, flexible, path)

    def item(self, kind: Any, kafka_type: str, flexible: bool, path: str) -> None:
        if isinstance(kind, EntityTupleField):
            self.entity(kind.type_, path)
        else:
            self.primitive(kafka_type, flexible, path)

    def primitive(self, kafka_type: str, flexible: bool, path: str) -> None:
        if kafka_type in _FIXED:
            self.take(_FIXED[kafka_type])
        elif kafka_type == "string":
            self.string("string", flexible, path)
        elif kafka_type in ("bytes", "records"):
            start = self.pos
            n = self.length(kafka_type, flexible, 4, path)
            content = self.pos
            self.take(max(n, 0))
            if kafka_type == "records" and n > 0:
                self.out.records.append((content, self.pos))
                self.batches(content, self.pos, path)
            del start
        else:
            raise SeedParseError(f"unknown kafka_type {kafka_type} at {path}")

    def string(self, kind: str, flexible: bool, path: str) -> None:
        n = self.length(kind, flexible, 2, path)
        self.take(max(n, 0))

    def batches(self, start: int, end: int, path: str) -> None:
        pos = start
        while end - pos >= BATCH_HEADER:
            self.out.boundaries.update((pos, pos + BATCH_HEADER))
            for name, (offset, width) in _BATCH_FIELDS.items():
                value = int.from_bytes(self.data[pos + offset:pos + offset + width], "big", signed=True)
                self.out.landmarks.append(Landmark(f"batch.{name}", pos + offset, width, f"i{width * 8}", value,
                                                   f"{path}@{pos - start}"))
            (length,) = struct.unpack_from(">i", self.data, pos + 8)
            if length < BATCH_HEADER - 12:
                return
            pos += 12 + length


@cache
def _schemas(api_key: int, api_version: int, direction: str) -> tuple[Any, Any]:
    cls = request_schema(api_key, api_version) if direction == "request" else response_schema(api_key, api_version)
    return cls.__header_schema__, cls


def structure(seed: Seed) -> Structure:
    """Landmarks of a valid frame: header and body walked with the frame's own kio schema."""
    header_cls, body_cls = _schemas(seed.api_key, seed.api_version, seed.direction)
    w = _Walker(seed.frame)
    w.entity(header_cls, "header", request_header=seed.is_request)
    w.entity(body_cls, body_cls.__name__)
    if w.pos != len(seed.frame):
        raise SeedParseError(f"{seed.name}: {len(seed.frame) - w.pos} bytes left after the body")
    return w.out


# -- mutations -----------------------------------------------------------------------------------

Mutation = Callable[[bytes, Structure, random.Random], tuple[bytes, str]]


def _pick(rng: random.Random, marks: Sequence[Landmark]) -> Landmark | None:
    return rng.choice(marks) if marks else None


def _write_int(data: bytes, mark: Landmark, value: int) -> bytes:
    bits = mark.width * 8
    value = ((value + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))  # wrap into the signed width
    return data[:mark.pos] + value.to_bytes(mark.width, "big", signed=True) + data[mark.pos + mark.width:]


def _splice(data: bytes, mark: Landmark, encoded: bytes) -> bytes:
    return data[:mark.pos] + encoded + data[mark.pos + mark.width:]


def _lie_value(rng: random.Random, mark: Landmark, remaining: int) -> int:
    """A count or length that is wrong in an interesting way."""
    choice = rng.random()
    if choice < 0.25:
        return mark.value + rng.choice((-1, 1, 2, -2))
    if choice < 0.35:
        return remaining + rng.choice((0, 1, 2))
    if mark.encoding == "uvarint":
        return rng.choice(_UVARINT_LIES)
    if mark.encoding == "i16":
        return rng.choice(_I16_LIES)
    return rng.choice(_I32_LIES)


_LENGTH_KINDS = ("array", "string", "bytes", "records", "tag_count", "tag_size")


def mutate_length(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    mark = _pick(rng, [m for m in s.landmarks if m.kind in _LENGTH_KINDS])
    if mark is None:
        return flip_bytes(data, s, rng)
    value = _lie_value(rng, mark, len(data) - mark.pos - mark.width)
    encoded = uvarint(max(value, 0)) if mark.encoding == "uvarint" else None
    out = _splice(data, mark, encoded) if encoded is not None else _write_int(data, mark, value)
    return out, f"length {mark.kind} {mark.path}@{mark.pos}: {mark.value} -> {value}"


def overlong_varint(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    mark = _pick(rng, [m for m in s.landmarks if m.encoding == "uvarint"])
    if mark is None:
        return flip_bytes(data, s, rng)
    width = rng.randint(5, 10)
    if rng.random() < 0.5:
        encoded, what = uvarint(mark.value, width), "padded"
    else:
        encoded, what = b"\xff" * (width - 1) + rng.choice((b"\x0f", b"\x7f", b"\x01")), "all-ones"
    return _splice(data, mark, encoded), f"varint {what} {width}B {mark.kind} {mark.path}@{mark.pos}"


def truncate(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    cut = rng.choice(sorted(s.boundaries)) + rng.choice((0, 0, 0, -1, 1))
    cut = min(max(cut, 0), len(data) - 1) if data else 0
    return data[:cut], f"truncate at {cut} of {len(data)}"


def tag_flood(data: bytes, s: Structure, rng: random.Random, max_tags: int = 2_000_000) -> tuple[bytes, str]:
    """Put many empty (or duplicated, or unknown) tagged fields in front of a struct's own, or only claim them."""
    mark = _pick(rng, [m for m in s.landmarks if m.kind == "tag_count"])
    if mark is None:
        return mutate_length(data, s, rng)
    style = rng.choice(("empty", "duplicate", "unknown", "claimed"))
    n = rng.choice((2, 3, 300, max(max_tags // 30, 1), max_tags))
    if style == "unknown":
        n = min(n, 70_000)
    count = n if style == "claimed" else n + mark.value  # claimed: nothing follows the count but the old tags
    out = data[:mark.pos] + uvarint(count) + _flood(style, n) + data[mark.pos + mark.width:]
    return out, f"tag flood {style} x{n} {mark.path}@{mark.pos}"


@cache
def _flood(style: str, n: int) -> bytes:
    """The flood's bytes; cached, since a run draws the same few sizes again and again."""
    if style == "empty":  # n distinct tags, each zero bytes long
        return b"".join(uvarint(t) + b"\x00" for t in range(n))
    if style == "duplicate":  # the same known-looking tag over and over
        return b"\x00\x01\x00" * n
    if style == "unknown":  # high tag numbers with opaque payloads
        return b"".join(uvarint(10_000 + t) + b"\x02ab" for t in range(n))
    return b""


_BATCH_LIES = {
    "batch_length": lambda v: (2**31 - 1, -1, 0, 48, 49, v - 1, v + 1, v + 1000),
    "magic": lambda v: (0, 1, 3, -1, 127),
    "attributes": lambda v: (v ^ 0x10, v ^ 0x20, v | 0x30, 0x7, -1, 0x10 | 0x4),
    "producer_id": lambda v: (-1, 0, 2**63 - 1, -(2**63), v + 1),
    "producer_epoch": lambda v: (-1, 2**15 - 1, v + 1),
    "base_sequence": lambda v: (-1, 2**31 - 1),
    "record_count": lambda v: (2**31 - 1, -1, 0, v + 1, 10**9),
}


def mutate_batch(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    mark = _pick(rng, [m for m in s.landmarks if m.kind.startswith("batch.")])
    if mark is None:
        return mutate_length(data, s, rng)
    value = rng.choice(_BATCH_LIES[mark.kind.removeprefix("batch.")](mark.value))
    return _write_int(data, mark, value), f"{mark.kind} {mark.path}: {mark.value} -> {value}"


def cut_batch(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    """A record set cut short inside a batch, with the records length still telling the truth about the cut."""
    marks = [m for m in s.landmarks if m.kind == "records" and m.value > 0]
    mark = _pick(rng, marks)
    if mark is None:
        return truncate(data, s, rng)
    start = mark.pos + mark.width
    n = mark.value - 1 if mark.encoding == "uvarint" else mark.value
    keep = rng.choice((1, 12, 20, BATCH_HEADER - 1, BATCH_HEADER, max(n - 1, 0)))
    keep = min(keep, n)
    new_len = uvarint(keep + 1) if mark.encoding == "uvarint" else struct.pack(">i", keep)
    out = data[:mark.pos] + new_len + data[start:start + keep] + data[start + n:]
    return out, f"records cut to {keep} of {n} {mark.path}@{mark.pos}"


def flip_bytes(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    if not data:
        return b"\x00", "flip on empty"
    out = bytearray(data)
    spots = []
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] = rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256), out[i] ^ (1 << rng.randrange(8))))
        spots.append(i)
    return bytes(out), f"flip bytes at {sorted(spots)}"


def insert_delete(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    at = rng.choice(sorted(s.boundaries)) if s.boundaries else 0
    if rng.random() < 0.5 and at < len(data):
        n = rng.randint(1, 4)
        return data[:at] + data[at + n:], f"delete {n} at {at}"
    junk = rng.choice((b"\x00", b"\xff", b"\x80\x80\x80\x80\x80", b"\x7f\xff\xff\xff", bytes(rng.randrange(256)
                                                                                         for _ in range(3))))
    return data[:at] + junk + data[at:], f"insert {junk.hex()} at {at}"


def swap_version(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    """Request only: the same bytes under another version (or API key) in the header."""
    if rng.random() < 0.8:
        version = struct.unpack_from(">h", data, 2)[0] + rng.choice((-2, -1, 1, 2))
        return data[:2] + struct.pack(">h", max(version, 0)) + data[4:], f"request version -> {max(version, 0)}"
    key = rng.choice((0, 3, 10, 18, 22, 24, 25, 26, 28, 60, 61, 65))
    return struct.pack(">h", key) + data[2:], f"request api key -> {key}"


MUTATIONS: dict[str, tuple[float, Mutation]] = {
    "length": (0.30, mutate_length),
    "varint": (0.08, overlong_varint),
    "truncate": (0.12, truncate),
    "tags": (0.07, tag_flood),
    "batch": (0.10, mutate_batch),
    "cut_batch": (0.04, cut_batch),
    "flip": (0.12, flip_bytes),
    "insdel": (0.07, insert_delete),
    "version": (0.05, swap_version),
    "stack": (0.05, lambda d, s, r: _stack(d, s, r)),
}


def _stack(data: bytes, s: Structure, rng: random.Random) -> tuple[bytes, str]:
    """Two independent mutations (positions of the second are from the seed, which is fine: it is fuzz)."""
    a, what_a = mutate_length(data, s, rng)
    b, what_b = flip_bytes(a, s, rng) if rng.random() < 0.5 else mutate_batch(a, s, rng)
    return b, f"{what_a}; {what_b}"


def _frame_length_lie(body: bytes, rng: random.Random) -> tuple[bytes, str]:
    true = len(body)
    lie = rng.choice((true - 1, true + 1, true + 100, 0, -1, -(2**31), 2**31 - 1, 100 * 1024 * 1024 + 1,
                      0x16030100, 0x47455420))  # a TLS ClientHello, "GET "
    return struct.pack(">i", lie) + body, f"frame length {true} -> {lie}"


# -- putting it together -------------------------------------------------------------------------


class Mutator:
    """Seeds with their parsed structure; `case(i)` is the i-th mutated frame of run `seed`."""

    def __init__(self, seeds: Sequence[Seed], seed: int = 0, max_tags: int = 2_000_000,
                 frame_lies: float = 0.05) -> None:
        self.seed, self.max_tags, self.frame_lies = seed, max_tags, frame_lies
        self.seeds: list[tuple[Seed, Structure]] = []
        self.skipped: list[str] = []
        for s in seeds:
            try:
                self.seeds.append((s, structure(s)))
            except (SeedParseError, ValueError) as e:  # UnsupportedApiVersion is a ValueError too
                self.skipped.append(f"{s.name}: {e}")
        if not self.seeds:
            raise ValueError("no usable seed frames")
        self._names = [n for n, _ in MUTATIONS.items()]
        self._weights = [w for w, _ in MUTATIONS.values()]

    def case(self, index: int) -> Case:
        rng = random.Random(f"{self.seed}:{index}")
        return self.mutate(*rng.choice(self.seeds), rng)

    def mutate(self, seed: Seed, s: Structure, rng: random.Random, kind: str | None = None) -> Case:
        name = kind or rng.choices(self._names, self._weights)[0]
        if name == "version" and not seed.is_request:
            name = "length"
        if name == "tags":
            frame, what = tag_flood(seed.frame, s, rng, self.max_tags)
        else:
            frame, what = MUTATIONS[name][1](seed.frame, s, rng)
        if rng.random() < self.frame_lies:
            stream, lie = _frame_length_lie(frame, rng)
            what = f"{what}; {lie}"
        else:
            stream = struct.pack(">i", len(frame)) + frame
        records = _records_of(frame, seed.frame, s) if name in ("batch", "cut_batch") else None
        return Case(seed.name, seed.api_key, seed.api_version, seed.direction, f"{name}: {what}", frame, stream,
                    records)

    def cases(self, count: int, start: int = 0) -> Iterator[Case]:
        for i in range(start, start + count):
            yield self.case(i)


def _records_of(frame: bytes, original: bytes, s: Structure) -> bytes | None:
    """The mutated record set, for batch_heads: fixed-width batch lies keep every position."""
    if len(frame) != len(original) or not s.records:
        return None
    start, end = s.records[0]
    return frame[start:end]


def load_seeds(directory: str | Path) -> list[Seed]:
    """The corpus bench/record_seeds.py writes (tests/data/frames): corpus.json, one entry per frame."""
    doc = json.loads((Path(directory) / "corpus.json").read_text())
    return [Seed(e["name"], int(e["api_key"]), int(e["api_version"]), e["direction"], bytes.fromhex(e["hex"]))
            for e in doc["frames"]]

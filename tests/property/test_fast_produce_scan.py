"""The relay's in-place reader of a transactional Produce (the native one: `native.scan_transactional`,
native/src/produce.rs) never takes what the general path would judge otherwise: whenever it answers, kio
decodes the frame to the same transactional id, acks, partitions in the same order and records, and the general
path's scan (`scan_produce`, then the plan) finds every partition's batches readable, transactional and of that
producer. Frames are built with kio and then mutated."""

from __future__ import annotations

import datetime
import struct
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from txnguard.codecs import native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import peek_request, request_body_offset
from txnguard.codecs.produce_scan import scan_produce
from txnguard.testing.raw import build_batch


def scan_transactional(body: memoryview, flexible: bool) -> Any:
    """The native reader over `body` (the request from its transactional id), as the relay calls it: on the
    client's whole read with the body's bounds (here a frame of its own)."""
    return native.scan_transactional(body, 0, len(body), flexible)


def _module(version: int) -> Any:
    return sys.modules[schemas.request_schema(ApiKey.PRODUCE, version).__module__]


@st.composite
def produce_frames(draw: st.DrawFn) -> tuple[bytes, int]:
    version = draw(st.integers(3, 11))
    m = _module(version)
    topics = []
    for t in range(draw(st.integers(1, 3))):
        parts = []
        for p in draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)):
            batches = b"".join(build_batch(
                [b"v" * draw(st.integers(0, 40))],
                producer_id=draw(st.sampled_from([7, 7, 7, 8, -1])), producer_epoch=draw(st.sampled_from([0, 0, 1])),
                transactional=draw(st.sampled_from([True, True, True, False])),
                timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
                for _ in range(draw(st.integers(1, 2))))
            parts.append(m.PartitionProduceData(index=p, records=batches))
        topics.append(m.TopicProduceData(name=draw(st.sampled_from(["orders", "é", "x" * 200])) + str(t % 2),
                                         partition_data=tuple(parts)))
    txn_id = draw(st.sampled_from(["app", "a" * 300, "ü"]))
    frame = schemas.encode_request(m.ProduceRequest(
        transactional_id=txn_id, acks=draw(st.sampled_from([-1, 1, 0])), timeout=datetime.timedelta(seconds=30),
        topic_data=tuple(topics)), 1, "fuzz")
    return frame, version


def _fast(frame: bytes, version: int) -> Any:
    body = memoryview(frame)[4:]
    at = request_body_offset(body, peek_request(body))
    return scan_transactional(body[at:], version >= 9)


def _agrees(frame: bytes, version: int) -> bool:
    """Whether the fast reader answered; when it did, that the general path reads the same."""
    try:
        found = _fast(frame, version)
    except CodecError:
        return False  # the header itself is broken: the relay loop never gets that far
    if found is None:
        return False
    txn_id, pid, epoch, partitions, acks = found
    body = memoryview(frame)[4:]
    # kio, the oracle, on the body (the client id in the header is not the reader's: the relay reads it once,
    # from the connection's first request): raises nothing, the fast reader saw it whole.
    head = peek_request(body)
    at = request_body_offset(body, head)
    decoded, used = entity_reader(schemas.request_schema(ApiKey.PRODUCE, version))(body, at)
    assert at + used == len(body)
    assert (decoded.transactional_id, decoded.acks) == (txn_id, acks)
    assert [(t.name, p.index) for t in decoded.topic_data for p in t.partition_data] == partitions
    general_id, general = scan_produce(body, peek_request(body))
    assert general_id == txn_id
    assert [(p.topic, p.partition) for p in general] == partitions
    for p in general:
        assert p.invalid is None and p.heads
        assert all(h.transactional and (h.producer_id, h.producer_epoch) == (pid, epoch) for h in p.heads)
    assert len(set(partitions)) == len(partitions)
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(produce_frames())
def test_a_well_formed_write_is_read_as_the_general_path_reads_it(built: tuple[bytes, int]) -> None:
    frame, version = built
    _agrees(frame, version)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(produce_frames(), st.data())
def test_a_mutated_write_is_taken_only_when_the_general_path_reads_the_same(built: tuple[bytes, int],
                                                                          data: st.DataObject) -> None:
    frame, version = built
    mutated = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(8, len(mutated) - 1))  # past the length, key and version
        mutated[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        mutated = mutated[:data.draw(st.integers(12, len(mutated)))]
    _agrees(bytes(mutated), version)


def test_plain_writes_are_taken() -> None:
    """Not vacuous: a plain transactional write of every version is read by the fast reader."""
    for version in range(3, 12):
        m = _module(version)
        batch = build_batch([b"v"], producer_id=7, producer_epoch=0, transactional=True)
        frame = schemas.encode_request(m.ProduceRequest(
            transactional_id="app", acks=-1, timeout=datetime.timedelta(seconds=30),
            topic_data=(m.TopicProduceData(name="orders", partition_data=(
                m.PartitionProduceData(index=0, records=batch), m.PartitionProduceData(index=1, records=batch))),)),
            1, "fuzz")
        assert _fast(frame, version) == ("app", 7, 0, [("orders", 0), ("orders", 1)], -1)
        assert _agrees(frame, version)


# -- shapes around the common one (one topic, one partition, one batch), each with the answer it must get -------


def _body(frame: bytes) -> memoryview:
    """The request from its transactional id: what the relay passes."""
    body = memoryview(frame)[4:]
    return body[request_body_offset(body, peek_request(body)):]


def _batch(value: int = 512, producer_id: int = 7, transactional: bool = True) -> bytes:
    return build_batch([b"v" * value], producer_id=producer_id, producer_epoch=0, transactional=transactional,
                       timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))


def _write(version: int, partitions: Any = None, txn_id: str = "app", topics: int = 1) -> bytes:
    """A Produce to topics orders0, orders1, ... of `partitions` ((index, records) each; default: partition 0,
    one batch of one 512-byte record)."""
    m = _module(version)
    parts = partitions or [(0, _batch())]
    return schemas.encode_request(m.ProduceRequest(
        transactional_id=txn_id, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=tuple(m.TopicProduceData(name=f"orders{t}", partition_data=tuple(
            m.PartitionProduceData(index=p, records=r) for p, r in parts)) for t in range(topics))), 1, "fuzz")


def _set(frame: bytes, at: int, value: bytes) -> bytes:
    return frame[:at] + value + frame[at + len(value):]


def _answer(topics: int = 1, indexes: tuple[int, ...] = (0,), txn_id: str = "app") -> Any:
    return txn_id, 7, 0, [(f"orders{t}", i) for t in range(topics) for i in indexes], -1


def _cases(version: int) -> dict[str, tuple[bytes, Any, bool]]:
    """Per shape around the common one: (frame, what scan_transactional answers, whether the Python reader
    before the native one took it at fixed offsets rather than in its loop: kept, each shape's reason to be
    here)."""
    flexible = version >= 9
    plain = _write(version)
    name_at = plain.index(b"orders0")
    topics_at = name_at - (2 if flexible else 6)  # the topic count, then the name's length
    partitions_at = name_at + 7  # the partition count, the index, the records size
    size_at = partitions_at + (5 if flexible else 8)
    batch_at = size_at + (2 if flexible else 4)
    two = b"\3" if flexible else struct.pack(">i", 2)  # a count of two (a varint of count + 1 when flexible)
    short = _batch()[:56]  # a batch shorter than a batch header, its length saying so
    short = short[:8] + struct.pack(">i", 44) + short[12:]
    past = len(_batch()) + (5 if flexible else 1)  # a records size 1 byte past the frame's end (+ 3 tags, + 1)
    cases = {
        "the common shape": (plain, _answer(), True),
        "a small batch (a one-byte records size when flexible)": (_write(version, [(0, _batch(20))]), _answer(),
                                                                 True),
        "a long transactional id (a two-byte length when flexible)": (
            _write(version, txn_id="t" * 200), _answer(txn_id="t" * 200), not flexible),
        "two batches in one partition": (_write(version, [(0, _batch() + _batch())]), _answer(), False),
        "a second batch not transactional": (
            _write(version, [(0, _batch() + _batch(transactional=False))]), None, False),
        "a second batch of another producer": (_write(version, [(0, _batch() + _batch(producer_id=8))]), None, False),
        "a second partition": (_write(version, [(0, _batch()), (1, _batch())]), _answer(indexes=(0, 1)), False),
        "a second topic": (_write(version, topics=2), _answer(topics=2), False),
        "a partition count of two, one partition": (_set(plain, partitions_at, two), None, False),
        "a topic count of two, one topic": (_set(plain, topics_at, two), None, False),
        "a non-transactional batch": (_write(version, [(0, _batch(transactional=False))]), None, False),
        "a batch without a producer id": (_write(version, [(0, _batch(producer_id=-1))]), None, False),
        "a batch of magic 1": (_set(plain, batch_at + 16, b"\1"), None, False),
        "a batch shorter than a batch header": (_write(version, [(0, short)]), None, False),
        "a batch length one byte short": (_set(plain, batch_at + 8, struct.pack(">i", len(_batch()) - 13)), None,
                                          False),
        "a batch length past the records": (_set(plain, batch_at + 8, struct.pack(">i", len(_batch()) - 11)), None,
                                            False),
        "a records size past the end": (_set(plain, size_at, bytes([past & 0x7F | 0x80, past >> 7]) if flexible
                                             else struct.pack(">i", past)), None, False),
        "an empty transactional id": (_write(version, txn_id=""), None, False),
        "a transactional id not UTF-8": (_write(version, txn_id="é").replace("é".encode(), b"\xc3\x28"), None, False),
        "truncated by a byte": (plain[:-1], None, False),
        "truncated in the batch header": (plain[:batch_at + 30], None, False),
        "a byte left over": (plain + b"\0", None, False),
    }
    if flexible:
        for k, whose in enumerate(("the partition's", "the topic's", "the request's")):
            at = len(plain) - 3 + k
            # One empty tagged field where the tags are empty; and only a count of one, the length unchanged.
            cases[f"a tagged field in {whose} tags"] = (plain[:at] + b"\1\0\0" + plain[at + 1:], None, False)
            cases[f"a tag count of one in {whose} tags"] = (_set(plain, at, b"\1"), None, False)
        # A two-byte id length (0x83 0x01: 130) whose first byte alone (0x83 - 1) would read a well-formed frame
        # with the id a byte earlier: the loop reads the id where it is, and the bytes after it do not fit.
        txn_at = len(plain) - len(_body(plain))
        cases["a two-byte id length whose first byte alone reads well"] = (
            plain[:txn_at] + b"\x83\x01" + b"t" * 129 + plain[txn_at + 4:], None, False)
    return cases


@pytest.mark.parametrize("version", range(3, 12))
def test_each_shape_around_the_common_one_gets_its_answer(version: int) -> None:
    for name, (frame, expected, _) in _cases(version).items():
        body = _body(frame)
        assert scan_transactional(body, version >= 9) == expected, name
        if expected is not None:
            assert _agrees(frame, version), name
        # Read where it lies in a longer read (the relay passes the whole read and the frame's bounds).
        read = b"\xff" * 7 + bytes(body) + b"\xee" * 5
        assert native.scan_transactional(read, 7, 7 + len(body), version >= 9) == expected, name


@st.composite
def near_common_shapes(draw: st.DrawFn) -> tuple[bytes, int]:
    """Frames of the common shape and its neighbours: one topic, one or two partitions, one or two batches,
    records around the one/two-byte size boundary, then a few bytes mutated or the end cut."""
    version = draw(st.integers(3, 11))
    parts = [(draw(st.integers(0, 2)), b"".join(
        _batch(draw(st.sampled_from([0, 20, 60, 70, 512])), draw(st.sampled_from([7, 7, 7, -1])),
               draw(st.sampled_from([True, True, True, False]))) for _ in range(draw(st.sampled_from([1, 1, 1, 2])))))
             for _ in range(draw(st.sampled_from([1, 1, 1, 2])))]
    frame = bytearray(_write(version, parts, draw(st.sampled_from(["app", "", "t" * 130]))))
    for _ in range(draw(st.integers(0, 3))):
        frame[draw(st.integers(8, len(frame) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        frame = frame[:draw(st.integers(20, len(frame)))]
    return bytes(frame), version


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_common_shapes())
def test_frames_near_the_common_shape_are_taken_only_as_the_general_path_reads_them(built: tuple[bytes, int]) -> None:
    frame, version = built
    _agrees(frame, version)

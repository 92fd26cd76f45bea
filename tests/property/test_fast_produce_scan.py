"""The relay's in-place reader of a transactional Produce (`scan_transactional`) never takes what the general
path would judge otherwise: whenever it answers, the general path's scan (`scan_produce`, then the plan) reads
the same transactional id, producer id and epoch, the same partitions in the same order, every one of them
with readable, transactional batches of that producer. Frames are built with kio and then mutated."""

from __future__ import annotations

import datetime
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnguard.codecs import schemas
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import peek_request, request_body_offset
from txnguard.codecs.produce_scan import scan_produce, scan_transactional
from txnguard.testing.raw import build_batch


def _module(version: int) -> Any:
    return sys.modules[schemas.request_schema(0, version).__module__]


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
    txn_id, pid, epoch, partitions, _acks = found
    body = memoryview(frame)[4:]
    general_id, general = scan_produce(body, peek_request(body))  # raises nothing: the fast reader saw it whole
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

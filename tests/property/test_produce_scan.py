"""The in-place Produce scanner reads exactly what a full kio decode reads, for every version it covers.

    generated ProduceRequest (kio encodes) ─▶ scan_produce ─┐
                                           └▶ kio decode ────┴─▶ same transactional id, acks,
                                                                 partitions (in order) and batch heads
    mutated frame ─▶ scan_produce: a CodecError, or (when kio also decodes it) the same answer
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from txnguard.codecs import schemas
from txnguard.codecs.errors import CodecError, DecodeFailed
from txnguard.codecs.produce import produce_partitions
from txnguard.codecs.produce_scan import scan_produce
from txnguard.testing.raw import build_batch

VERSIONS = range(3, 12)


def _module(version: int) -> Any:
    return sys.modules[load_request_schema(0, version).__module__]


def _batch(draw: Any) -> bytes:
    return build_batch(
        draw(st.lists(st.binary(max_size=40), min_size=1, max_size=3)),
        producer_id=draw(st.integers(-1, 2**40)), producer_epoch=draw(st.integers(-1, 300)),
        base_sequence=draw(st.integers(-1, 1000)), transactional=draw(st.booleans()),
    )


@st.composite
def produce_requests(draw: Any, version: int | None = None) -> tuple[int, bytes]:
    version = draw(st.sampled_from(VERSIONS)) if version is None else version
    m = _module(version)
    names = draw(st.lists(st.text(min_size=1, max_size=20), min_size=0, max_size=3, unique=True))

    def records() -> bytes | None:
        kind = draw(st.sampled_from(["null", "empty", "batches"]))
        if kind == "batches":
            return b"".join(_batch(draw) for _ in range(draw(st.integers(1, 2))))
        return None if kind == "null" else b""

    topics = tuple(
        m.TopicProduceData(name=name, partition_data=tuple(
            m.PartitionProduceData(index=i, records=records())
            for i in draw(st.lists(st.integers(0, 2**31 - 1), max_size=3))))
        for name in names
    )
    req = m.ProduceRequest(transactional_id=draw(st.one_of(st.none(), st.text(max_size=30))),
                           acks=draw(st.sampled_from([-1, 0, 1])),
                           timeout=datetime.timedelta(milliseconds=draw(st.integers(0, 60000))), topic_data=topics)
    return version, schemas.encode_request(req, draw(st.integers(0, 2**31 - 1)), draw(st.one_of(
        st.none(), st.text(max_size=10))))[4:]


def _kio_view(frame: bytes) -> tuple[Any, ...]:
    header, body = schemas.decode_request(frame)
    txn = None if body.transactional_id is None else str(body.transactional_id)
    return int(header.correlation_id), txn, int(body.acks), produce_partitions(body)


def _scan_view(frame: bytes) -> tuple[Any, ...]:
    s = scan_produce(frame)
    return s.head.correlation_id, s.transactional_id, s.acks, s.partitions


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(produce_requests())
def test_the_scanner_reads_what_kio_decodes(versioned):
    _, frame = versioned
    assert _scan_view(frame) == _kio_view(frame)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_with_a_transactional_batch(version):
    m = _module(version)
    batch = build_batch([b"a", b"b"], producer_id=7, producer_epoch=3, base_sequence=5, transactional=True)
    req = m.ProduceRequest(transactional_id="txn", acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
        m.TopicProduceData(name="orders", partition_data=(m.PartitionProduceData(index=2, records=batch + batch),)),))
    scan = scan_produce(schemas.encode_request(req, 42, "client")[4:])
    head = (scan.head.api_version, scan.head.correlation_id, scan.transactional_id, scan.acks)
    assert head == (version, 42, "txn", -1)
    (p,) = scan.partitions
    assert (p.topic, p.partition, len(p.heads)) == ("orders", 2, 2)
    heads = [(h.producer_id, h.producer_epoch, h.base_sequence, h.transactional) for h in p.heads]
    assert heads == [(7, 3, 5, True)] * 2


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(produce_requests(), st.data())
def test_a_mutated_request_is_refused_or_read_as_kio_reads_it(versioned, data):
    _, frame = versioned
    body = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(0, len(body)))]
    mutated = bytes(body)
    try:
        scanned = _scan_view(mutated)
    except CodecError:
        return
    with contextlib.suppress(CodecError):  # kio may refuse what the scanner reads (it rejects unknown tags)
        if mutated[:2] == b"\x00\x00":
            assert scanned == _kio_view(mutated)


def test_other_apis_and_versions_are_not_scanned():
    with pytest.raises(DecodeFailed):
        scan_produce(b"\x00\x03\x00\x09" + b"\x00" * 20)  # Metadata
    with pytest.raises(DecodeFailed):
        scan_produce(b"\x00\x00\x00\x02" + b"\x00" * 20)  # Produce v2: no transactions

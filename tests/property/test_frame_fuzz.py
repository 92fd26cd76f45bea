"""Random and mutated bytes never raise anything but the codec's own error type, and buffers stay bounded."""

import contextlib
import struct
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import FrameSplitter
from txnguard.codecs.header import peek_request, produce_acks_and_txn_id_null, request_body_offset
from txnguard.testing.raw import RawClient, build_batch

INSPECTED_RESPONSES = [(18, 3), (3, 9), (3, 12), (10, 3), (10, 4), (60, 0), (0, 9), (0, 10), (1, 16)]


class _Encoder(RawClient):
    def __init__(self) -> None:
        self.client_id = "fuzz"


def _valid_requests() -> list[bytes]:
    import datetime
    import sys

    from kio.index import load_request_schema

    frames = []
    for version in (3, 8, 9, 11):
        m = sys.modules[load_request_schema(0, version).__module__]
        frames.append(_Encoder().encode(m.ProduceRequest(
            transactional_id="t", acks=-1, timeout=datetime.timedelta(seconds=1),
            topic_data=(m.TopicProduceData(name="x", partition_data=(
                m.PartitionProduceData(index=0, records=build_batch([b"v"], transactional=True)),)),)), 1))
    return frames


VALID = _valid_requests()


def _inspect_request(body: bytes) -> None:
    head = peek_request(body)
    if head.api_key == ApiKey.PRODUCE:
        produce_acks_and_txn_id_null(body, head)
    request_body_offset(body, head)
    schemas.decode_request(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_request_bodies_raise_only_codec_errors(body):
    with contextlib.suppress(CodecError):
        _inspect_request(body)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(VALID), st.data())
def test_mutated_produce_requests_raise_only_codec_errors(frame, data):
    body = bytearray(frame[4:])
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(0, len(body)))]
    with contextlib.suppress(CodecError):
        _inspect_request(bytes(body))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(INSPECTED_RESPONSES), st.binary(max_size=1024))
def test_random_response_bodies_raise_only_codec_errors(key_version, body):
    with contextlib.suppress(CodecError):
        schemas.decode_response(body, *key_version)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=512), max_size=40), st.integers(16, 4096))
def test_splitter_memory_stays_within_twice_the_input(chunks, limit):
    splitter = FrameSplitter(max_frame=limit)
    total = sum(len(c) for c in chunks)
    tracemalloc.start()
    try:
        for chunk in chunks:
            try:
                splitter.feed(chunk)
            except CodecError:
                splitter = FrameSplitter(max_frame=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert splitter.buffered <= limit + 4
    assert peak <= 2 * total + 16 * 1024  # plus a fixed allowance for Python's own objects


def test_a_huge_declared_length_is_refused_without_allocating_it():
    tracemalloc.start()
    try:
        with contextlib.suppress(CodecError):
            FrameSplitter().feed(struct.pack(">i", 2**31 - 1) + b"x" * 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024

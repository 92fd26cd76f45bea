"""The log follower's readers (codecs/log_fetch.py, codecs/transaction_log.py) against kio: the native Fetch v12
answer reader and the native batch reader give what kio decodes from the same bytes, on generated answers and
batches, and take a broken one only where kio reads the same from it."""

from __future__ import annotations

import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.response import FetchResponse
from kio.static.primitive import Records

from txnguard.codecs import native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import DecodeFailed
from txnguard.codecs.log_fetch import Wanted, fetch_request, read_fetch_answer
from txnguard.testing.raw import build_batch

# No skip without the native module: it is part of the build, and these tests fail without it (as
# test_native_data_path.py does), like the other native readers' property tests.

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))
FETCH = ApiKey.FETCH.value
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _frame(body: FetchResponse) -> bytes:
    return bytes(memoryview(schemas.encode(schemas.response_header_for(FETCH, 12, 42), body))[4:])


def _kio(frame: bytes) -> tuple[int, int, list[tuple[str, int, int, int, int, bytes | None]]]:
    _, body = schemas.decode_response(frame, FETCH, 12)
    return int(body.error_code), int(body.session_id), [
        (str(t.topic), int(p.partition_index), int(p.error_code), int(p.high_watermark), int(p.log_start_offset),
         None if p.records is None else bytes(p.records)) for t in body.responses for p in t.partitions]


def _native(frame: bytes, start: int = 0, stop: int | None = None) -> object:
    found = native.read_fetch_answer(frame, start, len(frame) if stop is None else stop)
    if found is None:
        return None
    error, session_id, topics = found
    return error, session_id, [(name, p, code, hw, log_start, None if s < 0 else frame[s:e])
                   for name, parts in topics for p, code, hw, log_start, s, e in parts]


@SETTINGS
@given(body=st.from_type(FetchResponse))
def test_an_answer_reads_as_kio_decodes_it(body):
    frame = _frame(body)
    assert _native(frame) == _kio(frame)
    # The wrapper the follower calls gives the same, records as views into the answer.
    error, session_id, parts = read_fetch_answer(memoryview(frame))
    assert (error, session_id, [(p.topic, p.partition, p.error_code, p.high_watermark, p.log_start_offset,
                     None if p.records is None else bytes(p.records)) for p in parts]) == _kio(frame)


@SETTINGS
@given(body=st.from_type(FetchResponse), data=st.data())
def test_a_broken_answer_is_read_only_where_kio_reads_the_same(body, data):
    frame = bytearray(_frame(body))
    for _ in range(data.draw(st.integers(1, 3))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    mutated = bytes(frame[:cut])
    found = _native(mutated)
    # Where it lies in a longer read, the same bounds give the same answer.
    assert _native(b"\xff" * 3 + mutated + b"\x00" * 3, 3, 3 + len(mutated)) == found
    if found is None:
        return
    try:
        expected = _kio(mutated)
    except DecodeFailed:
        # A value kio refuses (an error code its enum lacks, a name not UTF-8, a negative time): the native reader
        # reads structure; the follower treats an unknown error code as an error, as any other.
        return
    assert found == expected


def test_an_answer_cut_short_or_with_bytes_after_it_is_left_to_kio():
    frame = _frame(FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                                 responses=()))
    assert _native(frame) == (0, 0, [])
    assert all(_native(frame[:cut]) is None for cut in range(len(frame)))
    assert _native(frame + b"\x00") is None


def test_the_hand_packed_request_is_kios_encoding():
    wanted = [Wanted(p, p % 3 - 1, 10 ** p, 1 << 20) for p in range(12)]
    frame = fetch_request(9, "txnguard-proxy", "__transaction_state", wanted, max_wait_ms=500, min_bytes=1,
                          max_bytes=4 << 20)
    header, body = schemas.decode_request(memoryview(frame)[4:])
    assert (int(header.request_api_key), int(header.request_api_version), int(header.correlation_id),
            header.client_id) == (FETCH, 12, 9, "txnguard-proxy")
    assert schemas.encode_request(body, 9, "txnguard-proxy") == frame
    [topic] = body.topics
    assert [(int(p.partition), int(p.current_leader_epoch), int(p.fetch_offset), int(p.partition_max_bytes))
            for p in topic.partitions] == [tuple(w) for w in wanted]


_keys = st.none() | st.binary(max_size=40)


@SETTINGS
@given(records=st.lists(st.tuples(_keys, _keys), min_size=1, max_size=8), base=st.integers(0, 2 ** 40))
def test_a_batch_reads_as_kio_reads_it(records, base):
    batch = bytearray(build_batch([v for _, v in records], keys=[k for k, _ in records]))
    batch[0:8] = base.to_bytes(8, "big")
    decoded, _ = read_batch(memoryview(bytes(batch)), 0)
    expected = [(int(r.offset), r.key, r.value) for r in decoded.records]
    assert native.read_batch_records(bytes(batch), 0, len(batch)) == expected
    assert native.read_batch_records(b"\x00" + bytes(batch) + b"\x00", 1, 1 + len(batch)) == expected


@SETTINGS
@given(records=st.lists(st.tuples(_keys, _keys), min_size=1, max_size=4), data=st.data())
def test_a_broken_batch_is_read_only_where_kio_reads_the_same(records, data):
    batch = bytearray(build_batch([v for _, v in records], keys=[k for k, _ in records]))
    for _ in range(data.draw(st.integers(1, 3))):
        batch[data.draw(st.integers(0, len(batch) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(batch)))
    mutated = bytes(batch[:cut])
    found = native.read_batch_records(mutated, 0, len(mutated))
    if found is None:
        return
    decoded, _ = read_batch(memoryview(mutated), 0)
    assert found == [(int(r.offset), r.key, r.value) for r in decoded.records]

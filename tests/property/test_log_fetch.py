"""The log follower's readers and writer (codecs/log_fetch.py, codecs/transaction_log.py) against kio: the native Fetch
v12 answer reader (its record sets decoded in the same call) and the native batch reader give what kio and the Python
record reader give from the same bytes, on generated answers and batches, and take a broken one only where kio reads
the same from it; the native Fetch request is kio's encoding, byte for byte, as the Python one is."""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.response import FetchResponse
from kio.static.primitive import Records

from txnguard.codecs import log_fetch, native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import DecodeFailed
from txnguard.codecs.log_fetch import Wanted, fetch_request, packed, read_log_answer
from txnguard.codecs.transaction_log import (
    STATE,
    TOMBSTONE,
    PartitionRead,
    TxnLogValue,
    latest,
    python_decoded,
)
from txnguard.testing.fetch_answers import fetch_answer
from txnguard.testing.raw import build_batch
from txnguard.testing.transaction_log_writer import key, value

# No skip without the native module: it is part of the build, and these tests fail without it (as
# test_native_data_path.py does), like the other native readers' property tests.

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))
FETCH = ApiKey.FETCH.value
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _frame(body: FetchResponse) -> bytes:
    return bytes(memoryview(schemas.encode(schemas.response_header_for(FETCH, 12, 42), body))[4:])


def _kio(frame: bytes, positions: dict[int, int] | None = None) -> tuple[int, int, list[tuple[int, int, int, int,
                                                                                            object]]]:
    """What kio decodes, each partition's records read by the Python record reader and reduced by the Python
    `latest` from its position on (None: null records)."""
    _, body = schemas.decode_response(frame, FETCH, 12)
    return int(body.error_code), int(body.session_id), [
        (int(p.partition_index), int(p.error_code), int(p.high_watermark), int(p.log_start_offset),
         None if p.records is None else _python_read(int(p.partition_index), p.records, positions or {}))
        for t in body.responses for p in t.partitions]


def _python_read(partition: int, records: bytes, positions: dict[int, int]) -> tuple[object, object]:
    found, failure = python_decoded(memoryview(records))
    return latest(found, positions.get(partition, 0)), None if failure is None else type(failure)


def _native(frame: bytes, start: int = 0, stop: int | None = None,
            positions: dict[int, int] | None = None) -> object:
    found = native.read_log_answer(frame, start, len(frame) if stop is None else stop, positions or {})
    if found is None:
        return None
    error, session_id, parts = found
    return error, session_id, [(p, code, hw, log_start, None if read is None else _native_read(read, failure))
                               for p, code, hw, log_start, read, failure in parts]


def _native_read(read: tuple[list[Any], tuple[int, int, int, int], int | None, list[str]],
                 failure: tuple[bool, int] | None) -> tuple[object, object]:
    """The native read as the wrapper hands it on (codecs/log_fetch.py), its failure by type (messages differ)."""
    partition_read, error = log_fetch._native_read(read, failure)
    return partition_read, None if error is None else type(error)


@SETTINGS
@given(body=st.from_type(FetchResponse))
def test_an_answer_reads_as_kio_decodes_it(body):
    frame = _frame(body)
    assert _native(frame) == _kio(frame)
    # The wrapper the follower calls gives the same.
    error, session_id, parts = read_log_answer(memoryview(frame), {})
    assert (error, session_id, [(p.partition, p.error_code, p.high_watermark, p.log_start_offset,
                                 None if p.read is None else (p.read, None if p.failure is None else type(p.failure)))
                                for p in parts]) == _kio(frame)


_STATES = st.builds(TxnLogValue, st.integers(0, 2 ** 40), st.integers(0, 9), st.integers(1, 900_000),
                    st.sampled_from(["Ongoing", "PrepareCommit", "CompleteCommit", "CompleteAbort"]),
                    st.frozensets(st.tuples(st.sampled_from(["orders", "ü"]), st.integers(0, 9)), max_size=3),
                    st.integers(0, 2 ** 42), st.integers(-1, 2 ** 42))


@SETTINGS
@given(entries=st.lists(st.tuples(st.sampled_from(["app", "ü-app", "other"]), st.none() | _STATES), min_size=1,
                        max_size=8),
       hw=st.integers(0, 2 ** 40), data=st.data())
def test_an_answer_with_transaction_log_records_reads_them_as_the_python_reader_does(entries, hw, data):
    batch = bytes(build_batch([None if v is None else value(v) for _, v in entries],
                              keys=[key(txn_id) for txn_id, _ in entries]))
    frame = fetch_answer(7, [_Part(3, 0, hw, 0, batch), _Part(4, 0, hw, 0, None), _Part(5, 0, hw, 0, b"")])
    # From the view's position in the partition on: the records before it were read already.
    position = data.draw(st.integers(0, len(entries) + 1))
    positions = {3: position, 5: 9}
    assert _native(frame, positions=positions) == _kio(frame, positions)
    [third, fourth, fifth] = read_log_answer(memoryview(frame), positions).partitions
    fresh = list(enumerate(entries))[position:]
    last = {txn_id: offset for offset, (txn_id, _) in fresh}
    assert third.read is not None
    assert [(r[0], r[1], r[2], r[3]) for r in third.read.kept] == [
        (offset, TOMBSTONE, txn_id, None) if v is None else (offset, STATE, txn_id, v)
        for offset, (txn_id, v) in fresh if last[txn_id] == offset]
    assert third.read.counts == (sum(v is not None for _, (_, v) in fresh), sum(v is None for _, (_, v) in fresh),
                                 0, 0)
    assert third.read.next_offset == (len(entries) if fresh else None)
    assert third.read.ended == list(dict.fromkeys(
        txn_id for _, (txn_id, v) in fresh if v is None or v.state in ("CompleteCommit", "CompleteAbort")))
    assert third.failure is None and fourth.read is None
    assert fifth.read == PartitionRead([], (0, 0, 0, 0), None, [])


class _Part(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes | None


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


@pytest.mark.parametrize("pack", [fetch_request, packed], ids=["native", "python"])
@pytest.mark.parametrize("session", [(0, -1), (41, 7)])
def test_the_hand_packed_request_is_kios_encoding(pack, session):
    wanted = [Wanted(p, p % 3 - 1, 10 ** p, 1 << 20) for p in range(12)]
    frame = pack(9, "txnguard-proxy", "__transaction_state", wanted, max_wait_ms=500, min_bytes=1,
                 max_bytes=4 << 20, session_id=session[0], session_epoch=session[1])
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

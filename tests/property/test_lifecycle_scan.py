"""The in-place readers of the transaction life cycle and TxnOffsetCommit (`lifecycle_scan`, the native ones of
native/src/lifecycle.rs) read what kio reads: for requests and answers built with kio, every version the readers
take, the same `TxnRequest` / `TxnResponse`; and for mutated bytes, whenever a reader answers, kio (after its
bounds check) decodes the frame and gives the same."""

from __future__ import annotations

import datetime
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import peek_request
from txnguard.codecs.lifecycle_scan import (
    AddPartitionsSeen,
    EndTxnSeen,
    InitProducerIdSeen,
    TxnOffsetCommit,
    from_kio_request,
    from_kio_response,
    read_txn_offset_commit,
    read_txn_request,
    read_txn_response,
)

VERSIONS = {ApiKey.INIT_PRODUCER_ID: range(0, 6), ApiKey.ADD_PARTITIONS_TO_TXN: range(0, 4),
            ApiKey.ADD_OFFSETS_TO_TXN: range(0, 5), ApiKey.END_TXN: range(0, 5)}
NAMES = st.sampled_from(["app", "", "é" * 3, "t" * 130])
CODES = st.sampled_from([ErrorCode.none, ErrorCode.concurrent_transactions, ErrorCode.invalid_txn_state])


def _module(schema: Any) -> Any:
    return sys.modules[schema.__module__]


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key = draw(st.sampled_from(sorted(VERSIONS)))
    version = draw(st.sampled_from(VERSIONS[key]))
    cls = schemas.request_schema(key, version)
    m = _module(cls)
    pid, epoch = i64(draw(st.integers(-1, 2**40))), i16(draw(st.integers(-1, 3)))
    if key == ApiKey.INIT_PRODUCER_ID:
        kw: dict[str, Any] = {"transactional_id": draw(st.one_of(st.none(), NAMES)),
                              "transaction_timeout": datetime.timedelta(milliseconds=draw(st.integers(0, 900_000)))}
        if version >= 3:
            kw |= {"producer_id": pid, "producer_epoch": epoch}
        body = cls(**kw)
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        topics = tuple(m.AddPartitionsToTxnTopic(name=draw(NAMES) + str(t), partitions=tuple(
            i32(p) for p in draw(st.lists(st.integers(0, 200), max_size=3))))
            for t in range(draw(st.integers(0, 3))))
        body = cls(v3_and_below_transactional_id=draw(NAMES), v3_and_below_producer_id=pid,
                   v3_and_below_producer_epoch=epoch, v3_and_below_topics=topics)
    elif key == ApiKey.ADD_OFFSETS_TO_TXN:
        body = cls(transactional_id=draw(NAMES), producer_id=pid, producer_epoch=epoch, group_id=draw(NAMES))
    else:
        body = cls(transactional_id=draw(NAMES), producer_id=pid, producer_epoch=epoch, committed=draw(st.booleans()))
    return key, version, schemas.encode_request(body, 5, draw(st.sampled_from(["c", "client-é"])))


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key = draw(st.sampled_from([ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN]))
    version = draw(st.sampled_from(VERSIONS[key]))
    cls = schemas.response_schema(key, version)
    m = _module(cls)
    throttle = datetime.timedelta(milliseconds=draw(st.integers(0, 1000)))
    if key == ApiKey.INIT_PRODUCER_ID:
        body = cls(throttle_time=throttle, error_code=draw(CODES), producer_id=i64(draw(st.integers(-1, 2**40))),
                   producer_epoch=i16(draw(st.integers(-1, 3))))
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        results = tuple(m.AddPartitionsToTxnTopicResult(name=draw(NAMES) + str(t), results_by_partition=tuple(
            m.AddPartitionsToTxnPartitionResult(partition_index=i32(p), partition_error_code=draw(CODES))
            for p in draw(st.lists(st.integers(0, 200), max_size=3))))
            for t in range(draw(st.integers(0, 3))))
        body = cls(throttle_time=throttle, results_by_topic_v3_and_below=results)
    else:
        body = cls(throttle_time=throttle, error_code=draw(CODES))
    return key, version, schemas.encode(schemas.response_header_for(key, version, 5), body)


def _kio_request(frame: bytes) -> Any:
    _, req = schemas.decode_request(frame[4:])
    return req


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_a_request_reads_as_kio_reads_it(built: tuple[int, int, bytes]) -> None:
    key, _, frame = built
    body = memoryview(frame)[4:]
    found = read_txn_request(body, peek_request(body))
    assert found is not None  # kio wrote it plainly: no tags, nothing left over
    assert found == from_kio_request(key, _kio_request(frame))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_an_answer_reads_as_kio_reads_it(built: tuple[int, int, bytes]) -> None:
    key, version, frame = built
    found = read_txn_response(memoryview(frame)[4:], key, version)
    assert found is not None
    assert found == from_kio_response(key, schemas.decode_response(frame[4:], key, version)[1])


def _mutated(frame: bytes, data: st.DataObject) -> bytes:
    out = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(8, len(out) - 1))  # past the length, the key and the version
        out[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        out = out[:data.draw(st.integers(8, len(out)))]
    return bytes(out)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def test_a_mutated_request_is_read_only_as_kio_reads_it(built: tuple[int, int, bytes], data: st.DataObject) -> None:
    key, _, frame = built
    mutated = _mutated(frame, data)
    body = memoryview(mutated)[4:]
    try:
        found = read_txn_request(body, peek_request(body))
    except CodecError:
        return
    if found is not None:
        assert found == from_kio_request(key, _kio_request(mutated))  # kio raises nothing on it either


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.data())
def test_a_mutated_answer_is_read_only_as_kio_reads_it(built: tuple[int, int, bytes], data: st.DataObject) -> None:
    key, version, frame = built
    mutated = _mutated(frame, data)
    found = read_txn_response(memoryview(mutated)[4:], key, version)
    if found is not None:
        assert found == from_kio_response(key, schemas.decode_response(mutated[4:], key, version)[1])


@st.composite
def txn_offset_commits(draw: st.DrawFn) -> bytes:
    version = draw(st.integers(0, 4))
    cls = schemas.request_schema(ApiKey.TXN_OFFSET_COMMIT, version)
    m = _module(cls)

    def partition(p: int) -> Any:
        kw: dict[str, Any] = {"partition_index": i32(p), "committed_offset": i64(draw(st.integers(-1, 2**40))),
                              "committed_metadata": draw(st.one_of(st.none(), NAMES))}
        if version >= 2:
            kw["committed_leader_epoch"] = i32(draw(st.integers(-1, 5)))
        return m.TxnOffsetCommitRequestPartition(**kw)

    topics = tuple(m.TxnOffsetCommitRequestTopic(name=draw(NAMES) + str(t), partitions=tuple(
        partition(p) for p in draw(st.lists(st.integers(0, 50), max_size=3)))) for t in range(draw(st.integers(0, 2))))
    kw: dict[str, Any] = {"transactional_id": draw(NAMES), "group_id": draw(NAMES),
                          "producer_id": i64(draw(st.integers(-1, 2**40))),
                          "producer_epoch": i16(draw(st.integers(-1, 3))), "topics": topics}
    if version >= 3:
        kw |= {"generation_id": i32(draw(st.integers(-1, 9))), "member_id": draw(NAMES),
               "group_instance_id": draw(st.one_of(st.none(), NAMES))}
    return schemas.encode_request(cls(**kw), 5, "c")


def _offset_commit(frame: bytes) -> tuple[Any, Any]:
    """(in place, kio) of a TxnOffsetCommit frame: kio's as the same fields, or the error it raises."""
    body = memoryview(frame)[4:]
    try:
        found = read_txn_offset_commit(body, peek_request(body))
    except CodecError:
        found = None
    try:
        req = _kio_request(frame)
        kio: Any = TxnOffsetCommit(str(req.transactional_id), str(req.group_id), int(req.producer_id),
                                   int(req.producer_epoch))
    except CodecError as e:
        kio = e
    return found, kio


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txn_offset_commits())
def test_a_txn_offset_commit_reads_as_kio_reads_it(frame: bytes) -> None:
    found, kio = _offset_commit(frame)
    assert found is not None and found == kio


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txn_offset_commits(), st.data())
def test_a_mutated_txn_offset_commit_is_read_only_as_kio_reads_it(frame: bytes, data: st.DataObject) -> None:
    found, kio = _offset_commit(_mutated(frame, data))
    if found is not None:
        assert found == kio  # kio raises nothing on it either


# -- shapes around the plain one, each with the answer it must get ---------------------------------------------
# (The third element of each case says whether the Python reader before the native one took it in a few unpacks
# rather than field by field: kept, each shape's reason to be here.)

AROUND = b"\xa5" * 9  # bytes before and after the frame in the read it lies in: never read


FIRST_FLEXIBLE = {ApiKey.INIT_PRODUCER_ID: 2, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 3,
                  ApiKey.END_TXN: 3}


def _request_frame(key: int, version: int, txn_id: str | None = "app", topics: int = 1, partitions: int = 1,
                   committed: bool = True) -> bytes:
    """The request without its length prefix."""
    cls = schemas.request_schema(key, version)
    m = _module(cls)
    if key == ApiKey.INIT_PRODUCER_ID:
        ids = {"producer_id": i64(7), "producer_epoch": i16(1)} if version >= 3 else {}
        body = cls(transactional_id=txn_id, transaction_timeout=datetime.timedelta(seconds=60), **ids)
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        body = cls(v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=i64(7),
                   v3_and_below_producer_epoch=i16(1), v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(
                       name=f"orders{t}", partitions=tuple(i32(p) for p in range(partitions))) for t in range(topics)))
    elif key == ApiKey.ADD_OFFSETS_TO_TXN:
        body = cls(transactional_id=txn_id, producer_id=i64(7), producer_epoch=i16(1), group_id="copier")
    else:
        body = cls(transactional_id=txn_id, producer_id=i64(7), producer_epoch=i16(1), committed=committed)
    return schemas.encode_request(body, 5, "client")[4:]


def _request_cases(key: int, version: int) -> dict[str, tuple[bytes, Any, bool]]:
    """Per shape: (request, what read_txn_request answers, whether the plain reader takes it)."""
    flexible = version >= FIRST_FLEXIBLE[key]
    plain = _request_frame(key, version)
    kio = from_kio_request(key, schemas.decode_request(plain)[1])
    body_at = 10 + len("client")  # after the client id
    cases: dict[str, tuple[bytes, Any, bool]] = {
        "plain": (plain, kio, True),
        "a null client id": (plain[:8] + b"\xff\xff" + plain[body_at:], kio, False),
        "a client id not UTF-8": (plain[:10] + b"\xff" + plain[11:], None, False),
        "a negative version": (plain[:2] + b"\xff\xff" + plain[4:], None, False),
        "a byte left over": (plain + b"\0", None, False),
        "truncated by a byte": (plain[:-1], None, False),
        "a long transactional id (a two-byte length when flexible)": (
            _request_frame(key, version, "t" * 200), from_kio_request(key, schemas.decode_request(
                _request_frame(key, version, "t" * 200))[1]), not flexible),
    }
    if flexible:
        cases |= {
            "a tagged field in the header": (plain[:body_at] + b"\1\0\0" + plain[body_at + 1:], kio, False),
            "a tag count of one in the header": (plain[:body_at] + b"\1" + plain[body_at + 1:], None, False),
            "a tagged field in the body": (plain[:-1] + b"\1\0\0", None, False),
            "a tag count of one in the body": (plain[:-1] + b"\1", None, False),
            "empty body tags in two bytes (0x80 0x00)": (plain[:-1] + b"\x80\0", kio, False),
        }
    if key == ApiKey.END_TXN:
        committed_at = len(plain) - (2 if flexible else 1)
        cases["committed 2"] = (plain[:committed_at] + b"\2" + plain[committed_at + 1:], None, False)
        cases["aborted"] = (_request_frame(key, version, committed=False), EndTxnSeen("app", 7, 1, False), True)
    if key == ApiKey.INIT_PRODUCER_ID:
        cases["a null transactional id"] = (_request_frame(key, version, None), InitProducerIdSeen(
            None, 7 if version >= 3 else -1, 1 if version >= 3 else -1, 60_000), True)
    if key == ApiKey.ADD_PARTITIONS_TO_TXN:
        cases["no topics"] = (_request_frame(key, version, topics=0), AddPartitionsSeen("app", 7, 1, ()), True)
        if flexible:
            cases["a tag count of one in a topic's tags"] = (plain[:-2] + b"\1" + plain[-1:], None, False)
        cases["two topics of three partitions"] = (
            _request_frame(key, version, topics=2, partitions=3),
            AddPartitionsSeen("app", 7, 1, tuple((f"orders{t}", p) for t in range(2) for p in range(3))), True)
    return cases


@pytest.mark.parametrize(("key", "version"), [(k, v) for k, vs in VERSIONS.items() for v in vs])
def test_each_request_shape_gets_its_answer_also_where_it_lies_in_a_longer_read(key: int, version: int) -> None:
    for name, (frame, expected, _) in _request_cases(key, version).items():
        body = memoryview(frame)
        assert read_txn_request(body, peek_request(body)) == expected, name
        read = AROUND + frame + AROUND
        assert read_txn_request(read, peek_request(body), len(AROUND), len(AROUND) + len(frame)) == expected, name


def _response_frame(key: int, version: int, error: ErrorCode = ErrorCode.none, topics: int = 1,
                    partitions: int = 1) -> bytes:
    """The answer without its length prefix."""
    cls = schemas.response_schema(key, version)
    m = _module(cls)
    throttle = datetime.timedelta(milliseconds=3)
    if key == ApiKey.INIT_PRODUCER_ID:
        body = cls(throttle_time=throttle, error_code=error, producer_id=i64(7), producer_epoch=i16(1))
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        body = cls(throttle_time=throttle, results_by_topic_v3_and_below=tuple(m.AddPartitionsToTxnTopicResult(
            name=f"orders{t}", results_by_partition=tuple(m.AddPartitionsToTxnPartitionResult(
                partition_index=i32(p), partition_error_code=error) for p in range(partitions)))
            for t in range(topics)))
    else:
        body = cls(throttle_time=throttle, error_code=error)
    return schemas.encode(schemas.response_header_for(key, version, 5), body)[4:]


def _response_cases(key: int, version: int) -> dict[str, tuple[bytes, Any, bool]]:
    """Per shape: (answer, what read_txn_response answers, whether the plain reader takes it)."""
    flexible = version >= FIRST_FLEXIBLE[key]

    def kio(frame: bytes) -> Any:
        return from_kio_response(key, schemas.decode_response(frame, key, version)[1])

    plain = _response_frame(key, version)
    concurrent = _response_frame(key, version, ErrorCode.concurrent_transactions)
    # The error code: after the correlation id, (flexible) the header's tags and the throttle time; of
    # AddPartitionsToTxn, the last partition's (before its tags, the topic's and the request's when flexible).
    code_at = (9 if flexible else 8) if key != ApiKey.ADD_PARTITIONS_TO_TXN else len(plain) - (5 if flexible else 2)
    cases: dict[str, tuple[bytes, Any, bool]] = {
        "plain": (plain, kio(plain), True),
        "concurrent transactions": (concurrent, kio(concurrent), True),
        "an unknown error code": (plain[:code_at] + b"\x27\x0f" + plain[code_at + 2:], None, False),
        "a byte left over": (plain + b"\0", None, False),
        "truncated by a byte": (plain[:-1], None, False),
    }
    if flexible:
        cases |= {
            "a tag count of one in the header": (plain[:4] + b"\1" + plain[5:], None, False),
            "a tag count of one in the body": (plain[:-1] + b"\1", None, False),
            "empty body tags in two bytes (0x80 0x00)": (plain[:-1] + b"\x80\0", kio(plain), False),
        }
    if key == ApiKey.ADD_PARTITIONS_TO_TXN:
        many = _response_frame(key, version, topics=2, partitions=3)
        cases["no topics"] = (_response_frame(key, version, topics=0), kio(_response_frame(key, version, topics=0)),
                              True)
        cases["two topics of three partitions"] = (many, kio(many), True)
        if flexible:
            cases["a tag count of one in a partition's tags"] = (plain[:-3] + b"\1" + plain[-2:], None, False)
            cases["a tag count of one in a topic's tags"] = (plain[:-2] + b"\1" + plain[-1:], None, False)
    return cases


@pytest.mark.parametrize(("key", "version"), [(k, v) for k, vs in VERSIONS.items() for v in vs])
def test_each_answer_shape_gets_its_answer_also_where_it_lies_in_a_longer_read(key: int, version: int) -> None:
    for name, (frame, expected, _) in _response_cases(key, version).items():
        body = memoryview(frame)
        assert read_txn_response(body, key, version) == expected, name
        read = AROUND + frame + AROUND
        assert read_txn_response(read, key, version, len(AROUND), len(AROUND) + len(frame)) == expected, name

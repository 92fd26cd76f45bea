"""The in-place reader of Produce and Fetch answers (codecs/node_endpoints.py) says "no broker named" exactly
when kio finds no NodeEndpoints, and never for an answer it has not read to its last byte."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from txnguard.codecs import bounds, node_endpoints, schemas
from txnguard.codecs.errors import DecodeFailed

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

CASES = [(key, v) for key, versions in node_endpoints.READ.items() for v in versions
         if v <= (schemas.kio_version_range(key) or (0, -1))[1]]
IDS = [f"{'produce' if key == node_endpoints.PRODUCE else 'fetch'}-v{v}" for key, v in CASES]
SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _frame(key: int, version: int, body: object) -> bytes:
    return bytes(memoryview(schemas.encode(schemas.response_header_for(key, version, 42), body))[4:])


def _answer(key: int, version: int, data: st.DataObject) -> object:
    return data.draw(st.from_type(schemas.response_schema(key, version)))


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@SETTINGS
@given(data=st.data())
def test_no_broker_named_exactly_when_kio_finds_none(key, version, data):
    body = _answer(key, version, data)
    if data.draw(st.booleans()):
        body = dataclasses.replace(body, node_endpoints=())  # the common case, drawn as often as the other
    frame = _frame(key, version, body)
    assert node_endpoints.endpoints_absent(memoryview(frame), key, version) == (body.node_endpoints == ())


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@SETTINGS
@given(data=st.data())
def test_an_answer_cut_short_or_with_bytes_after_it_is_left_to_kio(key, version, data):
    frame = _frame(key, version, dataclasses.replace(_answer(key, version, data), node_endpoints=()))
    assert node_endpoints.endpoints_absent(memoryview(frame), key, version)
    cut = data.draw(st.integers(0, len(frame) - 1))
    assert not node_endpoints.endpoints_absent(memoryview(frame[:cut]), key, version)
    assert not node_endpoints.endpoints_absent(memoryview(frame + b"\x00"), key, version)
    # One tagged field announced and none there: a broken answer, never taken for one without addresses.
    assert not node_endpoints.endpoints_absent(memoryview(frame[:-1] + b"\x01"), key, version)


def test_only_the_versions_with_node_endpoints_and_this_layout_are_read():
    assert {node_endpoints.PRODUCE: range(10, 13), node_endpoints.FETCH: range(16, 19)} == node_endpoints.READ
    for key, versions in node_endpoints.READ.items():
        assert not node_endpoints.endpoints_absent(memoryview(b"\x00" * 64), key, versions.start - 1)
        assert not node_endpoints.endpoints_absent(memoryview(b"\x00" * 64), key, versions.stop)
    assert len(CASES) >= 5  # kio names Produce v10-v11 and Fetch v16-v18 at least


def _after_header(frame: bytes) -> int:
    count, pos = bounds.read_uvarint(frame, 4, len(frame))  # after the correlation id: the header's tags
    for _ in range(count):
        _, pos = bounds.read_uvarint(frame, pos, len(frame))
        size, pos = bounds.read_uvarint(frame, pos, len(frame))
        pos += size
    return pos


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_mutated_answer_is_taken_only_when_kio_reads_it_and_finds_no_broker(key, version, data):
    """The native walker against kio on broken bytes: whenever it says "no broker named", kio decodes the whole
    answer and finds none; and the answer is read the same where it lies in a longer read."""
    frame = bytearray(_frame(key, version, _answer(key, version, data)))
    for _ in range(data.draw(st.integers(1, 3))):
        frame[data.draw(st.integers(4, len(frame) - 1))] = data.draw(st.integers(0, 255))
    mutated = bytes(frame)
    absent = node_endpoints.endpoints_absent(memoryview(mutated), key, version)
    read = b"\x00" * 5 + mutated + b"\x00" * 5  # zeros after it would read as empty tags: must not be
    assert node_endpoints.endpoints_absent(read, key, version, 5, 5 + len(mutated)) == absent
    if absent:
        # Its structure is whole: the bounds walk the proxy does before kio (after the correlation id and the
        # response header's tags) takes it to its last byte.
        schemas.check_response_body(memoryview(mutated)[_after_header(mutated):], key, version)
        try:
            _, body = schemas.decode_response(mutated, key, version)
        except DecodeFailed:
            # A value kio does not take (an error code its enum lacks, a name not UTF-8, a negative time): the
            # walker reads structure, not values; such an answer passes as the broker sent it, as through a
            # proxy that reads nothing.
            return
        assert body.node_endpoints == ()

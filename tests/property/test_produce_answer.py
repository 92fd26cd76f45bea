"""The in-place reader of Produce answers (codecs/produce_answer.py) says "no broker named" exactly when kio
finds no NodeEndpoints, and never for an answer it has not read to its last byte."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from txnguard.codecs import produce_answer, schemas
from txnguard.codecs.api_keys import ApiKey

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

PRODUCE = ApiKey.PRODUCE.value
VERSIONS = [v for v in range(produce_answer.FIRST_VERSION, produce_answer.LAST_VERSION + 1)
            if schemas.kio_version_range(PRODUCE) and v <= schemas.kio_version_range(PRODUCE)[1]]


def _frame(version: int, body: object) -> memoryview:
    return memoryview(schemas.encode(schemas.response_header_for(PRODUCE, version, 42), body))[4:]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_no_broker_named_exactly_when_kio_finds_none(version, data):
    body = data.draw(st.from_type(schemas.response_schema(PRODUCE, version)))
    if data.draw(st.booleans()):
        body = dataclasses.replace(body, node_endpoints=())  # the common case, drawn as often as the other
    frame = _frame(version, body)
    assert produce_answer.endpoints_absent(frame, version) == (body.node_endpoints == ())


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_an_answer_cut_short_or_with_bytes_after_it_is_left_to_kio(version, data):
    body = dataclasses.replace(data.draw(st.from_type(schemas.response_schema(PRODUCE, version))), node_endpoints=())
    frame = bytes(_frame(version, body))
    cut = data.draw(st.integers(0, len(frame) - 1))
    assert not produce_answer.endpoints_absent(memoryview(frame[:cut]), version)
    assert not produce_answer.endpoints_absent(memoryview(frame + b"\x00"), version)
    # One tagged field announced and none there: a broken answer, never taken for one without addresses.
    assert not produce_answer.endpoints_absent(memoryview(frame[:-1] + b"\x01"), version)


def test_versions_without_node_endpoints_or_by_topic_id_are_not_read():
    assert produce_answer.FIRST_VERSION == 10  # KIP-951
    assert not produce_answer.endpoints_absent(memoryview(b"\x00" * 16), 9)
    assert not produce_answer.endpoints_absent(memoryview(b"\x00" * 16), 13)

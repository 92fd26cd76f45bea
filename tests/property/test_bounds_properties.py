"""The bounds check never refuses a well-formed frame, for every API and version the proxy decodes.

kio's own hypothesis strategies build arbitrary valid messages; kio encodes them;
the check must pass them, and decoding must give the message back.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.static.primitive import Records

from txnguard.codecs import bounds, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import peek_request
from txnguard.codecs.produce import produce_partitions
from txnguard.codecs.produce_scan import scan_produce
from txnguard.codecs.schemas import encode_request

# Requests and responses the proxy reads: its inspected requests, the responses it rewrites
# or watches, SASL, and its own verification requests' answers.
DECODED_KEYS = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.SASL_HANDSHAKE,
                ApiKey.API_VERSIONS, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN,
                ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.SASL_AUTHENTICATE, ApiKey.DESCRIBE_CLUSTER,
                ApiKey.DESCRIBE_PRODUCERS, ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)

st.register_type_strategy(Records, st.binary(max_size=128))


def _schemas() -> list[tuple[str, type]]:
    out = []
    for key in DECODED_KEYS:
        name = api_key_map.get(key)
        if name is None:
            continue
        for version in sorted(schema_name_map[name]):
            for kind, load in (("request", load_request_schema), ("response", load_response_schema)):
                try:
                    out.append((f"{name}-v{version}-{kind}", load(key, version)))
                except KioIndexError:
                    continue
    return out


SCHEMAS = _schemas()


@pytest.mark.parametrize("cls", [c for _, c in SCHEMAS], ids=[n for n, _ in SCHEMAS])
def test_every_well_formed_body_passes_the_bounds_check(cls):
    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(cls))
    def check(message):
        buf = io.BytesIO()
        entity_writer(cls)(buf, message)
        bounds.check_body(cls, buf.getvalue(), bounds.RESPONSE_MAX_ELEMENTS)

    check()


PRODUCE_V3_TO_V11 = [load_request_schema(0, v) for v in range(3, 12)]


@pytest.mark.parametrize("cls", PRODUCE_V3_TO_V11, ids=[f"v{c.__version__}" for c in PRODUCE_V3_TO_V11])
def test_the_in_place_produce_scan_reads_what_kio_decodes(cls):
    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(cls), st.text(max_size=8))
    def check(message, client_id):
        frame = memoryview(encode_request(message, 7, client_id))[4:]
        _, decoded = schemas.decode_request(frame)
        txn_id, partitions = scan_produce(frame, peek_request(frame))
        assert txn_id == decoded.transactional_id
        assert partitions == produce_partitions(decoded)

    check()


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(PRODUCE_V3_TO_V11), st.data())
def test_the_produce_scan_of_a_mutated_frame_raises_only_codec_errors(cls, data):
    message = data.draw(st.from_type(cls))
    frame = bytearray(encode_request(message, 7, "c")[4:])
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    body = memoryview(bytes(frame[: data.draw(st.integers(8, len(frame)))]))
    with contextlib.suppress(CodecError):
        scan_produce(body, peek_request(body))

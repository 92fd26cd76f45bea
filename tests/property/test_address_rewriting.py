"""For every version kio has of every address-bearing response, no broker address survives a rewrite,
and the rewritten response still encodes and decodes to the same structure apart from addresses."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import Records

from txnguard.codecs import addresses, schemas
from txnguard.codecs.addresses import ADDRESS_BEARING, broker_addresses, carries_addresses, rewrite_addresses

PROXY_HOST = "proxy.example"

# Record sets stay opaque bytes to the proxy; any bytes will do here.
st.register_type_strategy(Records, st.binary(max_size=64).map(Records))


def _proxy_address(node_id: int, host: str, port: int) -> tuple[str, int]:
    return PROXY_HOST, 20000 + (node_id % 1000 if node_id >= 0 else 0)


def _cases():
    for key, first in ADDRESS_BEARING.items():
        for version in sorted(schema_name_map[api_key_map[key]]):
            if version >= first:
                yield key, version


CASES = list(_cases())


def _addresses_in(key, body):
    return [(h, p) for _, h, p in broker_addresses(key, body)]


@pytest.mark.parametrize(("key", "version"), CASES, ids=[f"{api_key_map[k]}-v{v}" for k, v in CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_broker_address_is_rewritten(key, version, data):
    cls = schemas.response_schema(key, version)
    body = data.draw(st.from_type(cls))
    assert carries_addresses(key, version)
    new = rewrite_addresses(key, body, _proxy_address)
    for node_id, host, port in broker_addresses(key, new):
        assert (host, port) == _proxy_address(node_id, "", 0)
    if key == addresses.DESCRIBE_CLUSTER and getattr(body, "endpoint_type", 1) == 2:
        assert new is body  # controller endpoints are not brokers a client connects to through us
    # Only addresses changed: the rest of the response is intact after an encode/decode round trip.
    header = schemas.response_header_for(key, version, 42)
    frame = schemas.encode(header, new)
    _, again = schemas.decode_response(frame[4:], key, version)
    assert again == new
    if new is not body:
        assert dataclasses.fields(again) == dataclasses.fields(body)

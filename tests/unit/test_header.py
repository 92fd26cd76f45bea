"""Header peeks agree with kio's full decode for every request shape the proxy relies on."""

import io

import pytest
from kio.serial import entity_writer

from txnguard.codecs.errors import TruncatedFrame
from txnguard.codecs.header import (
    peek_client_id,
    peek_request,
    produce_acks_and_txn_id_null,
    request_body_offset,
)
from txnguard.testing.raw import RawClient, build_batch


class _Encoder(RawClient):
    """The raw client's encoder without a socket."""

    def __init__(self, client_id: str = "my-client") -> None:
        self.client_id = client_id


def _produce_frame(version: int, transactional_id: str | None, acks: int) -> bytes:
    import sys

    from kio.index import load_request_schema

    m = sys.modules[load_request_schema(0, version).__module__]
    import datetime
    import uuid

    topic = {"topic_id": uuid.uuid4()} if version >= 13 else {"name": "t"}  # KIP-516 topic ids from v13
    payload = m.ProduceRequest(
        transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(seconds=30),
        topic_data=(m.TopicProduceData(**topic, partition_data=(
            m.PartitionProduceData(index=0, records=build_batch([b"v"])),)),),
    )
    return _Encoder().encode(payload, 7)[4:]


@pytest.mark.parametrize("version", range(3, 14))
@pytest.mark.parametrize(("txn_id", "acks"), [(None, 0), (None, -1), ("txn-1", -1), ("", 1)])
def test_produce_acks_and_transactional_id_are_read_in_place(version, txn_id, acks):
    body = _produce_frame(version, txn_id, acks)
    head = peek_request(body)
    assert (head.api_key, head.api_version, head.correlation_id) == (0, version, 7)
    assert produce_acks_and_txn_id_null(body, head) == (acks, txn_id is None)
    assert peek_client_id(body) == "my-client"


@pytest.mark.parametrize("version", [0, 3, 4])
def test_body_offset_skips_client_id_and_tagged_fields(version):
    from kio.index import load_request_schema

    cls = load_request_schema(18, version)
    kw = {"client_software_name": "x", "client_software_version": "1"} if version >= 3 else {}
    payload = cls(**kw)
    body = _Encoder("cid").encode(payload, 1)[4:]
    buf = io.BytesIO()
    entity_writer(cls)(buf, payload)
    assert bytes(body[request_body_offset(body, peek_request(body)):]) == buf.getvalue()


def test_a_frame_shorter_than_a_header_is_truncated():
    with pytest.raises(TruncatedFrame):
        peek_request(b"\x00\x03\x00")

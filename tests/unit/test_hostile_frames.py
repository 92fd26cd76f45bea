"""Hostile frames (issue 7) cost one connection at most: each is refused with a codec error, in this process.

Before the bounds check, the first three frames below made kio's native decoder ask
for tens of GiB and abort the whole interpreter. They are decoded in a child process
so that, should the check ever regress, this test fails instead of killing pytest.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.bounds import MAX_TAGGED_FIELDS, REQUEST_MAX_ELEMENTS
from txnguard.codecs.errors import BoundsExceeded, TooManyTaggedFields
from txnguard.codecs.framing import FrameSplitter, frame
from txnguard.codecs.header import peek_request, request_body_offset
from txnguard.codecs.produce import produce_partitions
from txnguard.testing.raw import build_batch


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return bytes(out + bytes([b]))
        out.append(b | 0x80)


def legacy_header(key: int, version: int) -> bytes:
    return struct.pack(">hhih", key, version, 7, 3) + b"cli"


def flexible_header(key: int, version: int, tags: bytes = b"\x00") -> bytes:
    return legacy_header(key, version) + tags


# Each claims four billion elements (compact) or 2**31-1 (legacy) in a frame of a few dozen bytes.
ADD_PARTITIONS_V3 = (flexible_header(ApiKey.ADD_PARTITIONS_TO_TXN, 3) + b"\x02t" + struct.pack(">qh", 1, 0)
                     + uvarint(4_000_000_000))
ADD_PARTITIONS_V1 = (legacy_header(ApiKey.ADD_PARTITIONS_TO_TXN, 1) + struct.pack(">h", 1) + b"t"
                     + struct.pack(">qhi", 1, 0, 2**31 - 1))
TXN_OFFSET_COMMIT_V3 = (flexible_header(ApiKey.TXN_OFFSET_COMMIT, 3) + b"\x02t" + b"\x02g" + struct.pack(">qh", 1, 0)
                        + struct.pack(">i", 0) + b"\x01" + b"\x00" + uvarint(4_000_000_000))
PRODUCE_V9 = flexible_header(ApiKey.PRODUCE, 9) + b"\x02t" + struct.pack(">hi", -1, 1000) + uvarint(4_000_000_000)


@pytest.mark.parametrize("body", [ADD_PARTITIONS_V3, ADD_PARTITIONS_V1, TXN_OFFSET_COMMIT_V3, PRODUCE_V9],
                         ids=["add_partitions_v3", "add_partitions_v1", "txn_offset_commit_v3", "produce_v9"])
def test_a_count_the_frame_cannot_hold_is_refused_before_kio_allocates(body):
    child = textwrap.dedent(f"""
        from txnguard.codecs import schemas
        from txnguard.codecs.errors import CodecError
        try:
            schemas.decode_request({body!r})
        except CodecError as e:
            print(type(e).__name__, e.reason)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the decoder process died: {done.returncode} {done.stderr[-500:]}"
    assert done.stdout.split() == ["BoundsExceeded", "bounds_exceeded"]


def test_a_frame_of_millions_of_tiny_structs_exceeds_its_element_budget():
    # AddPartitionsToTxn v3: every topic is 3 bytes (empty name, empty partitions, no tags): the
    # count fits the bytes, but walking and decoding them would stall every connection.
    topics = REQUEST_MAX_ELEMENTS + 1
    body = (flexible_header(ApiKey.ADD_PARTITIONS_TO_TXN, 3) + b"\x02t" + struct.pack(">qh", 1, 0) + uvarint(topics + 1)
            + b"\x01\x01\x00" * topics + b"\x00")
    with pytest.raises(BoundsExceeded, match="more structs"):
        schemas.decode_request(body)


def test_a_header_with_millions_of_empty_tagged_fields_is_refused_without_walking_them():
    tags = uvarint(10_000_000) + b"\x00\x00" * 10_000_000  # each: tag 0, size 0
    body = flexible_header(ApiKey.PRODUCE, 9, tags) + b"\x00" + struct.pack(">hi", 1, 1000) + b"\x01\x00"
    head = peek_request(body)
    with pytest.raises(TooManyTaggedFields):
        request_body_offset(body, head)
    with pytest.raises(TooManyTaggedFields):
        schemas.decode_request(body)


def test_a_few_header_tagged_fields_are_still_skipped():
    tags = uvarint(3) + b"\x00\x00" + b"\x01\x01x" + b"\x05\x00"
    body = flexible_header(ApiKey.PRODUCE, 9, tags) + b"\x00"
    assert request_body_offset(body, peek_request(body)) == len(body) - 1
    assert MAX_TAGGED_FIELDS >= 3


def test_a_string_longer_than_the_frame_is_refused():
    body = legacy_header(ApiKey.END_TXN, 1) + struct.pack(">h", 30_000) + b"t"
    with pytest.raises(BoundsExceeded, match="string"):
        schemas.decode_request(body)


def test_a_response_whose_count_cannot_fit_is_refused_too():
    # Metadata v9 response: header (correlation id, tags), throttle, brokers compact array of 2**31 - 2.
    body = struct.pack(">i", 7) + b"\x00" + struct.pack(">i", 0) + uvarint(2**31 - 1)
    with pytest.raises(BoundsExceeded):
        schemas.decode_response(body, ApiKey.METADATA, 9)


def test_a_truncated_record_batch_costs_its_partition_not_the_request():
    whole = build_batch([b"v" * 100], producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)

    class Partition:
        def __init__(self, index: int, records: bytes) -> None:
            self.index, self.records = index, records

    class Topic:
        name = "t"
        partition_data = (Partition(0, whole), Partition(1, whole[:-10]), Partition(2, whole + whole[:30]))

    class Body:
        topic_data = (Topic(),)

    good, cut, tail = produce_partitions(Body())
    assert good.invalid is None and good.transactional_heads[0].producer_id == 5
    assert cut.invalid is not None and "claims" in cut.invalid
    assert tail.invalid is not None and "truncated" in tail.invalid


def test_a_large_frame_arriving_in_many_reads_is_assembled_once():
    body = bytes(range(256)) * (40 * 4096)  # 40 MiB
    stream = frame(body) + frame(b"next")
    splitter = FrameSplitter(max_frame=64 * 1024 * 1024)
    out = []
    for i in range(0, len(stream), 65536):
        out.extend(splitter.feed(stream[i:i + 65536]))
        assert splitter.buffered <= len(body) + 4
    assert [len(f) for f in out] == [len(body) + 4, 8]
    assert out[0][4:] == body and bytes(out[1]) == frame(b"next")


def test_a_length_prefix_split_across_reads_is_joined():
    stream = frame(b"abc") + frame(b"defgh")
    splitter = FrameSplitter()
    out = []
    for piece in (stream[:2], stream[2:5], stream[5:9], stream[9:]):
        out.extend(bytes(f) for f in splitter.feed(piece))
    assert out == [frame(b"abc"), frame(b"defgh")]
    assert splitter.buffered == 0

"""Frame splitting: whole frames out, remainders kept, bad lengths refused."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength
from txnguard.codecs.framing import ASSEMBLE_IN_PLACE_ABOVE, FrameSplitter, frame


def test_frames_arriving_in_pieces_come_out_whole_and_in_order():
    stream = frame(b"first") + frame(b"") + frame(b"third-frame")
    splitter = FrameSplitter()
    out = []
    for i in range(len(stream)):
        out.extend(bytes(f) for f in splitter.feed(stream[i:i + 1]))
    assert out == [frame(b"first"), frame(b""), frame(b"third-frame")]
    assert splitter.buffered == 0


def test_many_frames_in_one_read_keep_the_partial_tail():
    splitter = FrameSplitter()
    data = frame(b"a" * 10) + frame(b"b" * 3) + frame(b"c" * 8)[:5]
    assert [bytes(f) for f in splitter.feed(data)] == [frame(b"a" * 10), frame(b"b" * 3)]
    assert splitter.buffered == 5
    assert [bytes(f) for f in splitter.feed(frame(b"c" * 8)[5:])] == [frame(b"c" * 8)]


def test_negative_length_is_refused():
    with pytest.raises(InvalidFrameLength):
        FrameSplitter().feed(struct.pack(">i", -1) + b"xx")


def test_length_over_the_limit_is_refused_before_the_body_arrives():
    splitter = FrameSplitter(max_frame=1024)
    with pytest.raises(FrameTooLarge) as e:
        splitter.feed(struct.pack(">i", 1025))
    assert e.value.reason == "frame_too_large"
    assert splitter.buffered == 0 or splitter.buffered == 4


def test_a_tls_client_hello_on_a_plaintext_port_is_named_as_such():
    client_hello_start = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC])
    with pytest.raises(FrameTooLarge) as e:
        FrameSplitter().feed(client_hello_start)
    assert e.value.reason == "tls_on_plaintext"
    assert "TLS" in str(e.value)


def test_the_limit_can_be_raised_after_authentication():
    splitter = FrameSplitter(max_frame=8)
    with pytest.raises(FrameTooLarge):
        splitter.feed(frame(b"x" * 9))
    splitter = FrameSplitter(max_frame=8)
    splitter.max_frame = 100
    assert [bytes(f) for f in splitter.feed(frame(b"x" * 9))] == [frame(b"x" * 9)]


# -- large frames: assembled in place past ASSEMBLE_IN_PLACE_ABOVE, no call copying more than its read ---------

def _feed_in_reads(splitter: FrameSplitter, stream: bytes, sizes: list[int]) -> list[memoryview]:
    out: list[memoryview] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = sizes[i % len(sizes)]
        out.extend(splitter.feed(stream[pos:pos + n]))
        pos, i = pos + n, i + 1
    return out


@settings(max_examples=25, deadline=None)
@given(before=st.integers(0, 3), size=st.integers(ASSEMBLE_IN_PLACE_ABOVE - 8, ASSEMBLE_IN_PLACE_ABOVE * 3),
       sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=6).filter(lambda s: sum(s) >= 60_000 * len(s)))
def test_frames_around_the_in_place_threshold_come_out_whole_in_order_and_read_only(before, size, sizes):
    small = [frame(bytes([i]) * (i + 1)) for i in range(before)]
    big = frame(bytes(range(256)) * (size // 256) + b"t" * (size % 256))
    stream = b"".join(small) + big + frame(b"after") + frame(b"x")[:3]
    splitter = FrameSplitter()
    out = _feed_in_reads(splitter, stream, sizes)
    assert [bytes(f) for f in out] == [*small, big, frame(b"after")]
    assert all(f.readonly for f in out)  # kio reads only read-only buffers
    assert splitter.buffered == 3


def test_the_head_of_a_frame_being_assembled_in_place_is_its_first_bytes_only():
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB
    splitter = FrameSplitter()
    for i in range(0, 2 * 1024 * 1024 + 4, 256 * 1024):
        assert splitter.feed((frame(body))[i:i + 256 * 1024]) == []
    found = splitter.incomplete(head_bytes=1000)
    assert found == (len(body) + 4, frame(body)[:1000])


def test_an_in_place_assembly_hands_over_what_arrived_when_cut_through_or_raw():
    stream = frame(b"z" * (2 * ASSEMBLE_IN_PLACE_ABOVE))
    arrived = ASSEMBLE_IN_PLACE_ABOVE + 300_000
    for hand_over in ("detach", "take_buffered"):
        splitter = FrameSplitter()
        assert _feed_in_reads(splitter, stream[:arrived], [100_000]) == []
        if hand_over == "detach":
            parts, left = splitter.detach()
            assert b"".join(parts) == stream[:arrived] and left == len(stream) - arrived
        else:
            assert splitter.take_buffered() == stream[:arrived]
        assert splitter.buffered == 0 and splitter.feed(frame(b"next")) == [frame(b"next")]

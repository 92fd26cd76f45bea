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


# -- cut through: a frame forwarded as it arrives, its bytes told apart from the next frame's ---------------------

def test_a_frame_cut_through_is_told_apart_from_the_next_frame_read_by_read():
    big, after, third = frame(b"p" * 1000), frame(b"after"), frame(b"third")
    splitter = FrameSplitter()

    # read 1: the big frame's first 300 bytes, assembled as usual until its owner decides
    assert splitter.feed(big[:300]) == [] and splitter.buffered == 300
    # the owner cuts it through: the pieces so far leave now, the rest as it arrives
    assert b"".join(splitter.cut_through()) == big[:300]
    assert splitter.buffered == 0 and splitter.through == len(big) - 300

    # read 2: wholly inside the big frame, handed back as it came (nothing copied, nothing after it)
    read2 = big[300:700]
    through, rest = splitter.take_cut_through(read2)
    assert through is read2 and rest == b"" and splitter.through == len(big) - 700

    # read 3: the big frame ends inside it; the next frame and a part of the third follow
    read3 = big[700:] + after + third[:3]
    through, rest = splitter.take_cut_through(read3)
    assert bytes(through) == big[700:] and splitter.through == 0
    assert splitter.feed(rest) == [after] and splitter.buffered == 3  # framed again, from the first byte after

    # read 4: the third frame completes; nothing is being cut through, so the read is all for feed
    read4 = third[3:]
    assert splitter.take_cut_through(read4) == (b"", read4)
    assert splitter.feed(read4) == [third] and splitter.buffered == 0


def test_a_cut_through_ending_exactly_at_a_read_s_end_leaves_the_next_read_to_be_framed():
    big, after = frame(b"q" * 500), frame(b"after")
    splitter = FrameSplitter()

    assert splitter.feed(big[:100]) == []
    assert b"".join(splitter.cut_through()) == big[:100]

    # the read that brings the big frame's last byte ends with it
    last = big[100:]
    through, rest = splitter.take_cut_through(last)
    assert through is last and rest == b"" and splitter.through == 0

    # the next read is a frame of its own, not bytes of the one cut through
    assert splitter.take_cut_through(after) == (b"", after)
    assert splitter.feed(after) == [after] and splitter.buffered == 0

"""Frame splitting: whole frames out, remainders kept, bad lengths refused."""

import struct

import pytest

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength
from txnguard.codecs.framing import FrameSplitter, frame


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

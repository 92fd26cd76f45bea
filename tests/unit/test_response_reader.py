"""The response reader on its own (connection/reader.py): bounded, and the owner of a response read in part."""

from __future__ import annotations

import struct

import pytest

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength, TruncatedFrame
from txnguard.connection.commands import Chunk, Command
from txnguard.connection.reader import ResponseReader


def frame(correlation_id: int, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(body), correlation_id) + body


class Owner:
    """Streams what `stream` says, keeps the rest; records what the reader told it."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.started: list[tuple[int, int]] = []
        self.done: list[bytes | None] = []

    def response_started(self, size: int, correlation_id: int, out: list[Command]) -> tuple[bool, list[Chunk]]:
        self.started.append((size, correlation_id))
        return self.stream, []

    def response_done(self, parts: list[Chunk] | None, out: list[Command]) -> None:
        self.done.append(None if parts is None else b"".join(bytes(p) for p in parts))


def test_a_head_split_byte_by_byte_is_put_together_and_a_kept_response_comes_whole():
    reader, owner = ResponseReader(), Owner(stream=False)
    data = frame(7, b"body")
    for i in range(len(data)):
        assert reader.read(data[i:i + 1], owner, []) == []
        assert reader.idle is (i == len(data) - 1)
    assert owner.started == [(8, 7)] and owner.done == [data]


def test_a_streamed_response_leaves_as_one_slice_of_the_chunk_per_run():
    reader, owner = ResponseReader(), Owner(stream=True)
    chunk = frame(1, b"a") + frame(2, b"bb")
    out = reader.read(chunk, owner, [])
    assert out == [chunk] and owner.done == [None, None]


@pytest.mark.parametrize(("length", "error"), [(-1, InvalidFrameLength), (3, TruncatedFrame), (1001, FrameTooLarge)])
def test_a_length_out_of_bounds_is_refused_before_anything_is_kept(length: int, error: type[Exception]):
    reader, owner = ResponseReader(max_frame=1000), Owner(stream=False)
    with pytest.raises(error):
        reader.read(struct.pack(">ii", length, 1), owner, [])
    assert owner.started == []


def test_a_partial_head_is_handed_back_when_the_stream_stops_being_frames():
    reader, owner = ResponseReader(), Owner(stream=False)
    reader.read(b"\x00\x00\x00", owner, [])
    assert not reader.idle
    assert reader.take_partial_head() == b"\x00\x00\x00" and reader.idle

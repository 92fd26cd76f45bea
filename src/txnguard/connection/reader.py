"""The broker's response stream, read as a stream (after wsproto's receive buffer): bounded, and the only
owner of the state of a response read in part.

After a response's 8-byte head (length, correlation id) its owner, the connection, knows its request and
says whether the response streams (relayed to the client as its bytes arrive: a 50 MB Fetch answer is
never assembled) or is kept whole to be read. Consecutive streamed bytes of one chunk leave as one
slice of it.
"""

from __future__ import annotations

import struct
from typing import Protocol

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength, TruncatedFrame
from txnguard.connection.commands import Chunk, Command

# Responses are bounded by the broker's own limits; ours only guards against garbage.
RESPONSE_MAX_FRAME = 2 * 1024 * 1024 * 1024 - 1
_HEAD = struct.Struct(">ii")  # length, correlation id


class Responses(Protocol):
    """What the reader's owner does at a response's start and end."""

    def response_started(self, size: int, correlation_id: int, out: list[Command]) -> tuple[bool, list[Chunk]]:
        """Pair the response with its request: whether it streams, and responses now ready to go before it."""
        ...

    def response_done(self, parts: list[Chunk] | None, out: list[Command]) -> None:
        """The response has all arrived: its pieces, or None when it was streamed."""
        ...


def check_length(size: int, limit: int = RESPONSE_MAX_FRAME) -> None:
    if size < 4:
        if size < 0:
            raise InvalidFrameLength(f"negative frame length {size}")
        raise TruncatedFrame(f"response frame of {size} bytes has no correlation id")
    if size > limit:
        raise FrameTooLarge(size, limit)


class ResponseReader:
    __slots__ = ("_head", "_parts", "_streaming", "left", "max_frame")

    def __init__(self, max_frame: int = RESPONSE_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._head = bytearray()   # a response head split across chunks, until its 8 bytes are here
        self.left = 0              # bytes of the current response's body still to come
        self._streaming = False    # the current response goes to the client as it arrives
        self._parts: list[Chunk] = []  # the current response's pieces when it is kept whole

    @property
    def idle(self) -> bool:
        """Between responses: nothing read in part."""
        return not self.left and not self._head

    def take_partial_head(self) -> bytes:
        """The bytes of a head read in part (the connection became a byte pipe: they are not a head)."""
        head = bytes(self._head)
        self._head.clear()
        return head

    def read(self, data: Chunk, owner: Responses, out: list[Command]) -> list[Chunk]:  # noqa: C901 - one frame per turn, no helper calls on the streamed path
        """Read a chunk of the broker's stream; the bytes for the client, in order."""
        to_client: list[Chunk] = []
        view = memoryview(data)
        end, pos = len(data), 0
        # A run of this chunk streamed to the client, sent as one slice: [run_start, run_end).
        run_start = run_end = -1
        while pos < end:
            left = self.left
            if left:  # inside a response body
                take = left if left <= end - pos else end - pos
                if self._streaming:
                    if run_end == pos:
                        run_end += take
                    else:
                        if run_start >= 0:
                            to_client.append(view[run_start:run_end])
                        run_start, run_end = pos, pos + take
                else:
                    self._parts.append(view[pos:pos + take])
                pos += take
                self.left = left - take
                if not self.left:
                    self._done(owner, out)
                continue
            # The 8-byte head of the next response: length and correlation id.
            head_in_chunk = not self._head and end - pos >= 8
            if head_in_chunk:
                size, correlation_id = _HEAD.unpack_from(data, pos)
                head: Chunk = view[pos:pos + 8]
                head_at = pos
            else:
                need = 8 - len(self._head)
                self._head += view[pos:pos + need]
                if len(self._head) < 8:
                    break
                pos += need
                head = bytes(self._head)
                self._head.clear()
                size, correlation_id = _HEAD.unpack(head)
                head_at = -1
            check_length(size, self.max_frame)
            streaming, ready = owner.response_started(size, correlation_id, out)
            self.left = size - 4
            self._streaming = streaming
            if ready:
                # Earlier responses (local answers, buffered ones) were complete: they go first.
                if run_start >= 0:
                    to_client.append(view[run_start:run_end])
                    run_start = run_end = -1
                to_client += ready
            if streaming:
                if head_at >= 0 and run_end == head_at:
                    run_end += 8
                elif head_at >= 0:
                    if run_start >= 0:
                        to_client.append(view[run_start:run_end])
                    run_start, run_end = head_at, head_at + 8
                else:
                    if run_start >= 0:
                        to_client.append(view[run_start:run_end])
                        run_start = run_end = -1
                    to_client.append(head)
            else:
                self._parts = [head]
            if head_in_chunk:
                pos += 8
            if not self.left:
                self._done(owner, out)
        if run_start >= 0:
            to_client.append(data if run_start == 0 and run_end == end else view[run_start:run_end])
        return to_client

    def _done(self, owner: Responses, out: list[Command]) -> None:
        if self._streaming:
            self._streaming = False
            owner.response_done(None, out)
            return
        parts, self._parts = self._parts, []
        owner.response_done(parts, out)

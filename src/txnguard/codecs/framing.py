"""Split a byte stream into length-prefixed Kafka frames, with a size limit.

Sans-IO: `feed(data)` returns the complete frames the data finished and keeps
the remainder. Frames are returned *with* their 4-byte length prefix, as
memoryviews over immutable bytes, so forwarding one unchanged copies nothing;
`frame[4:]` is the body the header peeks read.
"""

from __future__ import annotations

import struct

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength

DEFAULT_MAX_FRAME = 100 * 1024 * 1024  # the broker's socket.request.max.bytes default
PRE_AUTH_MAX_FRAME = 512 * 1024  # what a broker allows before SASL authentication completes

_LENGTH = struct.Struct(">i")
# A TLS record starts with its content type and version 0x03 0x0N; read as a
# Kafka length prefix a handshake (0x16) is 0x1603xxxx, i.e. ~369 MB.
# An alert (0x15) is what a TLS server sends a plaintext client.
_TLS_RECORD_TYPES = (0x15, 0x16)


class FrameSplitter:
    __slots__ = ("_pending", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._pending = bytearray()
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that has not arrived completely (partial-frame timeouts use it)."""
        return len(self._pending)

    def take_buffered(self) -> bytes:
        """Hand over the bytes of an incomplete frame (when a connection stops being framed)."""
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def feed(self, data: bytes) -> list[memoryview]:
        if self._pending:
            self._pending += data
            data = bytes(self._pending)
            self._pending.clear()
        frames: list[memoryview] = []
        view = memoryview(data)
        end = len(data)
        pos = 0
        while end - pos >= 4:
            (size,) = _LENGTH.unpack_from(data, pos)
            if size < 0:
                raise InvalidFrameLength(f"negative frame length {size}")
            if size > self.max_frame:
                raise FrameTooLarge(size, self.max_frame, data[pos] in _TLS_RECORD_TYPES and data[pos + 1] == 3)
            if end - pos - 4 < size:
                break
            frames.append(view[pos:pos + 4 + size])
            pos += 4 + size
        if pos < end:
            self._pending += view[pos:]
        return frames


def frame(body: bytes) -> bytes:
    """Prefix a frame body with its length."""
    return _LENGTH.pack(len(body)) + body

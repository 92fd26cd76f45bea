"""Split a byte stream into length-prefixed Kafka frames, with a size limit.

Sans-IO: `feed(data)` returns the complete frames the data finished and keeps
the remainder. Frames are returned *with* their 4-byte length prefix, as
memoryviews over immutable bytes, so forwarding one unchanged copies nothing;
`frame[4:]` is the body the header peeks read.
"""

from __future__ import annotations

import mmap
import struct

from txnguard.codecs.errors import FrameTooLarge, InvalidFrameLength

DEFAULT_MAX_FRAME = 100 * 1024 * 1024  # the broker's socket.request.max.bytes default
PRE_AUTH_MAX_FRAME = 512 * 1024  # what a broker allows before SASL authentication completes

_LENGTH = struct.Struct(">i")
# A TLS record starts with its content type and version 0x03 0x0N; read as a
# Kafka length prefix a handshake (0x16) is 0x1603xxxx, i.e. ~369 MB.
# An alert (0x15) is what a TLS server sends a plaintext client.
_TLS_RECORD_TYPES = (0x15, 0x16)
# A frame still being assembled past this many bytes goes on in one buffer of its whole length, each read
# copied in as it arrives, instead of as pieces joined when the last one comes: joining a 100 MiB frame
# (a transactional Produce the proxy verifies) was one copy of 100 MiB into fresh memory in one call, a
# 0.3-0.8 s pause of the event loop for every connection on this machine (bench/big_frame.py).
ASSEMBLE_IN_PLACE_ABOVE = 1024 * 1024


class FrameSplitter:
    """Frames out of a byte stream, in time linear in the bytes fed, no call doing more than its read's worth.

    A frame that arrives over many reads (a 100 MiB Produce comes in hundreds of
    socket reads) is kept as the list of its pieces; re-joining on every read made a
    40 MiB frame cost seconds of CPU. Past ASSEMBLE_IN_PLACE_ABOVE bytes the pieces
    move into one anonymous mapping of the frame's length and every later read is
    copied in as it comes, so completing the frame copies only its last read. The
    mapping's pages exist once written: memory held is what arrived, never what a
    length prefix claims (a client that claims 100 MiB and sends 2 holds 2).

    A frame its owner forwards without reading whole (a large Produce the proxy need not verify) is
    cut through: `cut_through` hands over the pieces so far, and `take_cut_through` tells the rest of
    its bytes, as they arrive, from the next frame's; `through` says how many are still to come.
    """

    __slots__ = ("_buf", "_parts", "_want", "buffered", "max_frame", "through")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._parts: list[bytes | memoryview] = []  # the pieces of the incomplete frame
        self._buf: mmap.mmap | None = None          # or, past ASSEMBLE_IN_PLACE_ABOVE, the frame being filled in
        # Bytes held for a frame that has not arrived completely (partial-frame timeouts use it). A plain
        # attribute, not a property: the relay's fast path reads it on every read.
        self.buffered = 0
        self._want: int | None = None                # its whole length with the prefix, once known
        self.max_frame = max_frame
        # Bytes still to come of a frame being cut through (`cut_through`); a plain attribute, as `buffered`.
        self.through = 0

    def take_buffered(self) -> bytes:
        """Hand over the bytes of an incomplete frame (when a connection stops being framed)."""
        data = b"".join(self._pieces())
        self._reset()
        return data

    def _pieces(self) -> list[bytes | memoryview]:
        if self._buf is not None:
            return [memoryview(self._buf)[:self.buffered].toreadonly()]
        return self._parts

    def incomplete(self, head_bytes: int = 64 * 1024) -> tuple[int, bytes] | None:
        """(whole length, first bytes so far) of the frame being assembled, once its length is known.

        A relay that needs only a frame's header can forward the rest as it arrives (cut-through)
        instead of holding the whole frame; `cut_through` hands the assembly over.
        """
        if self._want is None:
            return None
        first: list[bytes | memoryview] = []
        have = 0
        for part in self._pieces():
            if have + len(part) >= head_bytes:
                first.append(part[:head_bytes - have])  # a slice: copying the head only, never the frame
                break
            first.append(part)
            have += len(part)
        return self._want, b"".join(first)

    def detach(self) -> tuple[list[bytes | memoryview], int]:
        """Stop assembling the incomplete frame: its pieces so far, and how many of its bytes are still to come."""
        assert self._want is not None
        parts, left = self._pieces(), self._want - self.buffered
        self._reset()
        return parts, left

    def cut_through(self) -> list[bytes | memoryview]:
        """Forward the incomplete frame as it arrives instead of assembling it: its pieces so far.

        The rest of its bytes are not frames to split: `take_cut_through` takes them off the reads
        that bring them, before `feed` sees what follows.
        """
        parts, self.through = self.detach()
        return parts

    def take_cut_through(self, data: bytes | memoryview) -> tuple[bytes | memoryview, bytes | memoryview]:
        """Split a read at the end of the frame being cut through: (its bytes in the read, the bytes after).

        A read that lies wholly inside the frame comes back as it is, with nothing after it; a read the
        frame ends inside comes back as two slices of it, the second for `feed`.
        """
        left = self.through
        if not left:
            return b"", data
        if left >= len(data):
            self.through = left - len(data)
            return data, b""
        self.through = 0
        view = memoryview(data)
        return view[:left], view[left:]

    def _reset(self) -> None:
        self._parts = []
        self._buf = None  # unmapped once nothing refers to it any more (a frame handed out, a write pending)
        self.buffered = 0
        self._want = None

    def _fill_in_place(self, want: int) -> None:
        """Move the pieces so far into a mapping of the frame's whole length (pages are made as written)."""
        try:
            buf = mmap.mmap(-1, want)
        except (OSError, ValueError):
            return  # no address space for it: the pieces are joined at the end, as below the threshold
        pos = 0
        for part in self._parts:
            buf[pos:pos + len(part)] = part
            pos += len(part)
        self._buf, self._parts = buf, []

    def _size(self, data: bytes | memoryview, pos: int) -> int:
        (size,) = _LENGTH.unpack_from(data, pos)
        if size < 0:
            raise InvalidFrameLength(f"negative frame length {size}")
        if size > self.max_frame:
            raise FrameTooLarge(size, self.max_frame, data[pos] in _TLS_RECORD_TYPES and data[pos + 1] == 3)
        return int(size)

    def feed(self, data: bytes | memoryview) -> list[memoryview]:
        """The complete frames `data` finishes; the remainder is kept for the next read."""
        assert not self.through, "the bytes of a frame being cut through go through take_cut_through"
        frames: list[memoryview] = []
        view = memoryview(data)
        if self._parts or self._buf is not None:
            rest = self._continue(view, frames)
            if rest is None:
                return frames
            view = rest
        end = len(view)
        pos = 0
        while end - pos >= 4:
            size = self._size(view, pos)
            if end - pos - 4 < size:
                break
            frames.append(view[pos:pos + 4 + size])
            pos += 4 + size
        if pos < end:
            rest = view[pos:]  # reads arrive as immutable bytes: holding a view copies nothing
            self._parts.append(rest)
            self.buffered = len(rest)
            if len(rest) >= 4:
                self._want = 4 + self._size(rest, 0)
        return frames

    def _continue(self, view: memoryview, frames: list[memoryview]) -> memoryview | None:
        """Add a read to the incomplete frame; the unread rest of `view`, or None if all was taken."""
        if self._want is None:
            # Fewer than 4 bytes were held: the length prefix itself was split. Rare and tiny.
            head = b"".join(self._parts)
            need = 4 - len(head)
            if len(view) < need:
                self._parts = [head + view]
                self.buffered += len(view)
                return None
            prefix = head + view[:need]
            self._want = 4 + self._size(prefix, 0)
            self._parts = [prefix]
            self.buffered = 4
            view = view[need:]
        missing = self._want - self.buffered
        if self._buf is None and self.buffered >= ASSEMBLE_IN_PLACE_ABOVE and len(view) < missing:
            self._fill_in_place(self._want)
        buf = self._buf
        if buf is not None:
            take = min(len(view), missing)
            buf[self.buffered:self.buffered + take] = view[:take]
            self.buffered += take
            if take < missing:
                return None
            frames.append(memoryview(buf).toreadonly())
            self._reset()
            return view[missing:]
        if len(view) < missing:
            self._parts.append(view)
            self.buffered += len(view)
            return None
        self._parts.append(view[:missing])
        frames.append(memoryview(b"".join(self._parts)))
        self._reset()
        return view[missing:]


def frame(body: bytes) -> bytes:
    """Prefix a frame body with its length."""
    return _LENGTH.pack(len(body)) + body

"""Structs made for a length read from the frame, for the in-place readers: `Runs(">{}sqh")[n]` reads a string
of n bytes and the fixed fields after it (here a producer id and epoch) in one unpack.

On the relay's fast path a name is mostly followed by fixed fields: one `struct.unpack_from` reads both, where
reading the fields and slicing the view to decode the name took two reads and a view (and a count of n int32s
is one read, not n). Each length's Struct is made on first use; only lengths under 256 are kept, so no frame
can make the module hold more than 256 per format.
"""

from __future__ import annotations

import struct

_KEPT = 256


class Runs(dict[int, struct.Struct]):
    """`runs[n]`: the Struct of `template` with n in place of `{}` (a big-endian struct format)."""

    def __init__(self, template: str) -> None:
        super().__init__()
        self.template = template

    def __missing__(self, n: int) -> struct.Struct:
        run = struct.Struct(self.template.format(n))
        if n < _KEPT:
            self[n] = run
        return run

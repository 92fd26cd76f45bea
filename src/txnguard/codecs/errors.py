"""Codec errors, each with a short `reason` (a metric label and a close reason).

kio leaks bare KeyError (unknown tagged field) and ValueError (record batches)
next to its own SerialError and KioIndexError; `schemas` converts all of them
into these types at one boundary, so nothing above the codecs catches kio's.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base of everything the codecs raise. `reason` is a short metric label."""

    reason = "codec_error"


class InvalidFrameLength(CodecError):
    """A negative length prefix: the stream is not Kafka (or is TLS on a plaintext port)."""

    reason = "invalid_length"


class FrameTooLarge(CodecError):
    """A length prefix above the connection's limit; the broker closes the connection too."""

    reason = "frame_too_large"

    def __init__(self, size: int, limit: int, looks_like_tls: bool = False) -> None:
        hint = " (the bytes look like a TLS handshake: is the client using TLS on a plaintext port?)" \
            if looks_like_tls else ""
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes{hint}")
        self.size, self.limit, self.looks_like_tls = size, limit, looks_like_tls
        if looks_like_tls:
            self.reason = "tls_on_plaintext"


class TruncatedFrame(CodecError):
    """A frame too short to hold the header it claims."""

    reason = "truncated"


class BoundsExceeded(CodecError):
    """A length or count the frame cannot hold: refused before kio allocates for it (the broker closes too)."""

    reason = "bounds_exceeded"


class TooManyTaggedFields(BoundsExceeded):
    """More tagged fields in one struct than any Kafka schema defines: walking them would stall the loop."""

    reason = "too_many_tagged_fields"


class UnsupportedApiVersion(CodecError):
    """kio (our pinned decoder) has no schema for this API key and version."""

    reason = "unsupported_version"


class DecodeFailed(CodecError):
    """A frame we inspect did not decode; a broker answers such a request by closing the connection."""

    reason = "decode_failed"

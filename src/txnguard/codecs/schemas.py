"""Cached kio schema lookups and the one boundary where kio's exceptions become ours.

kio's `load_*_schema` resolves a module path on every call (~7 us); the proxy
asks on every inspected frame, so the answers are cached per (key, version).
"""

from __future__ import annotations

import io
import struct
from dataclasses import fields
from functools import cache
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i16, i32

from txnguard.codecs import bounds
from txnguard.codecs.errors import CodecError, DecodeFailed, TruncatedFrame, UnsupportedApiVersion

_KIO_FAILURES = (SerialError, KeyError, ValueError, IndexError, TypeError, struct.error, OverflowError)


@cache
def request_schema(api_key: int, api_version: int) -> Any:
    try:
        return load_request_schema(api_key, api_version)
    except KioIndexError as e:
        raise UnsupportedApiVersion(f"no request schema for api {api_key} v{api_version}") from e


@cache
def response_schema(api_key: int, api_version: int) -> Any:
    try:
        return load_response_schema(api_key, api_version)
    except KioIndexError as e:
        raise UnsupportedApiVersion(f"no response schema for api {api_key} v{api_version}") from e


@cache
def kio_version_range(api_key: int) -> tuple[int, int] | None:
    """The request versions the pinned kio can decode for an API key, or None if it knows none."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(schema_name_map[name])
    return versions[0], versions[-1]


@cache
def request_header_version(api_key: int, api_version: int) -> int:
    return int(request_schema(api_key, api_version).__header_schema__.__version__)


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"unknown_{api_key}")


def decode_request(frame: bytes | memoryview) -> tuple[Any, Any]:
    """(header, body) of a request frame (without its length prefix).

    Every size in the frame is checked against its bytes first (`bounds`): kio's
    native decoder would allocate for whatever count a frame claims.
    """
    if len(frame) < 4:
        raise TruncatedFrame(f"request frame of {len(frame)} bytes has no header")
    api_key, api_version = struct.unpack_from(">hh", frame, 0)
    cls = request_schema(api_key, api_version)
    _checked(bounds.check, cls.__header_schema__, cls, frame, bounds.REQUEST_MAX_ELEMENTS)
    try:
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        body, used_body = entity_reader(cls)(frame, used)
    except _KIO_FAILURES as e:
        raise DecodeFailed(f"api {api_key} v{api_version} request: {e!r}") from e
    if used + used_body != len(frame):
        raise DecodeFailed(f"api {api_key} v{api_version} request: {len(frame) - used - used_body} trailing bytes")
    return header, body


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int) -> tuple[Any, Any]:
    """(header, body) of a response frame (without its length prefix), sizes checked first."""
    cls = response_schema(api_key, api_version)
    _checked(bounds.check, cls.__header_schema__, cls, frame, bounds.RESPONSE_MAX_ELEMENTS)
    try:
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        body, used_body = entity_reader(cls)(frame, used)
    except _KIO_FAILURES as e:
        raise DecodeFailed(f"api {api_key} v{api_version} response: {e!r}") from e
    if used + used_body != len(frame):
        raise DecodeFailed(f"api {api_key} v{api_version} response: {len(frame) - used - used_body} trailing bytes")
    return header, body


def check_response_body(body: bytes | memoryview, api_key: int, api_version: int) -> None:
    """Bounds-check a response body read by hand (no header), as decode_response would."""
    _checked(bounds.check_body, response_schema(api_key, api_version), body, bounds.RESPONSE_MAX_ELEMENTS)


def _checked(check: Any, *args: Any) -> None:
    try:
        check(*args)
    except CodecError:
        raise
    except _KIO_FAILURES as e:  # a schema the walker has no rule for must not pass unchecked
        raise DecodeFailed(f"bounds check: {e!r}") from e


def encode(header: Any, body: Any) -> bytes:
    """Header + body, with the 4-byte length prefix."""
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    try:
        entity_writer(type(header))(buf, header)
        entity_writer(type(body))(buf, body)
    except _KIO_FAILURES as e:
        raise DecodeFailed(f"could not encode {type(body).__name__}: {e!r}") from e
    out = buf.getbuffer()
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def encode_request(payload: Any, correlation_id: int, client_id: str | None) -> bytes:
    """A whole request frame: the header version the payload's schema names, then the payload."""
    header_cls = payload.__header_schema__
    args: dict[str, Any] = {
        "request_api_key": i16(payload.__api_key__),
        "request_api_version": i16(payload.__version__),
        "correlation_id": i32(correlation_id),
    }
    if "client_id" in _field_names(header_cls):
        args["client_id"] = client_id
    return encode(header_cls(**args), payload)


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def response_header_for(api_key: int, api_version: int, correlation_id: int) -> Any:
    """A response header of the right version for (key, version), for locally made responses."""
    cls = response_schema(api_key, api_version).__header_schema__
    return cls(correlation_id=correlation_id)

"""Responses the proxy writes itself, shaped exactly as a broker would shape them."""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.primitive import i16, i32

from txnguard.codecs.api_versions import API_VERSIONS, proxy_api_versions_range
from txnguard.codecs.schemas import encode


def api_versions_unsupported(correlation_id: int, advertised: Iterable[tuple[int, int, int]]) -> bytes:
    """ApiVersions v0 with UNSUPPORTED_VERSION, the broker's answer to a request newer than it knows.

    The client retries with the highest ApiVersions version listed here (KIP-511).
    `advertised` is (api key, min, max) of what the proxy advertises, if known.
    """
    keys = {k: (lo, hi) for k, lo, hi in advertised}
    keys[API_VERSIONS] = proxy_api_versions_range()
    body = ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, (lo, hi) in sorted(keys.items())
        ),
    )
    return encode(ResponseHeader(correlation_id=i32(correlation_id)), body)

"""Responses the proxy writes itself, shaped exactly as a broker would shape them."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable
from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.primitive import i16, i32

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.api_versions import API_VERSIONS, proxy_api_versions_range
from txnguard.codecs.schemas import encode, response_header_for, response_schema

ADD_OFFSETS_TO_TXN = ApiKey.ADD_OFFSETS_TO_TXN


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


def add_to_txn_error(api_key: int, api_version: int, correlation_id: int, request: Any, code: ErrorCode) -> bytes:
    """AddPartitionsToTxn (v0-3: every partition) or AddOffsetsToTxn answered with one error `code`,
    as the coordinator answers while the previous transaction is still completing (CONCURRENT_TRANSACTIONS)."""
    cls = response_schema(api_key, api_version)
    module = sys.modules[cls.__module__]
    header = response_header_for(api_key, api_version, correlation_id)
    if api_key == ADD_OFFSETS_TO_TXN:
        return encode(header, cls(throttle_time=datetime.timedelta(0), error_code=code))
    topics = tuple(
        module.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=tuple(
            module.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=code)
            for p in t.partitions))
        for t in request.v3_and_below_topics)
    return encode(header, cls(throttle_time=datetime.timedelta(0), results_by_topic_v3_and_below=topics))

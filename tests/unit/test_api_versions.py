"""ApiVersions intersection: inspected APIs are capped to kio, Produce keeps min 0, unknown keys per policy."""

from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.api_versions import VersionPolicy, intersect
from txnguard.codecs.schemas import kio_version_range


def _broker(*entries):
    return ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in entries),
        throttle_time=0,
    )


def _ranges(body):
    return {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in body.api_keys}


def test_inspected_apis_are_capped_to_what_kio_decodes():
    kio_metadata_max = kio_version_range(ApiKey.METADATA)[1]
    out = intersect(_broker((3, 0, kio_metadata_max + 5), (10, 0, 99)), VersionPolicy())
    assert _ranges(out)[3] == (0, kio_metadata_max)
    assert _ranges(out)[10] == (0, kio_version_range(ApiKey.FIND_COORDINATOR)[1])


def test_produce_keeps_the_brokers_minimum_zero():
    # kio has no Produce v0-2 but those carry no transactions: the proxy passes them opaquely (KAFKA-18659).
    out = intersect(_broker((0, 0, 99)), VersionPolicy())
    assert _ranges(out)[0] == (0, kio_version_range(ApiKey.PRODUCE)[1])


def test_apis_the_proxy_never_inspects_pass_unchanged():
    body = _broker((19, 2, 7), (42, 0, 2))
    assert intersect(body, VersionPolicy()) is body


def test_unknown_api_keys_pass_by_default_and_can_be_stripped():
    body = _broker((3, 0, 9), (12345, 0, 3))
    assert 12345 in _ranges(intersect(body, VersionPolicy()))
    assert 12345 not in _ranges(intersect(body, VersionPolicy(unknown_keys="strip")))


def test_operator_caps_and_hidden_keys():
    out = intersect(_broker((3, 0, 9), (19, 2, 7)), VersionPolicy(max_version={19: 4}, hidden=frozenset({3})))
    assert _ranges(out) == {19: (2, 4)}


def test_a_range_that_cannot_meet_is_hidden():
    out = intersect(_broker((18, 50, 60)), VersionPolicy())
    assert 18 not in _ranges(out)

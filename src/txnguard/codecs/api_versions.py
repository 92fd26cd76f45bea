"""ApiVersions intersection: advertise only what both the broker and the proxy can handle.

"This is an intrinsic part of correctly acting as a proxy" (Kroxylicious,
ApiVersionsIntersectFilter). For every API the proxy inspects, the advertised
range is capped to what the pinned kio decodes; other APIs pass untouched.
Produce keeps the broker's minimum (0 on Kafka 4.x, KAFKA-18659): versions
below 3 carry no transactions and no addresses, so they pass opaquely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txnguard.codecs.schemas import kio_version_range

API_VERSIONS = 18

# api key -> first version the proxy decodes (requests or responses). Versions below
# it are forwarded opaquely, so kio need not know them.
INSPECTED_FROM: dict[int, int] = {
    0: 3,    # Produce: transactional id and batches from v3, NodeEndpoints from v10
    1: 16,   # Fetch: NodeEndpoints from v16
    3: 0,    # Metadata
    10: 0,   # FindCoordinator
    18: 0,   # ApiVersions
    22: 0,   # InitProducerId
    24: 0,   # AddPartitionsToTxn
    25: 0,   # AddOffsetsToTxn
    26: 0,   # EndTxn
    28: 0,   # TxnOffsetCommit
    60: 0,   # DescribeCluster
    78: 0,   # ShareFetch: NodeEndpoints
    79: 0,   # ShareAcknowledge: NodeEndpoints
}


@dataclass(frozen=True)
class VersionPolicy:
    unknown_keys: str = "pass"   # "pass": forward keys kio does not know opaquely; "strip": hide them
    max_version: Mapping[int, int] = field(default_factory=dict)  # operator caps per api key
    hidden: frozenset[int] = frozenset()  # api keys never advertised


def advertised_range(api_key: int, broker_min: int, broker_max: int, policy: VersionPolicy) -> tuple[int, int] | None:
    """The range to advertise for one API key, or None to hide the key."""
    if api_key in policy.hidden:
        return None
    lo, hi = broker_min, broker_max
    kio_range = kio_version_range(api_key)
    if kio_range is None:
        if policy.unknown_keys == "strip":
            return None
    elif api_key in INSPECTED_FROM:
        kio_lo, kio_hi = kio_range
        hi = min(hi, kio_hi)
        if kio_lo > INSPECTED_FROM[api_key]:
            lo = max(lo, kio_lo)
    if api_key in policy.max_version:
        hi = min(hi, policy.max_version[api_key])
    if lo > hi:
        return None
    return lo, hi


def intersect(body: Any, policy: VersionPolicy) -> Any:
    """An ApiVersions response body with every range intersected (same object if unchanged)."""
    keys = []
    changed = False
    for entry in body.api_keys:
        r = advertised_range(int(entry.api_key), int(entry.min_version), int(entry.max_version), policy)
        if r is None:
            changed = True
            continue
        if r != (entry.min_version, entry.max_version):
            changed = True
            entry = dataclasses.replace(entry, min_version=type(entry.min_version)(r[0]),
                                        max_version=type(entry.max_version)(r[1]))
        keys.append(entry)
    return dataclasses.replace(body, api_keys=tuple(keys)) if changed else body


def proxy_api_versions_range() -> tuple[int, int]:
    r = kio_version_range(API_VERSIONS)
    assert r is not None
    return r

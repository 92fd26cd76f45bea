"""ApiVersions intersection: advertise only what both the broker and the proxy can handle.

"This is an intrinsic part of correctly acting as a proxy" (Kroxylicious,
ApiVersionsIntersectFilter). For every API the proxy inspects, the advertised
range is capped to what the pinned kio decodes; other APIs pass untouched.
Produce keeps the broker's minimum (0 on Kafka 4.x, KAFKA-18659): versions
below 3 carry no transactions and no addresses, so they pass opaquely.

Transaction version 2 (KIP-890 part 2) passes through by default: a client that sees
the feature `transaction.version` finalized at 2 or more sends Produce v12+,
TxnOffsetCommit v5+ and EndTxn v5+, no AddPartitionsToTxn, and the broker verifies
(adds) its partitions itself. `hide_transaction_version_2` makes clients fall back to
version 1, where the proxy verifies: the finalized level is shown as at most 1, the
supported range likewise, and the versions only a TV2 client sends are capped.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.schemas import kio_version_range

API_VERSIONS = ApiKey.API_VERSIONS

# api key -> first version the proxy decodes (requests or responses). Versions below
# it are forwarded opaquely, so kio need not know them.
INSPECTED_FROM: dict[int, int] = {
    ApiKey.PRODUCE: 3,                # transactional id and batches from v3, NodeEndpoints from v10
    ApiKey.FETCH: 16,                 # NodeEndpoints from v16
    ApiKey.METADATA: 0,
    ApiKey.FIND_COORDINATOR: 0,
    ApiKey.API_VERSIONS: 0,
    ApiKey.INIT_PRODUCER_ID: 0,
    ApiKey.ADD_PARTITIONS_TO_TXN: 0,
    ApiKey.ADD_OFFSETS_TO_TXN: 0,
    ApiKey.END_TXN: 0,
    ApiKey.TXN_OFFSET_COMMIT: 0,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.SHARE_FETCH: 0,            # NodeEndpoints
    ApiKey.SHARE_ACKNOWLEDGE: 0,      # NodeEndpoints
}


TRANSACTION_VERSION = "transaction.version"  # the KIP-1022 feature (Kafka 4.0+)
LAST_TV1_LEVEL = 1
# The last version a transaction version 1 client sends: the Java client's
# LAST_STABLE_VERSION_BEFORE_TRANSACTION_V2 of ProduceRequest (11), EndTxnRequest (4) and
# TxnOffsetCommitRequest (4). A higher one inside a transaction means TV2 to the broker.
LAST_VERSION_BEFORE_TV2: dict[int, int] = {ApiKey.PRODUCE: 11, ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4}

REWRITE_INTERSECT = "intersect"
REWRITE_HIDE_TV2 = "hide_transaction_version_2"


class UnknownApiKeys(enum.StrEnum):
    """What the proxy does with API keys kio does not know (the `unknown_api_keys` setting)."""

    PASS = "pass"     # forward them opaquely and advertise the broker's range
    STRIP = "strip"   # hide them from ApiVersions


@dataclass(frozen=True)
class VersionPolicy:
    unknown_keys: UnknownApiKeys = UnknownApiKeys.PASS
    max_version: Mapping[int, int] = field(default_factory=dict)  # operator caps per api key
    hidden: frozenset[int] = frozenset()  # api keys never advertised
    hide_transaction_version_2: bool = False  # clients see transaction.version <= 1 and TV1 versions


def advertised_range(api_key: int, broker_min: int, broker_max: int, policy: VersionPolicy) -> tuple[int, int] | None:
    """The range to advertise for one API key, or None to hide the key."""
    if api_key in policy.hidden:
        return None
    lo, hi = broker_min, broker_max
    kio_range = kio_version_range(api_key)
    if kio_range is None:
        if policy.unknown_keys == UnknownApiKeys.STRIP:
            return None
    elif api_key in INSPECTED_FROM:
        kio_lo, kio_hi = kio_range
        hi = min(hi, kio_hi)
        if kio_lo > INSPECTED_FROM[api_key]:
            lo = max(lo, kio_lo)
    if api_key in policy.max_version:
        hi = min(hi, policy.max_version[api_key])
    if policy.hide_transaction_version_2 and api_key in LAST_VERSION_BEFORE_TV2:
        hi = min(hi, LAST_VERSION_BEFORE_TV2[api_key])
    if lo > hi:
        return None
    return lo, hi


def intersect(body: Any, policy: VersionPolicy) -> Any:
    """An ApiVersions response body as clients may see it (same object if unchanged)."""
    return rewrite(body, policy)[0]


def rewrite(body: Any, policy: VersionPolicy) -> tuple[Any, str | None]:
    """The body to send and what changed it: None (nothing: forward the broker's bytes),
    REWRITE_INTERSECT (ranges only) or REWRITE_HIDE_TV2 (the hide option changed something)."""
    if not policy.hide_transaction_version_2:
        new = _intersect(body, policy)
        return new, (None if new is body else REWRITE_INTERSECT)
    plain = _intersect(body, dataclasses.replace(policy, hide_transaction_version_2=False))
    hidden = hide_transaction_version_2(plain)
    if hidden is not plain:
        return hidden, REWRITE_HIDE_TV2
    return plain, (None if plain is body else REWRITE_INTERSECT)


def hide_transaction_version_2(body: Any) -> Any:
    """The body with transaction version 2 out of sight (same object if it showed none).

    The Java client (4.x) decides on the finalized level alone
    (TransactionManager.maybeUpdateTransactionV2Enabled: `transaction.version` >= 2) and then
    caps its own Produce, TxnOffsetCommit and EndTxn versions; the supported range and the
    API caps keep other clients from inferring TV2 from what the broker could do.
    """
    keys = []
    changed = False
    for entry in body.api_keys:
        cap = LAST_VERSION_BEFORE_TV2.get(int(entry.api_key))
        if cap is not None and entry.max_version > cap:
            if entry.min_version > cap:
                changed = True
                continue
            entry = dataclasses.replace(entry, max_version=type(entry.max_version)(cap))
            changed = True
        keys.append(entry)
    supported = tuple(_capped(f, "min_version", "max_version") for f in getattr(body, "supported_features", ()))
    finalized = tuple(_capped(f, "min_version_level", "max_version_level")
                      for f in getattr(body, "finalized_features", ()))
    features_changed = supported != getattr(body, "supported_features", ()) or \
        finalized != getattr(body, "finalized_features", ())
    if not changed and not features_changed:
        return body
    out = dataclasses.replace(body, api_keys=tuple(keys))
    if features_changed:
        out = dataclasses.replace(out, supported_features=supported, finalized_features=finalized)
    return out


def _capped(feature: Any, lo_name: str, hi_name: str) -> Any:
    """A `transaction.version` feature range capped to level 1; any other feature as it is."""
    if feature.name != TRANSACTION_VERSION:
        return feature
    lo, hi = getattr(feature, lo_name), getattr(feature, hi_name)
    if hi <= LAST_TV1_LEVEL:
        return feature
    kind = type(hi)
    return dataclasses.replace(feature, **{lo_name: kind(min(lo, LAST_TV1_LEVEL)), hi_name: kind(LAST_TV1_LEVEL)})


def _intersect(body: Any, policy: VersionPolicy) -> Any:
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

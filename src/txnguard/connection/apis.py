"""What the connection core does with a response, by API key (the keys themselves: codecs/api_keys.py)."""

from __future__ import annotations

import enum

from txnguard.codecs.api_keys import ApiKey

__all__ = ["ACTION_BY_KEY", "ApiKey", "ResponseAction"]


class ResponseAction(enum.Enum):
    """What happens to a response before it goes back to the client."""

    PASS = enum.auto()                  # original bytes, streamed through when it is next in order
    REWRITE_API_VERSIONS = enum.auto()  # intersect with what the proxy can decode
    REWRITE_ADDRESSES = enum.auto()     # broker addresses -> the proxy's listeners
    SASL_HANDSHAKE = enum.auto()        # a v0 success turns the connection into a byte pipe
    SASL_AUTHENTICATE = enum.auto()     # a success lifts the pre-authentication frame limit
    OBSERVE = enum.auto()               # the transaction registry learns from it
    MERGE_PRODUCE = enum.auto()         # the broker's partitions plus the proxy's rejections


# Actions chosen from the API key alone (others depend on the version or on a decision).
ACTION_BY_KEY: dict[int, ResponseAction] = {
    ApiKey.SASL_HANDSHAKE: ResponseAction.SASL_HANDSHAKE,
    ApiKey.SASL_AUTHENTICATE: ResponseAction.SASL_AUTHENTICATE,
    ApiKey.INIT_PRODUCER_ID: ResponseAction.OBSERVE,
    ApiKey.ADD_PARTITIONS_TO_TXN: ResponseAction.OBSERVE,
    ApiKey.ADD_OFFSETS_TO_TXN: ResponseAction.OBSERVE,
    ApiKey.END_TXN: ResponseAction.OBSERVE,
}

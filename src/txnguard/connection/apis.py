"""The Kafka API keys the connection core reads, and what it does with a response."""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    """API keys with a rule in the core; any other key is relayed untouched (and stays an int)."""

    PRODUCE = 0
    FETCH = 1
    METADATA = 3
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    SASL_AUTHENTICATE = 36


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

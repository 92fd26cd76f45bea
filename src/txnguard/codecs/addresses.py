"""Rewrite every broker address a client can learn, so all its connections come back to us.

Clients learn addresses from Metadata, FindCoordinator (single v0-3 and batched
v4+ shapes), DescribeCluster, and the KIP-951 NodeEndpoints in Produce v10+,
Fetch v16+ and ShareFetch/ShareAcknowledge responses. Missing any one of them
lets a client bypass the proxy (grepplabs/kafka-proxy#223, envoy#41222).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError

# node id, broker host, broker port -> the address the client should use instead
AddressMap = Callable[[int, str, int], tuple[str, int]]

METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER
PRODUCE, FETCH = ApiKey.PRODUCE, ApiKey.FETCH

SHARE_FETCH, SHARE_ACKNOWLEDGE = ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE

# The first version of each API whose response can carry a broker address.
ADDRESS_BEARING: dict[int, int] = {
    METADATA: 0,
    FIND_COORDINATOR: 0,
    DESCRIBE_CLUSTER: 0,
    PRODUCE: 10,
    FETCH: 16,
    SHARE_FETCH: 0,
    SHARE_ACKNOWLEDGE: 0,
}


class AddressUnavailable(CodecError):
    """The proxy has no address of its own to give a client for a broker (the gateway could not open that
    broker's listener: its port is taken). Raised by the address callback; the connection closes with this
    reason, since a client sent anywhere else would reach some other service."""

    reason = "broker_listener_unavailable"

_CONTROLLER_ENDPOINTS = 2  # DescribeCluster v1+ EndpointType: 1 brokers, 2 controllers


def carries_addresses(api_key: int, api_version: int) -> bool:
    first = ADDRESS_BEARING.get(api_key)
    return first is not None and api_version >= first


def _moved(entity: Any, node_id: int, mapping: AddressMap) -> Any:
    host, port = mapping(node_id, entity.host, entity.port)
    if host == entity.host and port == entity.port:
        return entity
    return dataclasses.replace(entity, host=host, port=type(entity.port)(port))


def _moved_all(entities: tuple[Any, ...], id_field: str, mapping: AddressMap) -> tuple[Any, ...]:
    return tuple(_moved(e, int(getattr(e, id_field)), mapping) for e in entities)


def rewrite_addresses(api_key: int, body: Any, mapping: AddressMap) -> Any:
    """The response body with every broker address mapped; the same object if nothing changed."""
    if api_key == METADATA:
        new = _moved_all(body.brokers, "node_id", mapping)
        return body if new == body.brokers else dataclasses.replace(body, brokers=new)
    if api_key == FIND_COORDINATOR:
        if hasattr(body, "coordinators"):
            coordinators = tuple(
                c if int(c.node_id) < 0 else _moved(c, int(c.node_id), mapping) for c in body.coordinators
            )
            return body if coordinators == body.coordinators else dataclasses.replace(body, coordinators=coordinators)
        if int(body.node_id) < 0:  # an error answer carries no address
            return body
        return _moved(body, int(body.node_id), mapping)
    if api_key == DESCRIBE_CLUSTER:
        if getattr(body, "endpoint_type", 1) == _CONTROLLER_ENDPOINTS:
            return body
        new = _moved_all(body.brokers, "broker_id", mapping)
        return body if new == body.brokers else dataclasses.replace(body, brokers=new)
    endpoints = getattr(body, "node_endpoints", ())
    if not endpoints:
        return body
    return dataclasses.replace(body, node_endpoints=_moved_all(endpoints, "node_id", mapping))


def broker_addresses(api_key: int, body: Any) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker a response names; used to learn the cluster's layout."""
    if api_key == METADATA:
        return [(int(b.node_id), str(b.host), int(b.port)) for b in body.brokers]
    if api_key == DESCRIBE_CLUSTER and getattr(body, "endpoint_type", 1) != _CONTROLLER_ENDPOINTS:
        return [(int(b.broker_id), str(b.host), int(b.port)) for b in body.brokers]
    if api_key == FIND_COORDINATOR:
        found = body.coordinators if hasattr(body, "coordinators") else (body,)
        return [(int(c.node_id), str(c.host), int(c.port)) for c in found if int(c.node_id) >= 0]
    return [(int(e.node_id), str(e.host), int(e.port)) for e in getattr(body, "node_endpoints", ())]

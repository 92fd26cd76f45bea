"""What the core-only benchmarks (no sockets, no Kafka) hand a `Connection` in place of the proxy's shell.

`DirectCluster` is the cluster view of a proxy that rewrites nothing: brokers keep their own addresses and
no ApiVersions are learned or advertised, so the core's cost is measured alone.
"""
from __future__ import annotations

from typing import Any

from txnguard.codecs.api_versions import VersionPolicy


class DirectCluster:
    version_policy = VersionPolicy()

    def client_address_for(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return host, port

    def learn_brokers(self, found: Any) -> None:
        pass

    def remember_broker_api_versions(self, body: Any) -> None:
        pass

    def advertised_api_versions(self) -> list[tuple[int, int, int]]:
        return []

"""Each broker's ApiVersions, as the proxy's own connections learn them: said once per broker and answer.

A log line (`broker_lacks_apis`) when a broker's answer lacks an API the proxy's evidence needs (and
again only when that answer changes: a broker rolled to another version), a gauge per (broker, API)
and a line in /readyz's body. The proxy stays ready: it still decides, from the evidence it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txnguard.proxy import logs
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.capabilities import EVIDENCE_APIS, Lack, lacking, summary


class BrokerCapabilities:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        self._lacks: dict[str, tuple[Lack, ...]] = {}
        self.log = logs.get(component="capabilities")

    def learned(self, address: Any, ranges: Mapping[int, tuple[int, int]]) -> None:
        """A connection to `address` read the broker's ApiVersions."""
        key = str(address)
        lacks = lacking(ranges)
        if self._lacks.get(key) == lacks:
            return
        before = self._lacks.get(key)
        self._lacks[key] = lacks
        for lack in EVIDENCE_APIS:
            self.metrics.broker_api_missing.labels(key, lack.api).set(1 if lack in lacks else 0)
        if lacks:
            self.log.warning("broker_lacks_apis", broker=key, lacks=[lack.api for lack in lacks],
                             needed_for=[lack.needed_for for lack in lacks],
                             falls_back_to=[lack.falls_back_to for lack in lacks],
                             reason="not in the broker's ApiVersions (Kafka before 3.0 has no DescribeTransactions "
                                    "or ListTransactions): never sent to it")
        elif before:
            self.log.info("broker_lacks_apis_no_more", broker=key, lacked=[lack.api for lack in before])

    def lacks(self, address: Any, api_key: int) -> bool:
        return any(lack.api_key == api_key for lack in self._lacks.get(str(address), ()))

    def detail(self) -> str | None:
        """For /readyz's body: the brokers that lack something, or None."""
        parts = [summary(a, lacks) for a, lacks in sorted(self._lacks.items()) if lacks]
        return "; ".join(parts) if parts else None

"""Each broker's ApiVersions, as the proxy's own connections learn them: said once per broker and answer.

A log line (`broker_lacks_apis`) when a broker's answer lacks an API the proxy's evidence needs (and
again only when that answer changes: a broker rolled to another version), a gauge per (broker, API)
and a line in /readyz's body. Whether that makes the proxy unready is the pure core's decision
(verification/capabilities.py `readiness`): an enforcing sidecar whose broker lacks DescribeTransactions
is not; a gateway or a monitoring proxy stays ready and says what it cannot verify. The proxy reads its
brokers at start and as Metadata names them (server.py), so this is known before the first client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from txnguard.proxy import logs
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.capabilities import (
    EVIDENCE_APIS,
    BrokerApis,
    Lack,
    NotReady,
    Readiness,
    lacking,
    readiness,
)


class BrokerCapabilities:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        self._lacks: dict[str, tuple[Lack, ...]] = {}
        self._unread: dict[str, str | None] = {}   # brokers being read, and why the last attempt failed
        self._own: frozenset[str] = frozenset()
        self._sidecar = False
        self._enforcing: Callable[[], bool] = lambda: True
        self._log_evidence: Callable[[], bool] = lambda: False
        self._blocked: tuple[NotReady, ...] = ()     # what the log last said keeps the proxy unready
        self.log = logs.get(component="capabilities")

    def watch(self, own: Iterable[Any], *, sidecar: bool, enforcing: Callable[[], bool],
              log_evidence: Callable[[], bool] | None = None) -> None:
        """What readiness depends on: the proxy's own brokers (`upstream`), its mode and whether it may refuse
        (read again at every decision: SIGHUP swaps the policy, then calls `reconsider`), and whether the
        coordinator's log gives evidence now (the follower calls `reconsider` when that changes)."""
        self._own = frozenset(str(a) for a in own)
        self._sidecar = sidecar
        self._enforcing = enforcing
        if log_evidence is not None:
            self._log_evidence = log_evidence
        for address in self._own:
            self.expect(address)

    def expect(self, address: Any) -> None:
        """A broker the proxy is about to read: unknown until `learned`, not forgotten."""
        key = str(address)
        if key not in self._lacks:
            self._unread.setdefault(key, None)

    def unread(self, address: Any, error: str) -> None:
        """Reading `address`'s ApiVersions failed (it is retried): said once per broker until it is read."""
        key = str(address)
        if key in self._lacks:
            return  # read before: what it lacked still stands (its connections re-read it)
        first = self._unread.get(key) is None
        self._unread[key] = error
        if first:
            self.log.warning("broker_api_versions_unread", broker=key, error=error, own=key in self._own,
                             reason="cannot read the broker's ApiVersions: what it lacks is unknown; retrying "
                                    "with backoff")
        self.reconsider()

    def learned(self, address: Any, ranges: Mapping[int, tuple[int, int]]) -> None:
        """A connection to `address` read the broker's ApiVersions."""
        key = str(address)
        self._unread.pop(key, None)
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
        self.reconsider()

    def lacks(self, address: Any, api_key: int) -> bool:
        return any(lack.api_key == api_key for lack in self._lacks.get(str(address), ()))

    def readiness(self) -> Readiness:
        brokers = [BrokerApis(a, lacks, a in self._own) for a, lacks in self._lacks.items()]
        brokers += [BrokerApis(a, None, a in self._own, error) for a, error in self._unread.items()]
        return readiness(brokers, sidecar=self._sidecar, enforcing=self._enforcing(),
                         log_evidence=self._log_evidence())

    def reconsider(self) -> None:
        """Log each reason that newly keeps the proxy unready, at the moment it does (not when /readyz is
        next polled): at start, before any client, an operator reads why in the log."""
        blocked = self.readiness().blocked
        for n in blocked:
            if n not in self._blocked:
                self.log.warning("proxy_not_ready", reason=n.text, not_ready=n.reason, broker=n.broker, api=n.api)
        if self._blocked and not blocked:
            self.log.info("proxy_ready_again", was=[n.reason for n in self._blocked])
        self._blocked = blocked

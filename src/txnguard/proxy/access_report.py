"""What the proxy's own principal was refused lately: a warning naming the ACL, a metric, and /readyz.

The verifier reports each refusal here (txnguard.verification.access says which right it names) and
each success that proves a right is back. /readyz is not ready while an essential right was refused
within `window_s` and not proved since: a load balancer then prefers a proxy that can verify.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from txnguard.proxy import logs
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.access import MissingAcl

Key = tuple[str, str, str]
WARN_EVERY_S = 30.0


class AccessMonitor:
    def __init__(self, metrics: ProxyMetrics, principal: str, *, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.principal = principal
        self.window_s = window_s
        self.clock = clock
        self._refused: dict[Key, tuple[MissingAcl, float]] = {}
        self._warned: dict[Key, float] = {}
        self.log = logs.get(component="access")

    def refused(self, missing: MissingAcl) -> None:
        now = self.clock()
        self.metrics.child(self.metrics.authorization_failures, missing.api, missing.operation,
                           missing.resource_type).inc()
        self._refused[missing.key] = (missing, now)
        if now - self._warned.get(missing.key, -WARN_EVERY_S) >= WARN_EVERY_S:  # one line per right per 30 s
            self._warned[missing.key] = now
            self.log.warning(
                "proxy_not_authorized", principal=self.principal, operation=missing.operation,
                resource_type=missing.resource_type, resource_name=missing.name, api=missing.api,
                error=missing.error, fails_closed=missing.essential, reason=missing.sentence(self.principal),
                fix=_fix(missing, self.principal))

    def proved(self, *keys: Key) -> None:
        """A request that needed these rights succeeded: they are back (or were never missing)."""
        for key in keys:
            if self._refused.pop(key, None) is not None:
                self._warned.pop(key, None)
                self.log.info("proxy_authorized_again", principal=self.principal, operation=key[0],
                              resource_type=key[1], resource_name=key[2])

    def not_ready(self) -> str | None:
        """Why the proxy cannot verify now, or None."""
        now = self.clock()
        for key, (_, seen) in list(self._refused.items()):
            if now - seen > self.window_s:
                del self._refused[key]
        essential = [m for m, _ in self._refused.values() if m.essential]
        if not essential:
            return None
        return "verification fails closed: " + "; ".join(m.sentence(self.principal) for m in essential[:3]) + (
            f" (and {len(essential) - 3} more)" if len(essential) > 3 else "")


def _fix(missing: MissingAcl, principal: str) -> str:
    if missing.resource_type == "SASL":
        return "check upstream_auth (username, password, mechanism) against the broker's SCRAM credentials"
    resource = {"TransactionalId": "--transactional-id", "Topic": "--topic", "Cluster": "--cluster"}[
        missing.resource_type]
    name = "" if missing.resource_type == "Cluster" else f" {missing.name}"
    return (f"kafka-acls.sh --add --allow-principal {principal} --operation {missing.operation.title()} "
            f"{resource}{name}")

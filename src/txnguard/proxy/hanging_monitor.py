"""The proxy's periodic hanging-transaction scan (`health.hanging_scan_interval_s`, off by default).

Each scan is proxy/hanging_io.py's `scan` on the proxy's own connections; this module turns its findings
into the gauges, a log line per new and per resolved finding, and one audit record per new finding.
It finds; it never aborts. A sidecar's scan covers the partitions its broker leads (proxy/hanging_io.py), so each
finding is reported once across the sidecars. On brokers without ListTransactions (Kafka 2.8) the scan judges from
the coordinator's log: the proxy's running follower's, each partition it reads read to its end once DescribeProducers
answered (no second reading of the whole log each scan); without a follower, a one-shot read. The server starts it
and hands it the follower; it knows nothing else of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from txnguard.proxy import hanging_io, logs
from txnguard.proxy.config import ProxyMode
from txnguard.verification.audit import hanging_record
from txnguard.verification.hanging import Finding, FindingTracker, MaxTimeout, OwnTimeout, Rule

if TYPE_CHECKING:
    from txnguard.proxy.config import ProxyConfig
    from txnguard.proxy.guard import AuditLog
    from txnguard.proxy.log_follower import LogFollower
    from txnguard.proxy.metrics import ProxyMetrics


class HangingMonitor:
    """The proxy's periodic scan (`health.hanging_scan_interval_s`)."""

    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics, audit: AuditLog, ssl_context: Any = None,
                 follower: LogFollower | None = None) -> None:
        h = config.health
        assert h.hanging_scan_interval_s is not None
        self.interval_s = h.hanging_scan_interval_s
        self.rule = rule_of(h.hanging_max_transaction_timeout_s, h.hanging_timeout_margin_s)
        self.scope = hanging_io.Scope(local_broker=config.mode is ProxyMode.SIDECAR)
        self.admin = hanging_io.ClusterAdmin(config.upstream, ssl_context=ssl_context,
                                          timeout_s=config.verification.timeout_s, auth=config.upstream_auth)
        self.metrics = metrics
        self.audit = audit
        self.tracker = FindingTracker()
        self.log = logs.get(component="hanging")
        self.scans = 0
        self.last: hanging_io.ScanResult | None = None
        self.follower = follower
        self._log_problem: str | None = None  # the last reason the log could not confirm, logged once

    async def _transaction_log(self) -> hanging_io.LogRead:
        """The follower's view, read to the log's end as of now (after this scan's DescribeProducers answered). A
        proxy just started waits for its follower's first read (bounded), so that its first scan does not report
        unconfirmed what the log would confirm or clear."""
        follower = self.follower
        assert follower is not None
        deadline = time.monotonic() + self.admin.timeout_s
        while not (follower.caught_up_once or follower.denied) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return await hanging_io.read_from_follower(follower, self.admin.timeout_s)

    async def run(self) -> None:
        try:
            while True:
                await self.scan_once()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.admin.close()

    async def scan_once(self) -> hanging_io.ScanResult | None:
        m = self.metrics
        try:
            result = await hanging_io.scan(self.admin, self.scope, self.rule, transaction_log=(
                self._transaction_log if self.follower is not None else None))
        except Exception as e:  # noqa: BLE001 - whatever failed, the next scan runs (and the proxy never notices)
            m.hanging_scans.labels("failed").inc()
            problem = str(e) if isinstance(e, hanging_io.HangingScanError) else repr(e)
            self.log.warning("hanging_scan_failed", error=problem)
            await self.admin.close()  # a fresh start next time
            return None
        self.scans += 1
        self.last = result
        m.hanging_scans.labels("ok").inc()
        before = self.tracker.per_partition()
        new, gone = self.tracker.update(result.findings)
        after = self.tracker.per_partition()
        for (topic, partition), n in after.items():
            m.hanging_transactions.labels(topic, str(partition)).set(n)
        for topic, partition in before.keys() - after.keys():
            with contextlib.suppress(KeyError):
                m.hanging_transactions.remove(topic, str(partition))
        m.oldest_open_transaction_age.set((result.oldest_open_age_ms or 0) / 1000)
        for f in new:
            self.log.warning("hanging_transaction_found", **_facts(f, result.now_ms))
            self.audit.write(hanging_record(time_ms=result.now_ms, proxy_id=self.audit.proxy_id, finding=f))
        for f in gone:
            self.log.info("hanging_transaction_resolved", **_facts(f, result.now_ms))
        log_problem = result.transaction_log if result.transaction_log != "read" else None
        if log_problem is not None and log_problem != self._log_problem:
            self.log.warning("hanging_scan_unconfirmed", detail="the coordinator's log could not confirm findings",
                             problem=log_problem)
        self._log_problem = log_problem
        if result.errors:
            self.log.warning("hanging_scan_partial", failed_partitions=len(result.errors),
                             example=next(iter(result.errors.items())))
        return result


def _facts(f: Finding, now: int) -> dict[str, Any]:
    return {"topic": f.topic, "partition": f.partition, "producer_id": f.producer_id,
            "producer_epoch": f.producer_epoch, "coordinator_epoch": f.coordinator_epoch,
            "start_offset": f.start_offset, "last_timestamp_ms": f.last_timestamp_ms,
            "age_s": round((now - f.last_timestamp_ms) / 1000, 1), "transactional_id": f.transactional_id,
            "reason": f.reason, "confirmed": f.confirmed,  # unconfirmed: check before aborting (docs)
            "coordinator_state": f.coordinator_state, "threshold_ms": f.threshold_ms,
            "transaction_timeout_ms": f.transaction_timeout_ms}


def rule_of(max_transaction_timeout_s: float | None, margin_s: float) -> Rule:
    """The configured rule: find-hanging's one threshold when set, else each transaction's own timeout."""
    if max_transaction_timeout_s is not None:
        return MaxTimeout(int(max_transaction_timeout_s * 1000))
    return OwnTimeout(margin_ms=int(margin_s * 1000))


def attach(config: ProxyConfig, metrics: ProxyMetrics, audit: AuditLog, ssl_context: Any,
           follower: LogFollower | None = None) -> HangingMonitor | None:
    """The monitor when `health.hanging_scan_interval_s` is set (off by default); `follower`: the proxy's own."""
    if config.health.hanging_scan_interval_s is None:
        return None
    return HangingMonitor(config, metrics, audit, ssl_context, follower)


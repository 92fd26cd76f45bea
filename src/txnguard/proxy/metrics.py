"""Prometheus metrics of one proxy instance (its own registry, so tests can run several).

Per-frame traffic (frames, bytes, upstream round trips) is counted in plain ints by
the connection cores and exported at scrape time (traffic_metrics.py); labelled
children on the per-request path are looked up once (`child`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from txnguard.connection.traffic import make_traffic
from txnguard.policies.outcomes import Outcome
from txnguard.proxy.traffic_metrics import PlainCounter, PlainHistogram, TrafficCollector
from txnguard.verification.access import known_rights

CLIENT_TO_BROKER = "client_to_broker"
# KIP-511's rule for ClientSoftwareName/Version (the broker refuses others), and a length of our own.
_KIP_511 = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]{0,62}[a-zA-Z0-9])?")
MAX_SOFTWARE_SERIES = 200
BROKER_TO_CLIENT = "broker_to_client"


class BeforeCollect(Collector):
    """Runs its callbacks whenever the registry is read, before any metric is: registered first, so every
    reader (a /metrics scrape, `get_sample_value`, a test's `collect()`) sees what was recorded later than
    it happened (the relay's ledger, recorded in batches: proxy/guard.py) as already recorded. Exports nothing."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def collect(self) -> Iterator[Metric]:
        for callback in self.callbacks:
            callback()
        yield from ()


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds...: what sizing watches.
        ProcessCollector(registry=r)
        self.before_collect = BeforeCollect()  # the first collector: it runs before every other one
        r.register(self.before_collect)
        self.connections_active = Gauge(
            "txnguard_connections_active", "Client connections open now", ["listener"], registry=r)
        self.connections_total = Counter(
            "txnguard_connections", "Client connections accepted", ["listener"], registry=r)
        self.connection_closes = Counter(
            "txnguard_connection_closes", "Client connections closed, by reason", ["reason"], registry=r)
        self.frame_errors = Counter(
            "txnguard_frame_errors", "Frames refused (bad length, too large, undecodable), by reason",
            ["reason", "direction"], registry=r)
        self.paused_seconds = Counter(
            "txnguard_backpressure_paused_seconds", "Time a side's reading was paused by backpressure",
            ["side"], registry=r)
        self.rewrites = Counter(
            "txnguard_response_rewrites", "Responses re-encoded by the proxy, per API and kind",
            ["api", "kind"], registry=r)
        self.local_responses = Counter(
            "txnguard_local_responses", "Responses the proxy answered itself, per API and reason",
            ["api", "reason"], registry=r)
        self.upstream_connect_failures = Counter(
            "txnguard_upstream_connect_failures", "Failed connections to brokers", ["broker"], registry=r)
        self.listeners = Gauge(
            "txnguard_listeners", "Listeners open (bootstrap plus one per broker in gateway mode)", registry=r)
        self.metadata_age = Gauge(
            "txnguard_metadata_age_seconds", "Seconds since the proxy's own Metadata request last succeeded "
            "(since the proxy started, while none has)", registry=r)
        self.ready = Gauge(
            "txnguard_ready", "1 while /readyz answers 200, else 0 (its body says why: no or stale metadata, "
            "the proxy's own principal lacking a right, a broker's APIs, draining)", registry=r)
        self.native_data_path = Gauge(
            "txnguard_native_data_path", "1 when the relay reads frames in place with the native data path "
            "(txnguard._native), 0 when this install lacks it and the general path takes every frame (correct, "
            "slower; the start's log line native_data_path_missing says why)", registry=r)
        # Each reason /readyz answers 503 for, as a label: an alert or a dashboard says which (proxy/server.py).
        self.not_ready = Gauge(
            "txnguard_not_ready", "1 while this reason keeps /readyz at 503, else 0: draining, not_authorized "
            "(the proxy's own principal), no_metadata, stale_metadata, broker_api_versions_unread (a broker's "
            "ApiVersions not read yet), broker_lacks_api (an enforcing sidecar's broker lacks DescribeTransactions)",
            ["reason"], registry=r)
        # KIP-890's VerificationTimeMs and VerificationFailureRate, Prometheus-style.
        # The three histograms observed per verified write are counted in plain values (traffic_metrics.py).
        self.verification_time = PlainHistogram(
            "txnguard_verification_time_ms", "VerificationTimeMs: start of a verification (the request "
            "parsed) to its decision, coordinator round trips included, by evidence path", ["evidence"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 10000,
                     30000),
            registry=r)
        # A check held while the coordinator cannot answer (verification/hold_limits.py), as the broker holds.
        self.verification_holds = Gauge(
            "txnguard_verification_holds", "Checks held now, waiting for a coordinator that could not answer yet",
            registry=r)
        self.verification_hold_endings = Counter(
            "txnguard_verification_hold_endings", "Held checks by how the hold ended: decided (the coordinator "
            "answered within the hold) or timeout (answered retriable at the request's own bound)", ["ending"],
            registry=r)
        for ending in ("decided", "timeout"):
            self.verification_hold_endings.labels(ending)
        # CONCURRENT_TRANSACTIONS asked again by the proxy (verification/concurrent.py, the KIP-609 idea).
        # Counted per absorption, on the connections' path: plain ints, read at scrape time.
        self.concurrent_absorptions = PlainCounter(
            "txnguard_concurrent_transactions_absorptions", "AddPartitionsToTxn/AddOffsetsToTxn answered "
            "CONCURRENT_TRANSACTIONS, by API and ending: absorbed (asked again, the client got another answer), "
            "budget_spent (the client got CONCURRENT_TRANSACTIONS after all) or behind_another (passed to the "
            "client at once: another request of its connection was being asked again)", ["api", "ending"], r)
        self.concurrent_woken = PlainCounter(
            "txnguard_concurrent_transactions_woken", "Requests asked again after CONCURRENT_TRANSACTIONS before their "
            "pause ran out, because the coordinator's log (the follower) showed the previous transaction ended",
            [], r)
        self.concurrent_woken.labels()
        self.concurrent_retries = PlainCounter(
            "txnguard_concurrent_transactions_retries", "Requests the proxy sent again after "
            "CONCURRENT_TRANSACTIONS, by API", ["api"], r)
        for api in ("add_partitions_to_txn", "add_offsets_to_txn"):
            self.concurrent_retries.labels(api)
            for ending in ("absorbed", "budget_spent", "behind_another"):
                self.concurrent_absorptions.labels(api, ending)
        # The KAFKA-17754 defence (verification/in_doubt.py): EndTxns forwarded and not yet answered, the
        # requests held behind them, and how each ended.
        self.end_txn_in_doubt = Gauge(
            "txnguard_end_txn_in_doubt", "EndTxn requests forwarded and not answered yet (they may still land)",
            registry=r)
        self.end_txn_in_doubt_endings = PlainCounter(  # one per transaction of the cluster: plain ints
            "txnguard_end_txn_in_doubt_endings", "EndTxn requests by how their doubt ended: answered, fenced (the "
            "producer moved on), closed (its connection closed and the coordinator answered a later request) or "
            "expired (unanswered past end_txn_in_doubt_max_ms: no longer held for)",
            ["ending"], r)
        for ending in ("answered", "fenced", "closed", "expired"):
            self.end_txn_in_doubt_endings.labels(ending)
        self.end_txn_holds = Gauge(
            "txnguard_end_txn_holds", "AddPartitionsToTxn/AddOffsetsToTxn held now while an EndTxn of the same "
            "producer is in doubt", registry=r)
        self.end_txn_hold_endings = Counter(
            "txnguard_end_txn_hold_endings", "Requests held for an EndTxn in doubt, by how the hold ended: settled "
            "(answered or fenced: forwarded) or timeout (answered CONCURRENT_TRANSACTIONS at the request's bound)",
            ["ending"], registry=r)
        for ending in ("settled", "timeout"):
            self.end_txn_hold_endings.labels(ending)
        self.end_txn_lingers = Counter(
            "txnguard_end_txn_lingers", "Client connections that closed with an EndTxn unanswered: the broker side "
            "kept until the answer (answered), end_txn_in_doubt_max_ms (timeout) or the broker closed it "
            "(upstream_closed)", ["ending"], registry=r)
        for ending in ("answered", "timeout", "upstream_closed"):
            self.end_txn_lingers.labels(ending)
        # Kafka starts VerificationTimeMs once the request is parsed; the proxy's parsing is shown apart.
        self.inspection_time = PlainHistogram(
            "txnguard_inspection_time_ms", "Decoding a request the guard checks (before its verification "
            "starts), by API", ["api"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.verification_failures = Counter(
            "txnguard_verification_failures", "VerificationFailureRate (use rate()): failed partition "
            "verifications by reason", ["reason"], registry=r)
        # Every reason exported at 0 from the start: a series born at 1 is invisible to rate() and increase(),
        # so a dashboard would miss each reason's first rejection.
        for failed in Outcome:
            if failed.failed:
                self.verification_failures.labels(failed.value)
        self.verifications = Counter(
            "txnguard_verifications", "Partition verifications by evidence, outcome and what happened to the write",
            ["evidence", "outcome", "decision"], registry=r)
        self.coordinator_requests = Counter(
            "txnguard_coordinator_requests", "The proxy's own verification requests, by API", ["api"], registry=r)
        self.coordinator_batch = Histogram(
            "txnguard_coordinator_batch_size", "Questions batched into one verification request", ["api"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.error_rewrites = Counter(
            "txnguard_error_rewrites", "Errors the proxy sent instead of a broker answer",
            ["api", "from_error", "to_error", "client_family"], registry=r)
        self.verification_window = PlainHistogram(
            "txnguard_verification_window_ms", "Check-to-append window: from the evidence in hand to the "
            "broker's answer to the verified write (an upper bound of when it was appended), by evidence",
            ["evidence"], buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000), registry=r)
        self.registry_size = Gauge(
            "txnguard_registry_transactional_ids", "Transactional ids in the transaction registry", registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # KIP-511: who connects, live (the broker's socket-server metric clientSoftwareName/Version).
        self.client_software = Gauge(
            "txnguard_client_connections", "Client connections open now, by the KIP-511 software name and "
            "version the client sent in ApiVersions (v3+) and its client family", ["software_name",
                                                                                  "software_version", "family"],
            registry=r)
        self._software_open: dict[tuple[str, str, str], int] = {}
        # Every session's frame counts and round trips, in plain ints; exported at scrape time.
        self.traffic = make_traffic()
        r.register(TrafficCollector(self.traffic))
        self.audit_records = Counter(
            "txnguard_audit_records", "Audit records for the audit topic, by outcome: published, dropped (queue "
            "full, or unsent at stop), failed (Kafka refused it or it timed out)", ["outcome"], registry=r)
        for outcome in ("published", "dropped", "failed"):
            self.audit_records.labels(outcome)  # exported at 0 from the start, so rate() and alerts see them
        self.audit_queue_depth = Gauge(
            "txnguard_audit_queue_depth", "Audit records waiting in the publisher's queue for the audit topic",
            registry=r)
        # Hanging transactions (health.hanging_scan_interval_s; proxy/hanging_monitor.py), judged as find-hanging.
        self.hanging_transactions = Gauge(
            "txnguard_hanging_transactions", "Hanging transactions found by the last scan, per partition (a series "
            "exists while the partition has one)", ["topic", "partition"], registry=r)
        self.oldest_open_transaction_age = Gauge(
            "txnguard_oldest_open_transaction_age_seconds", "Age of the oldest open transaction the last scan saw on "
            "any partition, from its producer's last write there (as find-hanging measures it); 0: none open",
            registry=r)
        self.hanging_scans = Counter(
            "txnguard_hanging_scans", "Hanging-transaction scans, by outcome (ok, failed)", ["outcome"], registry=r)
        for outcome in ("ok", "failed"):
            self.hanging_scans.labels(outcome)

        # Each broker's ApiVersions, as the proxy's own connections read them (proxy/capability_report.py).
        self.broker_api_missing = Gauge(
            "txnguard_broker_api_missing", "1 when the broker's ApiVersions does not list an API the proxy's "
            "evidence needs (DescribeTransactions, ListTransactions: Kafka < 3.0), else 0; never sent to it",
            ["broker", "api"], registry=r)

        # The follower of the coordinator's log, __transaction_state (proxy/log_follower.py).
        self.log_follower_lag_records = Gauge(
            "txnguard_transaction_log_lag_records", "Records of __transaction_state appended and not read yet by the "
            "proxy's follower (high watermark minus position, summed over partitions)", registry=r)
        self.log_follower_lag_seconds = Gauge(
            "txnguard_transaction_log_lag_seconds", "Seconds since every partition of __transaction_state was last "
            "read up to its high watermark; -1 until the follower caught up once", registry=r)
        self.log_follower_idle = Gauge(
            "txnguard_transaction_log_idle", "1 while the follower of __transaction_state is idle (no write asked the "
            "log for verification.transaction_log_idle_after_s: it reads the log every transaction_log_idle_read_s "
            "instead of long-polling), else 0", registry=r)
        self.log_follower_ids = Gauge(
            "txnguard_transaction_log_transactional_ids", "Transactional ids the follower holds the latest state of",
            registry=r)
        # Clients that bypass the proxy (verification/bypass.py): computed at scrape time from the view.
        self.log_follower_unseen = Gauge(
            "txnguard_transaction_log_unseen_transactional_ids", "Transactional ids active in __transaction_state "
            "(not Dead, a record within the last 24 h) that this proxy never saw in a request since it started: "
            "clients that reach the brokers another way. Meaningful for a single gateway only (sidecars and replicas "
            "each see a share of the clients: there the fleet report's table counts)", registry=r)
        self.log_follower_records = PlainCounter(
            "txnguard_transaction_log_records", "Records of __transaction_state read, by what they did: state, "
            "tombstone, unknown_version or malformed (the id is then asked of the coordinator)", ["outcome"], r)
        self.log_follower_records.labels("state")  # the rest appear with their first record
        self.log_follower_fetches = PlainCounter(
            "txnguard_transaction_log_fetches", "Fetch requests the follower of __transaction_state sent: its long "
            "polls (one answer each, carrying every record appended meanwhile) and its reads to the end; its CPU "
            "goes mostly per Fetch, so this rate, not the cluster's transaction rate, sizes it", [], r)

        # The proxy's own principal refused by Kafka (proxy/access_report.py): each names one missing ACL.
        self.authorization_failures = Counter(
            "txnguard_verification_authorization_failures", "The proxy's own verification requests refused by "
            "Kafka's authorizer or SASL, by API and the right they name (operation, resource type)",
            ["api", "operation", "resource_type"], registry=r)
        for api, operation, resource_type in known_rights():
            self.authorization_failures.labels(api, operation, resource_type)

    def client_software_opened(self, name: str, version: str, family: str) -> tuple[str, str, str]:
        """Count one open connection under its KIP-511 software name and version (Kafka's brokers export
        the same count); returns the labels to pass to `client_software_closed`. The names come from the
        client before the broker has judged them: only KIP-511's own pattern is kept as it is, and past
        MAX_SOFTWARE_SERIES live series the rest are counted as "other", so a client cannot grow the
        proxy's memory or the scrape by inventing names."""
        labels = (name, version, family)
        if not (_KIP_511.fullmatch(name) and _KIP_511.fullmatch(version)):
            labels = ("invalid", "invalid", family)
        elif labels not in self._software_open and len(self._software_open) >= MAX_SOFTWARE_SERIES:
            labels = ("other", "other", family)
        self._software_open[labels] = self._software_open.get(labels, 0) + 1
        self.client_software.labels(*labels).inc()
        return labels

    def client_software_closed(self, labels: tuple[str, str, str]) -> None:
        left = self._software_open.get(labels, 0) - 1
        if left > 0:
            self._software_open[labels] = left
            self.client_software.labels(*labels).dec()
        else:  # the last one: the series goes, so the live set (and MAX_SOFTWARE_SERIES) counts open ones
            self._software_open.pop(labels, None)
            with contextlib.suppress(KeyError):
                self.client_software.remove(*labels)

    def child(self, metric: Counter | Histogram | PlainHistogram, *values: str) -> Any:
        """metric.labels(*values), looked up once: labels() costs microseconds on the per-request path."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

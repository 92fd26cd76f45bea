"""Grafana dashboards as code: `python grafana/dashboards.py` writes grafana/<uid>.json.

One source for every dashboard, so panels share their selectors, units and variables. The JSON files are
committed (operators import them as they are); tests/unit/test_grafana_dashboards.py checks that they equal
what this file generates, and tests/integration/test_dashboards.py evaluates every query on a real
Prometheus scraping a real proxy. Metric names: src/txnguard/proxy/metrics.py, traffic_metrics.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Every query is narrowed by the two variables; `cluster` is a target label the operator's scrape config sets.
SEL = 'cluster=~"$cluster", instance=~"$instance"'
RATE = "$__rate_interval"
TXN_APIS = "init_producer_id|add_partitions_to_txn|add_offsets_to_txn|end_txn|txn_offset_commit"
# The proxy exports every reason at 0 from its start; older proxies created a reason's series at its first
# rejection, already at 1, which increase() cannot see: a series new within the window counts whole.
PREVENTED = f'txnguard_verification_failures_total{{{SEL}, reason=~"not_in_transaction|late_write"}}'


def q(expr: str, legend: str) -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend}


def rate(metric: str, by: str, extra: str = "") -> str:
    selector = SEL + (f", {extra}" if extra else "")
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}]))"


def quantile(p: float, metric: str, by: str, extra: str = "") -> str:
    selector = SEL + (f", {extra}" if extra else "")
    return f"histogram_quantile({p}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RATE}])))"


def panel(title: str, description: str, targets: list[dict[str, Any]], unit: str = "short",
          kind: str = "timeseries") -> dict[str, Any]:
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "targets": targets}


def text(title: str, content: str) -> dict[str, Any]:
    return {"type": "text", "title": title, "options": {"mode": "markdown", "content": content}}


def variables() -> list[dict[str, Any]]:
    def query_var(name: str, query: str) -> dict[str, Any]:
        return {"name": name, "label": name, "type": "query", "datasource": DATASOURCE,
                "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
                "includeAll": True, "allValue": ".*", "multi": True, "sort": 1,
                "current": {"text": "All", "value": "$__all"}}

    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}},
        query_var("cluster", "label_values(txnguard_listeners, cluster)"),
        query_var("instance", 'label_values(txnguard_listeners{cluster=~"$cluster"}, instance)'),
    ]


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]]) -> dict[str, Any]:
    laid_out = []
    for i, p in enumerate(panels):  # two panels a row, in the order given
        laid_out.append({"id": i + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}, **p})
    return {
        "uid": uid, "title": title, "description": description, "tags": ["txnguard", "kafka"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s", "timezone": "utc",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables()},
        "links": [{"title": "txnguard", "type": "dashboards", "tags": ["txnguard"], "asDropdown": True}],
        "panels": laid_out,
    }


def overview() -> dict[str, Any]:
    return dashboard("txnguard-overview", "txnguard / overview", "Traffic, connections, errors, readiness", [
        panel("Ready", "Scraped (up), /readyz as a number (1 ready, 0 not: no or stale metadata, its own "
              "principal lacking a right, draining) and the age of the proxy's own last successful Metadata "
              "request (/readyz fails above ready_max_metadata_age_s)", [
                  q(f"min by (instance) (up{{{SEL}}})", "up {{instance}}"),
                  q(f"max by (instance) (txnguard_metadata_age_seconds{{{SEL}}})", "metadata age {{instance}}"),
                  q(f"min by (instance) (txnguard_ready{{{SEL}}})", "ready {{instance}}")]),
        panel("Connections open", "Client connections open now, per listener", [
            q(f"sum by (instance, listener) (txnguard_connections_active{{{SEL}}})", "{{instance}} {{listener}}")]),
        panel("Requests / s by API", "Client requests forwarded or answered", [
            q(rate("txnguard_frames_total", "api", 'direction="client_to_broker"'), "{{api}}")], "reqps"),
        panel("Bytes / s", "Kafka frames through the proxy, per direction", [
            q(rate("txnguard_bytes_total", "direction"), "{{direction}}")], "Bps"),
        panel("Broker round trip p99 by API", "From forwarding a request to the broker's response", [
            q(quantile(0.99, "txnguard_upstream_rtt_seconds", "api"), "{{api}}")], "s"),
        panel("Connections accepted and closed / s", "Every close has a reason (client_closed, idle, draining, "
              "upstream_unreachable, frame_too_large, ...)", [
                  q(rate("txnguard_connections_total", "listener"), "accepted {{listener}}"),
                  q(rate("txnguard_connection_closes_total", "reason"), "closed: {{reason}}")], "cps"),
        panel("Errors sent instead of a broker answer / s", "Verification rejections and other rewritten errors", [
            q(rate("txnguard_error_rewrites_total", "api, to_error"), "{{api}} {{to_error}}")], "ops"),
        panel("Frames refused / s", "Bad length, too large, undecodable: a broken or hostile client", [
            q(rate("txnguard_frame_errors_total", "reason, direction"), "{{reason}} {{direction}}")], "ops"),
        panel("Listeners open", "Bootstrap plus one per broker (gateway)", [
            q(f"sum by (instance) (txnguard_listeners{{{SEL}}})", "{{instance}}")]),
        panel("Backpressure: reading paused", "Share of time a side's reading was paused (the other side's write "
              "buffer above its high water mark)", [
                  q(rate("txnguard_backpressure_paused_seconds_total", "side"), "{{side}}")], "percentunit"),
        panel("Audit records / s", "Records for the audit topic by outcome; dropped or failed means gaps in the "
              "fleet report", [q(rate("txnguard_audit_records_total", "outcome"), "{{outcome}}"),
                               q(f"sum by (instance) (txnguard_audit_queue_depth{{{SEL}}})", "queued {{instance}}")]),
    ])


def verification() -> dict[str, Any]:
    return dashboard("txnguard-verification", "txnguard / verification",
                     "KIP-890 part 1: VerificationTimeMs, VerificationFailureRate, rewrites, coordinator traffic", [
        panel("VerificationTimeMs p99 by evidence", "Start of a verification (request parsed) to its decision", [
            q(quantile(0.99, "txnguard_verification_time_ms", "evidence"), "p99 {{evidence}}"),
            q(quantile(0.5, "txnguard_verification_time_ms", "evidence"), "p50 {{evidence}}")], "ms"),
        panel("VerificationFailureRate by reason", "Failed partition verifications / s", [
            q(rate("txnguard_verification_failures_total", "reason"), "{{reason}}")], "ops"),
        panel("Verifications / s by evidence and outcome", "local: AddPartitionsToTxn seen here; leader: "
              "DescribeProducers; coordinator: DescribeTransactions; cache", [
                  q(rate("txnguard_verifications_total", "evidence, outcome"), "{{evidence}} {{outcome}}")], "ops"),
        panel("What happened to verified writes", "forwarded, rejected, forwarded_unenforced (monitor mode)", [
            q(rate("txnguard_verifications_total", "decision"), "{{decision}}")], "ops"),
        panel("Error rewrites by client family", "The error each client family was sent (policy.errors)", [
            q(rate("txnguard_error_rewrites_total", "client_family, to_error"), "{{client_family}} {{to_error}}")],
              "ops"),
        panel("Coordinator round trip p99", "VerificationTimeMs of verifications that waited for the coordinator "
              "(DescribeTransactions / VerifyOnly) or the leader (DescribeProducers)", [
                  q(quantile(0.99, "txnguard_verification_time_ms", "evidence", 'evidence=~"coordinator|leader"'),
                    "{{evidence}}")], "ms"),
        panel("Checks held for the coordinator", "Checks held now while their coordinator cannot answer (frozen, "
              "failing over, loading), as the broker holds a Produce; and how holds ended / s: decided by the "
              "coordinator, or run out at the request's own timeout (then the client got a retriable error)", [
                  q(f"sum by (instance) (txnguard_verification_holds{{{SEL}}})", "held now {{instance}}"),
                  q(rate("txnguard_verification_hold_endings_total", "ending"), "ended: {{ending}} /s")]),
        panel("Own verification requests / s by API", "The proxy's FindCoordinator, DescribeTransactions, "
              "DescribeProducers, VerifyOnly requests", [
                  q(rate("txnguard_coordinator_requests_total", "api"), "{{api}}")], "reqps"),
        panel("Coordinator batch size", "Questions batched into one verification request (mean)", [
            q(f"sum by (api) (rate(txnguard_coordinator_batch_size_sum{{{SEL}}}[{RATE}])) / "
              f"sum by (api) (rate(txnguard_coordinator_batch_size_count{{{SEL}}}[{RATE}]))", "{{api}}")]),
        panel("Inspection time p99 by API", "Decoding a request the guard checks, before verification starts", [
            q(quantile(0.99, "txnguard_inspection_time_ms", "api"), "{{api}}")], "ms"),
        panel("Own requests refused by Kafka's authorizer / s", "The proxy's principal (upstream_auth) lacks a "
              "right: each series names the API and the ACL (operation, resource type) to grant. Essential rights "
              "fail /readyz; clients get retriable errors until the ACL is granted", [
                  q(rate("txnguard_verification_authorization_failures_total", "api, operation, resource_type"),
                    "{{api}}: {{operation}} on {{resource_type}}")], "ops"),
        panel("Check-to-append window p99", "From the evidence in hand to the broker's answer to the verified "
              "write: the window the proxy cannot close on brokers without native verification", [
                  q(quantile(0.99, "txnguard_verification_window_ms", "evidence"), "{{evidence}}")], "ms"),
    ])


def clients() -> dict[str, Any]:
    return dashboard("txnguard-clients", "txnguard / clients", "Who connects and what they do", [
        panel("Connections open by listener", "", [
            q(f"sum by (listener) (txnguard_connections_active{{{SEL}}})", "{{listener}}")]),
        panel("Transactional requests / s by API", "InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, "
              "TxnOffsetCommit: the transactional clients' share of the traffic", [
                  q(rate("txnguard_frames_total", "api", f'direction="client_to_broker", api=~"{TXN_APIS}"'),
                    "{{api}}")], "reqps"),
        panel("Transactional vs other requests / s", "", [
            q(rate("txnguard_frames_total", "direction", f'direction="client_to_broker", api=~"{TXN_APIS}"'),
              "transactional"),
            q(rate("txnguard_frames_total", "direction", f'direction="client_to_broker", api!~"{TXN_APIS}"'),
              "other")], "reqps"),
        panel("Client families sent an error", "Families (KIP-511 software name, client id, listener) the proxy "
              "sent an error instead of a broker answer", [
                  q(rate("txnguard_error_rewrites_total", "client_family"), "{{client_family}}")], "ops"),
        panel("Client starts (ApiVersions) / s", "Each connection opens with ApiVersions (KIP-511 names the client)",
              [q(rate("txnguard_frames_total", "instance", 'api="api_versions", direction="client_to_broker"'),
                 "{{instance}}")], "reqps"),
        panel("Clients connected by software and version", "Open client connections by the KIP-511 software name "
              "and version sent in ApiVersions v3+ (as Kafka's brokers count them): which old clients are still "
              "here. Names outside KIP-511's pattern count as `invalid`, past 200 live series as `other`", [
                  q(f"sum by (software_name, software_version) (txnguard_client_connections{{{SEL}}})",
                    "{{software_name}} {{software_version}}")]),
        text("Client inventory over time",
             "Live connections are the panel beside. Who connected over days, with client ids, transactional ids "
             "and rejections, is in the audit `connection` records and the fleet report's `client_inventory` "
             "table (`txnguard report`)."),
    ])


def transactions() -> dict[str, Any]:
    return dashboard("txnguard-transactions", "txnguard / transaction health", "Transactions the proxy tracks", [
        panel("Transactional ids tracked", "Entries in the transaction registry", [
            q(f"sum by (instance) (txnguard_registry_transactional_ids{{{SEL}}})", "{{instance}}")]),
        panel("Hanging transactions prevented (1 h)", "Writes outside their transaction that the broker would have "
              "appended: each one a hanging transaction or an aborted record in a later transaction", [
                  q(f"sum by (reason) (({PREVENTED} unless {PREVENTED} offset 1h) or increase({PREVENTED}[1h]))",
                    "{{reason}}")]),
        panel("Hanging transactions by partition", "Partitions whose last stable offset is held by a transaction "
              "older than the find-hanging threshold (health.hanging_scan_interval_s on). Fix: `txnguard hanging "
              "--abort`", [
                  q(f"max by (topic, partition) (txnguard_hanging_transactions{{{SEL}}})", "{{topic}}-{{partition}}")]),
        panel("Oldest open transaction", "Age of the oldest open transaction any partition holds, from its "
              "producer's last write there (as find-hanging measures it)", [
                  q(f"max by (instance) (txnguard_oldest_open_transaction_age_seconds{{{SEL}}})", "{{instance}}")],
              "s"),
        panel("Hanging-transaction scans / s", "ok or failed (a failed scan leaves the gauges as they were)", [
            q(rate("txnguard_hanging_scans_total", "outcome"), "{{outcome}}")], "ops"),
        panel("CONCURRENT_TRANSACTIONS absorbed / s", "AddPartitionsToTxn/AddOffsetsToTxn refused while the "
              "previous transaction's markers were written, asked again by the proxy (health."
              "concurrent_transactions_budget_ms): absorbed (the client never saw the error), budget_spent or "
              "behind_another (the client got it); and the proxy's retries", [
                  q(rate("txnguard_concurrent_transactions_absorptions_total", "api, ending"), "{{api}} {{ending}}"),
                  q(rate("txnguard_concurrent_transactions_retries_total", "api"), "retries {{api}}")], "ops"),
        panel("EndTxns in doubt (KAFKA-17754)", "EndTxns forwarded and unanswered now, and the AddPartitionsToTxn/"
              "AddOffsetsToTxn held behind them: an old EndTxn that lands late could end the next transaction", [
                  q(f"sum by (instance) (txnguard_end_txn_in_doubt{{{SEL}}})", "in doubt {{instance}}"),
                  q(f"sum by (instance) (txnguard_end_txn_holds{{{SEL}}})", "held behind one {{instance}}")]),
        panel("EndTxn doubts and holds ended / s", "How each doubt ended (answered, fenced, closed, expired), how "
              "each hold ended (settled: forwarded; timeout: the client got CONCURRENT_TRANSACTIONS and retried), "
              "and connections that closed with an EndTxn unanswered", [
                  q(rate("txnguard_end_txn_in_doubt_endings_total", "ending"), "doubt {{ending}}"),
                  q(rate("txnguard_end_txn_hold_endings_total", "ending"), "hold {{ending}}"),
                  q(rate("txnguard_end_txn_lingers_total", "ending"), "linger {{ending}}")], "ops"),
    ])


DASHBOARDS = {"overview": overview, "verification": verification, "clients": clients, "transactions": transactions}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main() -> None:
    for name, build in DASHBOARDS.items():
        (HERE / f"txnguard-{name}.json").write_text(render(build))
    print(f"wrote {len(DASHBOARDS)} dashboards to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()

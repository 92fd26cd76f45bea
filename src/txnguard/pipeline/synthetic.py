"""Synthetic audit records with a realistic mix, for the benchmark and the tests (seeded: reproducible).

Mostly passes with local evidence (sub-millisecond), some leader/coordinator/cache evidence (a round trip),
a few percent failures across every outcome, several client families and versions, v1 and v2 decision
records and v2 connection records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from txnguard.policies.outcomes import Outcome

# (family, software name, version, client id prefix, produce version, txn offset commit version)
CLIENTS = (
    ("java", "apache-kafka-java", "2.8.2", "producer", 9, 3),
    ("java", "apache-kafka-java", "3.5.2", "producer", 9, 3),
    ("librdkafka", "confluent-kafka-python", "2.16.1", "rdkafka", 9, 3),
    ("kafka-python", None, None, "kafka-python-producer", 7, 2),
    ("aiokafka", None, None, "aiokafka", 8, 2),
    ("sarama", "sarama", "1.43.0", "sarama", 7, 2),
)
EVIDENCE_WEIGHTS = (("local", 80), ("leader", 8), ("coordinator", 6), ("cache", 6))
FAILURES = (Outcome.NOT_IN_TRANSACTION, Outcome.LATE_WRITE, Outcome.FENCED, Outcome.PRODUCER_ID_MAPPING,
            Outcome.COORDINATOR_RETRIABLE)
ERRORS = {Outcome.NOT_IN_TRANSACTION: (48, "INVALID_TXN_STATE"), Outcome.LATE_WRITE: (48, "INVALID_TXN_STATE"),
          Outcome.FENCED: (47, "INVALID_PRODUCER_EPOCH"),
          Outcome.PRODUCER_ID_MAPPING: (49, "INVALID_PRODUCER_ID_MAPPING"),
          Outcome.COORDINATOR_RETRIABLE: (19, "NOT_ENOUGH_REPLICAS")}
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class Generator:
    """`records(n)` yields n dicts; about 1 in 50 is a connection record (schema 2), the rest decisions."""

    def __init__(self, seed: int = 7, start_ms: int = START_MS, span_ms: int = 2 * 86_400_000,
                 failure_rate: float = 0.03, transactional_ids: int = 5_000) -> None:
        self.rng = random.Random(seed)
        self.start_ms, self.span_ms = start_ms, span_ms
        self.failure_rate = failure_rate
        self.transactional_ids = transactional_ids
        self.serial = 0

    def decision(self, schema_version: int = 2) -> dict[str, Any]:
        rng = self.rng
        self.serial += 1
        family, name, version, cid, produce_v, commit_v = rng.choice(CLIENTS)
        txn = f"txn-{family}-{rng.randrange(self.transactional_ids)}"
        evidence = rng.choices([e for e, _ in EVIDENCE_WEIGHTS], [w for _, w in EVIDENCE_WEIGHTS])[0]
        failed = rng.random() < self.failure_rate
        outcome = rng.choice(FAILURES) if failed else Outcome.PASS
        api = "txn_offset_commit" if rng.random() < 0.1 else "produce"
        mode = "monitor" if failed and rng.random() < 0.1 else "enforce"
        decision = "forwarded" if not failed else ("rejected" if mode == "enforce" else "forwarded_unenforced")
        code, error = ERRORS[outcome] if decision == "rejected" else (None, None)
        local = evidence == "local"
        latency = rng.lognormvariate(-3.0, 0.5) if local else rng.lognormvariate(0.5, 0.6)
        record: dict[str, Any] = {
            "schema_version": schema_version,
            "time_ms": self.start_ms + rng.randrange(self.span_ms),
            "transactional_id": txn, "producer_id": 1000 + self.serial % 100_000, "producer_epoch": rng.randrange(3),
            "api": api, "api_version": produce_v if api == "produce" else commit_v,
            "target": f"orders-{rng.randrange(8)}" if api == "produce" else f"group:billing-{rng.randrange(4)}",
            "client_id": f"{cid}-{rng.randrange(20)}", "client_software_name": name,
            "client_software_version": version, "client_family": family, "listener": "bootstrap",
            "connection_id": self.serial, "outcome": outcome.value, "decision": decision,
            "reason": "" if not failed else f"synthetic {outcome.value}",
            "underlying_error": "COORDINATOR_NOT_AVAILABLE" if outcome is Outcome.COORDINATOR_RETRIABLE else None,
            "evidence": evidence, "error_sent": code, "error_name": error, "latency_ms": round(latency, 4),
            "cpu_ms": round(latency * 0.8, 4) if local else None, "mode": mode,
        }
        if schema_version == 2:
            record["kind"] = "decision"
            record["proxy_id"] = f"sidecar@broker-{rng.randrange(3)}:19092"
        return record

    def connection(self) -> dict[str, Any]:
        rng = self.rng
        self.serial += 1
        family, name, version, cid, produce_v, commit_v = rng.choice(CLIENTS)
        used = rng.random() < 0.7
        closed = self.start_ms + rng.randrange(self.span_ms)
        return {
            "schema_version": 2, "kind": "connection", "proxy_id": f"sidecar@broker-{rng.randrange(3)}:19092",
            "time_ms": closed, "connected_ms": closed - rng.randrange(3_600_000), "connection_id": self.serial,
            "listener": "bootstrap", "client_address": f"10.0.{rng.randrange(4)}.{rng.randrange(250)}:4{closed % 999}",
            "client_id": f"{cid}-{rng.randrange(20)}", "client_software_name": name,
            "client_software_version": version, "client_family": family,
            "first_transactional_id": f"txn-{family}-{rng.randrange(self.transactional_ids)}" if used else None,
            "used_transactions": used, "produce_versions": [produce_v] if used else [],
            "txn_offset_commit_versions": [commit_v] if used and rng.random() < 0.5 else [],
            "close_reason": rng.choice(("client_closed", "client_closed", "idle", "draining")),
        }

    def records(self, n: int) -> Iterator[dict[str, Any]]:
        for _ in range(n):
            r = self.rng.random()
            if r < 0.02:
                yield self.connection()
            else:
                yield self.decision(schema_version=1 if r < 0.3 else 2)

    def lines(self, n: int) -> Iterator[str]:
        for record in self.records(n):
            yield json.dumps(record, separators=(",", ":"))

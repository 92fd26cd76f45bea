"""The audit record: one JSON-ready dict per verification decision (schema_version 1).

The PySpark pipeline reads these; change a field only with a new schema_version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txnguard.verification.outcomes import Verdict

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str | None
    software_name: str | None
    software_version: str | None
    family: str
    listener: str
    connection_id: int


def audit_record(
    *, time_ms: int, transactional_id: str, producer_id: int, producer_epoch: int, api: str, api_version: int,
    target: str, verdict: Verdict, decision: str, error_sent: int | None, error_name: str | None,
    latency_ms: float, client: ClientInfo, mode: str, cpu_ms: float | None = None,
) -> dict[str, Any]:
    """`target` is "topic-partition" for Produce or "group:<id>" for TxnOffsetCommit.

    `decision` is what happened to the write: "forwarded" (passed), "rejected"
    (enforce), "forwarded_unenforced" (monitor mode: would have been rejected).
    `latency_ms` is VerificationTimeMs (wall clock); `cpu_ms` the proxy thread's CPU time for a
    decision taken without waiting (None when it waited on a broker: other work ran meanwhile).
    """
    return {
        "schema_version": SCHEMA_VERSION,
        "time_ms": time_ms,
        "transactional_id": transactional_id,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "api": api,
        "api_version": api_version,
        "target": target,
        "client_id": client.client_id,
        "client_software_name": client.software_name,
        "client_software_version": client.software_version,
        "client_family": client.family,
        "listener": client.listener,
        "connection_id": client.connection_id,
        "outcome": verdict.outcome.value,
        "decision": decision,
        "reason": verdict.detail,
        "underlying_error": verdict.underlying,
        "evidence": verdict.evidence.value,
        "error_sent": error_sent,
        "error_name": error_name,
        "latency_ms": round(latency_ms, 4),
        "cpu_ms": None if cpu_ms is None else round(cpu_ms, 4),
        "mode": mode,
    }

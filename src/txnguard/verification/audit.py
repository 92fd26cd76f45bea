"""The audit records: JSON-ready dicts, pure (no IO, no clock: the time is passed in).

Five kinds in one stream (schema_version 2): a `decision` per partition verification, a
`connection` per client connection that identified itself, written when it closes (the client
inventory needs clients that were never rejected too), a `hanging` per hanging transaction the
proxy's periodic scan finds (once per transaction, when first found), an `end_txn_hold` per request held
while an EndTxn was in doubt (the KAFKA-17754 defence), and a `transaction_log_id` per transactional id active
in the coordinator's log, every `audit.transaction_log_ids_interval_s` (verification/bypass.py). The PySpark
pipeline reads these; change a field only with a new schema_version. Version 1 was a decision record without
`kind` and `proxy_id`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txnguard.verification.bypass import LogId
from txnguard.verification.hanging import Finding
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.verdicts import Verdict

SCHEMA_VERSION = 2
DECISION, CONNECTION, HANGING = "decision", "connection", "hanging"
END_TXN_HOLD = "end_txn_hold"
TRANSACTION_LOG_ID = "transaction_log_id"


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str | None
    software_name: str | None
    software_version: str | None
    family: str
    listener: str
    connection_id: int


def _envelope(kind: str, proxy_id: str, time_ms: int) -> dict[str, Any]:
    """The fields every record starts with: what it is, which proxy wrote it, when."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "proxy_id": proxy_id, "time_ms": time_ms}


def _producer(transactional_id: str | None, producer_id: int, producer_epoch: int) -> dict[str, Any]:
    return {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": producer_epoch}


def _client(client: ClientInfo) -> dict[str, Any]:
    """Who sent the request, as its connection identified itself."""
    return {"client_id": client.client_id, "client_software_name": client.software_name,
            "client_software_version": client.software_version, "client_family": client.family,
            "listener": client.listener, "connection_id": client.connection_id}


def audit_record(
    *, time_ms: int, transactional_id: str, producer_id: int, producer_epoch: int, api: str, api_version: int,
    target: str, verdict: Verdict, decision: str, error_sent: int | None, error_name: str | None,
    latency_ms: float, client: ClientInfo, mode: str, proxy_id: str = "", cpu_ms: float | None = None,
) -> dict[str, Any]:
    """`target` is "topic-partition" for Produce or "group:<id>" for TxnOffsetCommit.

    `decision` is what happened to the write: "forwarded" (passed), "rejected"
    (enforce), "forwarded_unenforced" (monitor mode: would have been rejected).
    `latency_ms` is VerificationTimeMs (wall clock); `cpu_ms` the proxy thread's CPU time for a
    decision taken without waiting (None when it waited on a broker: other work ran meanwhile).
    `proxy_id` names the proxy instance (the audit log's; see proxy/audit_sink.py).
    """
    return {
        **_envelope(DECISION, proxy_id, time_ms),
        **_producer(transactional_id, producer_id, producer_epoch),
        "api": api,
        "api_version": api_version,
        "target": target,
        **_client(client),
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


def identified(client: ClientInfo) -> bool:
    """A connection is in the inventory once it named itself: a client id, or a KIP-511 software name."""
    return bool(client.client_id) or bool(client.software_name)


def connection_record(*, time_ms: int, proxy_id: str, client: ClientInfo, inventory: ConnectionInventory,
                      close_reason: str) -> dict[str, Any]:
    """One client connection, written when it closes (`time_ms`); `connected_ms` is when it was accepted."""
    return {
        **_envelope(CONNECTION, proxy_id, time_ms),
        "connected_ms": inventory.connected_ms,
        "connection_id": client.connection_id,
        "listener": client.listener,
        "client_address": inventory.client_address,
        "client_id": client.client_id,
        "client_software_name": client.software_name,
        "client_software_version": client.software_version,
        "client_family": client.family,
        "first_transactional_id": inventory.first_transactional_id,
        "used_transactions": inventory.used_transactions,
        "produce_versions": sorted(inventory.produce_versions),
        "txn_offset_commit_versions": sorted(inventory.txn_offset_commit_versions),
        "close_reason": close_reason,
    }


def hanging_record(*, time_ms: int, proxy_id: str, finding: Finding, max_transaction_timeout_ms: int | None = None,
                   ) -> dict[str, Any]:
    """A hanging transaction the scan found (`time_ms`: when), judged as `kafka-transactions.sh find-hanging`.

    `transactional_id` is the id ListTransactions named for the producer id (None: none, itself a reason
    it hangs); `reason` is why it hangs (verification/hanging.py); `age_ms` is measured from the producer's
    last write on the partition, as the tool measures it; `max_transaction_timeout_ms` is the age the
    finding had to pass: find-hanging's threshold, or its own transaction's timeout plus the margin (the
    finding's `threshold_ms` unless given).
    """
    f = finding
    threshold = f.threshold_ms if max_transaction_timeout_ms is None else max_transaction_timeout_ms
    if threshold is None:
        raise ValueError("a hanging record needs the threshold its finding passed")
    return {
        **_envelope(HANGING, proxy_id, time_ms),
        **_producer(f.transactional_id, f.producer_id, f.producer_epoch),
        "target": f"{f.topic}-{f.partition}",
        "topic": f.topic,
        "partition": f.partition,
        "coordinator_epoch": f.coordinator_epoch,
        "start_offset": f.start_offset,
        "last_timestamp_ms": f.last_timestamp_ms,
        "age_ms": time_ms - f.last_timestamp_ms,
        "reason": f.reason,
        "coordinator_state": f.coordinator_state,
        "max_transaction_timeout_ms": threshold,
    }


def end_txn_hold_record(*, time_ms: int, proxy_id: str, transactional_id: str, producer_id: int,
                        producer_epoch: int, api: str, ending: str, held_ms: float, in_doubt: list[dict[str, Any]],
                        error_sent: int | None, error_name: str | None, client: ClientInfo) -> dict[str, Any]:
    """A request that would open a transaction, held while an EndTxn of the same producer was in doubt
    (KAFKA-17754, verification/in_doubt.py): how the hold ended ("settled", "fenced", "timeout") and what
    the client got (`error_sent` None: forwarded; else the retriable error answered at the hold's bound)."""
    return {
        **_envelope(END_TXN_HOLD, proxy_id, time_ms),
        **_producer(transactional_id, producer_id, producer_epoch),
        "api": api,
        "ending": ending,
        "held_ms": held_ms,
        "end_txns_in_doubt": in_doubt,
        "decision": "forwarded" if error_sent is None else "rejected",
        "error_sent": error_sent,
        "error_name": error_name,
        **_client(client),
    }


def transaction_log_id_record(*, time_ms: int, proxy_id: str, log_id: LogId, active_ids: int,
                               omitted_ids: int) -> dict[str, Any]:
    """One transactional id active in the coordinator's log (verification/bypass.py), as this proxy's follower read
    it: its latest state and the coordinator's time of it (`last_update_ms`), and whether this proxy saw the id in a
    request (`seen_by_proxy`). One round of them lists `active_ids` ids, the unseen first; `omitted_ids` of them
    were left out past the round's cap. The fleet report lists the ids no proxy saw."""
    return {
        **_envelope(TRANSACTION_LOG_ID, proxy_id, time_ms),
        **_producer(log_id.transactional_id, log_id.producer_id, log_id.producer_epoch),
        "coordinator_state": log_id.state,
        "last_update_ms": log_id.last_update_ms,
        "seen_by_proxy": log_id.seen,
        "active_ids": active_ids,
        "omitted_ids": omitted_ids,
    }


def record_key(record: dict[str, Any]) -> str | None:
    """The Kafka key of a record: its transactional id (a connection's first one; None if it had none)."""
    if record.get("kind") == CONNECTION:
        key: str | None = record.get("first_transactional_id")
        return key
    return record.get("transactional_id")

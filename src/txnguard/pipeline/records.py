"""What an audit record is, in plain Python: the fields of each schema version and kind, which are required.

Schema version 1 is today's decision record (`txnguard.verification.audit`). Version 2 adds `kind`
("decision", "connection", "hanging", "end_txn_hold" or "transaction_log_id") and `proxy_id` to every record; a v2
decision carries every v1 field, a connection record describes one client connection (written when it closes or the
proxy stops), a hanging record one hanging transaction the proxy's periodic scan found (`txnguard.proxy.hanging_io`), an
end_txn_hold record one request held while an EndTxn of its producer was in doubt (KAFKA-17754), a
transaction_log_id record one transactional id active in the coordinator's log as a proxy's follower read it
(`txnguard.verification.bypass`: the ids no proxy saw are clients that bypass txnguard).
Anything else is quarantined with a reason; this module names the reasons and works them out
(`quarantine_reason`). Plain Python: it is also shipped to Spark's Python workers (`arrow_parse`).
"""

from __future__ import annotations

from typing import Any, Literal

SUPPORTED_SCHEMA_VERSIONS = (1, 2)
DECISION, CONNECTION, HANGING, END_TXN_HOLD = "decision", "connection", "hanging", "end_txn_hold"
TRANSACTION_LOG_ID = "transaction_log_id"
KINDS = (DECISION, CONNECTION, HANGING, END_TXN_HOLD, TRANSACTION_LOG_ID)
QUARANTINE = "quarantine"  # the route of a line that is none of the kinds

# "in_doubt_array": an end_txn_hold's EndTxns in doubt, a list of {committed, connection_id, sent_ms, orphaned}.
FieldType = Literal["long", "int", "string", "double", "boolean", "int_array", "in_doubt_array"]

# (name, type, required). Nullable in the proxy's own record means not required here.
# Who sent the request, as its connection identified itself (verification/audit.py `_client`).
CLIENT: tuple[tuple[str, FieldType, bool], ...] = (
    ("client_id", "string", False),
    ("client_software_name", "string", False),
    ("client_software_version", "string", False),
    ("client_family", "string", True),
    ("listener", "string", True),
    ("connection_id", "long", True),
)

DECISION_V1: tuple[tuple[str, FieldType, bool], ...] = (
    ("schema_version", "int", True),
    ("time_ms", "long", True),
    ("transactional_id", "string", True),
    ("producer_id", "long", True),
    ("producer_epoch", "int", True),
    ("api", "string", True),
    ("api_version", "int", True),
    ("target", "string", True),
    *CLIENT,
    ("outcome", "string", True),
    ("decision", "string", True),
    ("reason", "string", False),
    ("underlying_error", "string", False),
    ("evidence", "string", True),
    ("error_sent", "int", False),
    ("error_name", "string", False),
    ("latency_ms", "double", True),
    ("cpu_ms", "double", False),
    ("mode", "string", True),
)

V2_COMMON: tuple[tuple[str, FieldType, bool], ...] = (
    ("kind", "string", True),
    ("proxy_id", "string", True),
)

# What every v2 record of a kind of its own starts with (verification/audit.py `_envelope`).
ENVELOPE_V2: tuple[tuple[str, FieldType, bool], ...] = (
    ("schema_version", "int", True),
    *V2_COMMON,
    ("time_ms", "long", True),
)

CONNECTION_V2: tuple[tuple[str, FieldType, bool], ...] = (
    *ENVELOPE_V2,
    ("connected_ms", "long", True),
    ("connection_id", "long", True),
    ("listener", "string", True),
    ("client_address", "string", True),
    ("client_id", "string", False),
    ("client_software_name", "string", False),
    ("client_software_version", "string", False),
    ("client_family", "string", True),
    ("first_transactional_id", "string", False),
    ("used_transactions", "boolean", True),
    ("produce_versions", "int_array", True),
    ("txn_offset_commit_versions", "int_array", True),
    ("close_reason", "string", True),
)

HANGING_V2: tuple[tuple[str, FieldType, bool], ...] = (
    *ENVELOPE_V2,
    ("transactional_id", "string", False),  # None: ListTransactions named no id for the producer
    ("producer_id", "long", True),
    ("producer_epoch", "int", True),
    ("target", "string", True),
    ("topic", "string", True),
    ("partition", "int", True),
    ("coordinator_epoch", "int", True),
    ("start_offset", "long", True),
    ("last_timestamp_ms", "long", True),
    ("age_ms", "long", True),
    ("reason", "string", True),
    ("coordinator_state", "string", False),
    ("max_transaction_timeout_ms", "long", True),
)


END_TXN_HOLD_V2: tuple[tuple[str, FieldType, bool], ...] = (
    *ENVELOPE_V2,
    ("transactional_id", "string", True),
    ("producer_id", "long", True),
    ("producer_epoch", "int", True),
    ("api", "string", True),
    ("ending", "string", True),               # settled, fenced or timeout
    ("held_ms", "double", True),
    ("end_txns_in_doubt", "in_doubt_array", True),
    ("decision", "string", True),             # forwarded, or rejected (answered at the hold's bound)
    ("error_sent", "int", False),
    ("error_name", "string", False),
    *CLIENT,
)

# One transactional id active in the coordinator's log, as a proxy's follower read it (verification/audit.py
# `transaction_log_id_record`).
TRANSACTION_LOG_ID_V2: tuple[tuple[str, FieldType, bool], ...] = (
    *ENVELOPE_V2,
    ("transactional_id", "string", True),
    ("producer_id", "long", True),
    ("producer_epoch", "int", True),
    ("coordinator_state", "string", True),
    ("last_update_ms", "long", True),         # the coordinator's time of the id's latest record
    ("seen_by_proxy", "boolean", True),       # this proxy saw the id in a request since it started
    ("active_ids", "long", True),             # ids the proxy's round found active
    ("omitted_ids", "long", True),            # of those, left out of the round past its cap
)

_V2_KINDS = {CONNECTION: CONNECTION_V2, HANGING: HANGING_V2, END_TXN_HOLD: END_TXN_HOLD_V2,
             TRANSACTION_LOG_ID: TRANSACTION_LOG_ID_V2}


def union_fields() -> list[tuple[str, FieldType]]:
    """Every field any supported record may carry, once: the one schema a line is parsed with."""
    seen: dict[str, FieldType] = {}
    for name, kind, _ in (*DECISION_V1, *V2_COMMON, *CONNECTION_V2, *HANGING_V2, *END_TXN_HOLD_V2,
                          *TRANSACTION_LOG_ID_V2):
        seen.setdefault(name, kind)
    return list(seen.items())


def required(schema_version: int, kind: str) -> list[str]:
    if kind in _V2_KINDS:
        return [name for name, _, req in _V2_KINDS[kind] if req]
    fields = DECISION_V1 + (V2_COMMON if schema_version == 2 else ())
    return [name for name, _, req in fields if req]


def _missing(row: dict[str, Any], names: list[str]) -> str | None:
    gone = [n for n in names if row.get(n) is None]
    return f"{MISSING_FIELDS}:{','.join(gone)}" if gone else None


def quarantine_reason(row: dict[str, Any] | None, text: str | None, chars: int | None) -> str | None:
    """Why a line is not a supported record (None: it is one), the first reason that applies.

    `row` is the line parsed with the declared schema (None: it did not parse, or was not handed to the
    parser), `text` the line, `chars` its length in characters.
    """
    if text is None or (row is None and text.strip(" ") == ""):  # Spark's trim: spaces only
        return EMPTY
    if chars is not None and chars > MAX_RECORD_CHARS:
        return TOO_LARGE
    if row is None:
        return MALFORMED_JSON
    version, kind = row.get("schema_version"), row.get("kind")
    if version is None:
        return f"{MISSING_FIELDS}:schema_version"
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        return f"{UNSUPPORTED_SCHEMA_VERSION}:{version}"
    if version == 1:
        return _missing(row, required(1, DECISION))
    if kind is None:
        return f"{MISSING_FIELDS}:kind"
    if kind not in KINDS:
        return f"{UNKNOWN_KIND}:{kind[:64]}"
    return _missing(row, required(2, kind))


# Quarantine reasons (a reason may carry a detail after a colon, e.g. "missing_fields:time_ms,api").
TOO_LARGE = "too_large"
EMPTY = "empty"
MALFORMED_JSON = "malformed_json"
UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
UNKNOWN_KIND = "unknown_kind"
MISSING_FIELDS = "missing_fields"

# A record is a few hundred bytes; a line past this is not an audit record and is not parsed at all.
MAX_RECORD_CHARS = 64 * 1024

# Pre-TV2 (KIP-890 transaction version 1) clients: the proxy verifies Produce up to v11 and
# TxnOffsetCommit up to v4; newer versions have the broker add partitions itself.
LAST_PRE_TV2_VERSION = {"produce": 11, "txn_offset_commit": 4}

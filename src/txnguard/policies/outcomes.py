"""The vocabulary of verification outcomes, named after what the transaction coordinator would say.

It lives here, below the verification package, because the policies map each
outcome to the error a client family should see.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    PASS = "pass"
    NOT_IN_TRANSACTION = "not_in_transaction"          # partition/group not added to the ongoing transaction
    LATE_WRITE = "late_write"                          # a write after EndTxn with no new AddPartitionsToTxn
    COORDINATOR_RETRIABLE = "coordinator_unavailable"  # unavailable, not coordinator, loading, network, concurrent
    FENCED = "producer_fenced"
    PRODUCER_ID_MAPPING = "producer_id_mapping"
    INVALID_RECORD = "invalid_record"                  # a batch the proxy cannot read (the broker refuses it too)

    @property
    def failed(self) -> bool:
        return self is not Outcome.PASS

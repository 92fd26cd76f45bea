"""Which Kafka error each client family gets for each verification outcome.

The default is the broker's own mapping (Kafka 3.7-3.9, KIP-890 "Old Clients"):
Produce gets INVALID_TXN_STATE for a partition not in the transaction and
NOT_ENOUGH_REPLICAS ("does not trigger a metadata refresh") when the
coordinator cannot answer; TxnOffsetCommit gets COORDINATOR_NOT_AVAILABLE for
the latter. Families override single cells where a client would otherwise react badly (each override
says why, from that client's own error handling); docs/troubleshooting.md lists what each family sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from txnguard.policies.families import KAFKA_PYTHON, SARAMA
from txnguard.policies.outcomes import Outcome

PRODUCE, TXN_OFFSET_COMMIT = "produce", "txn_offset_commit"

NOT_ADDED_MESSAGE = "Partition was not added to the transaction"
INVALID_RECORD_MESSAGE = "The record batch is truncated or its length is inconsistent"
UNVERIFIED_MESSAGE = "Unable to verify the partition has been added to the transaction. Underlying error: {underlying}"


@dataclass(frozen=True)
class ErrorChoice:
    code: int
    message: str | None = None

    def render(self, underlying: str | None) -> str | None:
        if self.message is None:
            return None
        return self.message.format(underlying=underlying or "UNKNOWN")

    @property
    def name(self) -> str:
        try:
            return ErrorCode(self.code).name.upper()
        except ValueError:
            return f"ERROR_{self.code}"


ErrorTable = Mapping[str, Mapping[Outcome, ErrorChoice]]

BROKER_PARITY: ErrorTable = {
    PRODUCE: {
        Outcome.NOT_IN_TRANSACTION: ErrorChoice(ErrorCode.invalid_txn_state, NOT_ADDED_MESSAGE),
        Outcome.LATE_WRITE: ErrorChoice(ErrorCode.invalid_txn_state, NOT_ADDED_MESSAGE),
        Outcome.COORDINATOR_RETRIABLE: ErrorChoice(ErrorCode.not_enough_replicas, UNVERIFIED_MESSAGE),
        Outcome.FENCED: ErrorChoice(ErrorCode.invalid_producer_epoch),
        Outcome.PRODUCER_ID_MAPPING: ErrorChoice(ErrorCode.invalid_producer_id_mapping),
        # What Kafka answers for that partition (and it keeps the connection): measured on 3.5.2.
        Outcome.INVALID_RECORD: ErrorChoice(ErrorCode.invalid_record, INVALID_RECORD_MESSAGE),
    },
    TXN_OFFSET_COMMIT: {
        Outcome.NOT_IN_TRANSACTION: ErrorChoice(ErrorCode.invalid_txn_state),
        Outcome.LATE_WRITE: ErrorChoice(ErrorCode.invalid_txn_state),
        Outcome.COORDINATOR_RETRIABLE: ErrorChoice(ErrorCode.coordinator_not_available),
        Outcome.FENCED: ErrorChoice(ErrorCode.invalid_producer_epoch),
        Outcome.PRODUCER_ID_MAPPING: ErrorChoice(ErrorCode.invalid_producer_id_mapping),
        Outcome.INVALID_RECORD: ErrorChoice(ErrorCode.invalid_record),  # carries no records: never chosen
    },
}

# Per-family cells that differ from broker parity.
FAMILY_OVERRIDES: Mapping[str, ErrorTable] = {
    # kafka-python raises INVALID_TXN_STATE on Produce as a fatal error; TRANSACTION_ABORTABLE
    # (120) makes it abort the transaction, which is what KIP-890 intends.
    KAFKA_PYTHON: {
        PRODUCE: {
            Outcome.NOT_IN_TRANSACTION: ErrorChoice(ErrorCode.transaction_abortable, NOT_ADDED_MESSAGE),
            Outcome.LATE_WRITE: ErrorChoice(ErrorCode.transaction_abortable, NOT_ADDED_MESSAGE),
        },
    },
    # IBM/sarama (v1.61.1) gets broker parity in every cell, on purpose. Produce: it retries only
    # 2, 3, 5, 6, 7, 19, 20 and 56, at most Producer.Retry.Max (3) times, Producer.Retry.Backoff
    # (100 ms) apart (async_producer.go handleSuccess, retryBatch); anything else fails the batch,
    # fatal for 31, 35, 49, 53 and 90, abortable for the rest (maybeTransitionToErrorState). So 19
    # is the right "retry" (14, 15, 16 and 51 would abort the transaction), 48 aborts, 49 is fatal
    # as from a broker. TxnOffsetCommit (transaction_manager.go publishOffsetsToTxn): 7, 15 and 16
    # refresh the group coordinator and retry, 3, 14 and isRetriableTxnError codes retry, at most
    # Producer.Transaction.Retry.Max (50) times 100 ms apart; 22, 25, 30 and 82 abort; the rest
    # (48, 47, 49, 90) is fatal, as on Java before 3.8. Sarama's budget for 19 is small: a
    # coordinator outage must be waited out by the proxy, not answered (issue 13).
    SARAMA: {},
}


# The coordinator could not be asked at all (network error, timeout). The group coordinator
# (3.8+, maybeConvertOffsetCommitError) answers TxnOffsetCommit then with COORDINATOR_LOAD_IN_PROGRESS
# rather than COORDINATOR_NOT_AVAILABLE: measured on Kafka 3.9.2 (test_coordinator_unavailable.py).
UNREACHABLE_TXN_OFFSET_COMMIT = ErrorChoice(ErrorCode.coordinator_load_in_progress)


def choose(api: str, outcome: Outcome, family: str,
           overrides: Mapping[str, ErrorTable] = FAMILY_OVERRIDES, underlying: str | None = None) -> ErrorChoice:
    family_cells = overrides.get(family, {}).get(api, {})
    chosen = family_cells.get(outcome)
    if chosen is not None:
        return chosen
    if api == TXN_OFFSET_COMMIT and outcome is Outcome.COORDINATOR_RETRIABLE and underlying == "NETWORK_EXCEPTION":
        return UNREACHABLE_TXN_OFFSET_COMMIT
    return BROKER_PARITY[api][outcome]

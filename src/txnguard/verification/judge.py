"""Turn a coordinator's or a leader's answer into a verdict, with the coordinator's own rules.

The transaction coordinator's VerifyOnly check (TransactionCoordinator.
handleVerifyPartitionsInTransaction) is: unknown id or other producer id ->
INVALID_PRODUCER_ID_MAPPING; other epoch -> PRODUCER_FENCED; PrepareCommit or
PrepareAbort -> CONCURRENT_TRANSACTIONS; otherwise each partition passes only
if it is in the transaction. DescribeTransactions gives the same facts to a
principal with DESCRIBE on the transactional id, and we apply the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed

COORDINATOR_RETRIABLE_ERRORS = frozenset({
    ErrorCode.not_coordinator, ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress,
    ErrorCode.network_exception, ErrorCode.request_timed_out,
})
PREPARING = frozenset({"PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


def coordinator_unreachable(why: str) -> Verdict:
    """No answer at all (network error, timeout): retriable, as NETWORK_EXCEPTION is for the broker."""
    return Verdict(Outcome.COORDINATOR_RETRIABLE, Evidence.COORDINATOR, why, "NETWORK_EXCEPTION")


ENDED = frozenset({"CompleteCommit", "CompleteAbort"})


def judge_description(desc: DescribedTransaction, producer_id: int, epoch: int, tp: TopicPartition,
                      evidence: Evidence = Evidence.COORDINATOR) -> Verdict:
    """The coordinator's rules on its description of the transaction: answered now (`coordinator`), or as
    the coordinator's own log holds it (`log`: verification/transaction_log_view.py)."""
    code = desc.error_code
    if code != ErrorCode.none:
        if code in COORDINATOR_RETRIABLE_ERRORS:
            return Verdict(Outcome.COORDINATOR_RETRIABLE, evidence,
                           f"coordinator answered {error_name(code)}", error_name(code))
        if code == ErrorCode.transactional_id_not_found:
            return Verdict(Outcome.PRODUCER_ID_MAPPING, evidence, "the coordinator knows no such id")
        if code == ErrorCode.transactional_id_authorization_failed:
            # The broker maps its own CLUSTER_AUTHORIZATION_FAILED to INVALID_TXN_STATE: fail closed.
            return Verdict(Outcome.NOT_IN_TRANSACTION, evidence,
                           "the proxy may not DESCRIBE this transactional id")
        return Verdict(Outcome.COORDINATOR_RETRIABLE, evidence,
                       f"coordinator answered {error_name(code)}", error_name(code))
    if desc.producer_id != producer_id:
        return Verdict(Outcome.PRODUCER_ID_MAPPING, evidence,
                       f"the coordinator maps the id to producer {desc.producer_id}")
    if desc.producer_epoch != epoch:
        return Verdict(Outcome.FENCED, evidence,
                       f"the coordinator has epoch {desc.producer_epoch}, the write {epoch}")
    if desc.state in PREPARING:
        return Verdict(Outcome.COORDINATOR_RETRIABLE, evidence,
                       f"transaction is in {desc.state}", "CONCURRENT_TRANSACTIONS")
    if desc.state == "Ongoing" and tp in desc.partitions:
        return passed(evidence, f"Ongoing since {desc.start_time_ms}")
    if desc.state in ENDED:
        # The same refusal as any write outside a transaction; named for what it is: the producer's last
        # transaction ended and no AddPartitionsToTxn has started another (KIP-890's late write).
        return Verdict(Outcome.LATE_WRITE, evidence,
                       f"transaction is {desc.state} and no new one started: a write after EndTxn")
    return Verdict(Outcome.NOT_IN_TRANSACTION, evidence,
                   f"transaction is {desc.state} and {tp[0]}-{tp[1]} is not in it")


NOT_IN_TRANSACTION_ERRORS = frozenset({ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable})
FENCED_ERRORS = frozenset({ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch})


def judge_verify_only(top_error: int, partition_error: int | None, tp: TopicPartition) -> Verdict:
    """The coordinator's AddPartitionsToTxn VerifyOnly answer for one partition, as the broker reads it.

    AddPartitionsToTxnManager: a top-level CLUSTER_AUTHORIZATION_FAILED becomes INVALID_TXN_STATE
    (fail closed); any other top-level error applies to every partition; per partition, NONE means
    "in the ongoing transaction", INVALID_TXN_STATE (TRANSACTION_ABORTABLE from 3.8) means not.
    """
    if top_error == ErrorCode.cluster_authorization_failed:
        return Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR,
                       "the proxy may not send VerifyOnly (it needs CLUSTER_ACTION on the cluster)")
    code = top_error if top_error != ErrorCode.none else partition_error
    if code is None:
        return coordinator_unreachable(f"the coordinator's answer did not name {tp[0]}-{tp[1]}")
    if code == ErrorCode.none:
        return passed(Evidence.COORDINATOR, "VerifyOnly: in the ongoing transaction")
    if code in NOT_IN_TRANSACTION_ERRORS:
        return Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR,
                       f"VerifyOnly answered {error_name(code)}: {tp[0]}-{tp[1]} is not in the transaction")
    if code == ErrorCode.invalid_producer_id_mapping:
        return Verdict(Outcome.PRODUCER_ID_MAPPING, Evidence.COORDINATOR, "VerifyOnly: another or no producer id")
    if code in FENCED_ERRORS:
        return Verdict(Outcome.FENCED, Evidence.COORDINATOR, f"VerifyOnly answered {error_name(code)}")
    # CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, loading, and anything unexpected: retriable.
    return Verdict(Outcome.COORDINATOR_RETRIABLE, Evidence.COORDINATOR,
                   f"VerifyOnly answered {error_name(code)}", error_name(code))


def leader_has_open_transaction(partition_answer: Any, producer_id: int, epoch: int) -> bool:
    """DescribeProducers on the leader: does this producer have an open transaction on the partition?

    That is the broker's own test for "verified already in this transaction"
    (UnifiedLog.hasOngoingTransaction: currentTxnFirstOffset is set, cleared by
    the commit/abort marker).
    """
    if partition_answer.error_code != ErrorCode.none:
        return False
    return any(
        int(p.producer_id) == producer_id and int(p.producer_epoch) == epoch and int(p.current_txn_start_offset) >= 0
        for p in partition_answer.active_producers
    )


def group_partitions(desc: DescribedTransaction) -> Iterable[TopicPartition]:
    return (tp for tp in desc.partitions if tp[0] == "__consumer_offsets")

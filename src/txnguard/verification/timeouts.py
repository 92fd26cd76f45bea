"""Coordinator-side transaction timeouts survived by old clients (the KIP-588 idea), pure.

When a transaction outlives its transaction.timeout.ms, the coordinator aborts it
and bumps the producer epoch (TransactionMetadata.prepareFenceProducerEpoch: epoch
E -> E+1, lastProducerEpoch -1, then PrepareAbort and CompleteAbort). The producer
still at E then meets PRODUCER_FENCED / INVALID_PRODUCER_EPOCH everywhere, and its
KIP-360 bump (InitProducerId with pid X and epoch E) is refused too: the coordinator
accepts an expected epoch only if it is the current one (E+1) or lastProducerEpoch.
KIP-588's TRANSACTION_TIMED_OUT was never shipped (no such error code in Apache Kafka up to 4.2).

The proxy can do what KIP-588 wanted: answer the old client's EndTxn so that it asks
for a bump, and send that bump with the coordinator's epoch E+1 instead of E. The
coordinator's own compare-and-set (prepareIncrementProducerEpoch) then hands X/E+2 to
this producer only if nobody moved the id on since.

When is that safe, i.e. never hiding a real zombie fence?  Epoch E+1 reaches a
producer only through an InitProducerId that bumps E while the id is *not* in an
ongoing transaction (Empty, CompleteCommit, CompleteAbort at E). An InitProducerId
that meets an ongoing transaction at E fences it (E+1, abort, CONCURRENT_TRANSACTIONS
to the caller) and the caller's retry bumps again to E+2. So if this proxy saw the
transaction at (X, E) ongoing (an AddPartitionsToTxn/AddOffsetsToTxn it forwarded was
accepted) and forwarded no EndTxn for it since, then a coordinator at (X, E+1, abort)
means: the transaction was timed out, or fenced by a new producer whose InitProducerId
has not yet returned. Either way nobody holds E+1, and a new producer's next
InitProducerId bumps past whatever this producer gets (it is fenced then, fatally,
as it should be). Anything else (E+2 and later, another producer id, Empty, Ongoing,
a commit) is not a timeout: the request passes untouched and the client meets the
coordinator's own answer. A gateway sees every EndTxn of its clients; a sidecar does
not, so the option needs the gateway's registry (evidence kept until EndTxn).

One more guard against an id the proxy lost track of: the aborted transaction's start
time (DescribeTransactions TransactionStartTimeMs, the coordinator's clock) must not
be later than when this proxy saw it start (`START_SKEW_MS` allowed between clocks).

Which answer makes which client recover is per family (the table below, from the
clients' sources and from runs on Kafka 3.5.2; docs/concepts/timeout-recovery.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.policies.families import JAVA, KAFKA_PYTHON, LIBRDKAFKA, SARAMA

# States the coordinator's abort of a timed-out (or fenced) transaction passes through.
ABORTING = frozenset({"PrepareEpochFence", "PrepareAbort", "CompleteAbort"})
# A proxy answer time against the coordinator's start time: clocks of two hosts.
START_SKEW_MS = 1_000
# Ask the coordinator this long before the proxy's own clock says the timeout passed:
# the coordinator starts the clock when it handles the first add, a little before we see it.
OVERDUE_SLACK_MS = 500


class EndKind(enum.Enum):
    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True)
class EndTxnReply:
    """What a family gets instead of PRODUCER_FENCED for an EndTxn of a timed-out transaction."""

    code: int
    why: str


# family -> EndTxn kind -> the answer that makes the client ask for a KIP-360 bump (InitProducerId with
# its pid and epoch), which the proxy then sends with the coordinator's epoch. Families not listed
# (or kinds not listed) are passed through: the client meets the coordinator's fatal answer.
END_TXN_REPLIES: dict[str, dict[EndKind, EndTxnReply]] = {
    # Java 2.8-3.x, TransactionManager.EndTxnHandler: INVALID_PRODUCER_ID_MAPPING ->
    # abortableErrorIfPossible (epochBumpRequired). The application's abort then sends EndTxn(abort)
    # (seen on 3.5.2: beginCompletingTransaction's InvalidPidMapping shortcut finds lastError
    # cleared by the transition to ABORTING), answered NONE, and InitProducerId(pid, epoch). An
    # abort after any other abortable error (a Produce INVALID_PRODUCER_EPOCH) requires the bump too.
    JAVA: {
        EndKind.COMMIT: EndTxnReply(ErrorCode.invalid_producer_id_mapping,
                                    "commit of a timed-out transaction: abortable, then a bump"),
        EndKind.ABORT: EndTxnReply(ErrorCode.none, "the coordinator already aborted it"),
    },
    # librdkafka rd_kafka_txn_handle_EndTxn: UNKNOWN_PRODUCER_ID -> PERMANENT with require_bump:
    # a commit becomes abortable (txn_requires_abort) with a bump; an abort drains an epoch bump
    # (rd_kafka_idemp_drain_epoch_bump0) and completes when it is done.
    LIBRDKAFKA: {
        EndKind.COMMIT: EndTxnReply(ErrorCode.unknown_producer_id,
                                    "commit of a timed-out transaction: abortable with a bump"),
        EndKind.ABORT: EndTxnReply(ErrorCode.unknown_producer_id, "abort by an epoch bump"),
    },
    # Sarama 1.61 transactionManager.endTxn: UNKNOWN_PRODUCER_ID -> abortableErrorIfPossible
    # (epochBumpRequired; the commit fails with it). finishTransaction(abort) with the bump required
    # sends EndTxn, then initializeTransactions: InitProducerId v4 with its pid and epoch. An abort
    # answered UNKNOWN_PRODUCER_ID would fail and be answered so again: NONE lets it reach the bump.
    SARAMA: {
        EndKind.COMMIT: EndTxnReply(ErrorCode.unknown_producer_id,
                                    "commit of a timed-out transaction: abortable, then a bump"),
        EndKind.ABORT: EndTxnReply(ErrorCode.none, "the coordinator already aborted it"),
    },
    # kafka-python 3.0 EndTxnHandler: every error but the retriable ones is fatal: no reply helps.
    # It bumps on its own after a Produce INVALID_PRODUCER_EPOCH (classify_batch_error
    # NEEDS_EPOCH_BUMP): the InitProducerId rewrite alone serves it.
    # aiokafka 0.14: InitProducerId v0 carries no producer id or epoch (no KIP-360): nothing helps.
}

# family -> the Produce error for a late write (the registry's LATE_WRITE) of a transaction past its
# timeout, instead of the family's usual one. kafka-python 3.0 answers INVALID_PRODUCER_EPOCH with
# its own KIP-360 bump (classify_batch_error NEEDS_EPOCH_BUMP): InitProducerId(pid, E), which the
# proxy claims if the coordinator timed E out, and which otherwise aborts the transaction at the
# coordinator itself (a bump of an ongoing transaction at E). Its usual TRANSACTION_ABORTABLE
# leads to an EndTxn that is fatal for it. The others recover from their usual error already.
PRODUCE_REPLIES: dict[str, int] = {KAFKA_PYTHON: ErrorCode.invalid_producer_epoch}

# InitProducerId carries the producer id and epoch (KIP-360) from v3.
FIRST_BUMP_VERSION = 3


@dataclass(frozen=True)
class Candidate:
    """A transaction this proxy saw ongoing at (producer_id, epoch) that may have timed out."""

    producer_id: int
    epoch: int
    started_ms: int  # when this proxy saw its first add accepted (wall clock)


def end_txn_reply(family: str, committed: bool) -> EndTxnReply | None:
    return END_TXN_REPLIES.get(family, {}).get(EndKind.COMMIT if committed else EndKind.ABORT)


def timed_out(desc: DescribedTransaction | None, candidate: Candidate) -> str | None:
    """Why the coordinator's answer shows this candidate's transaction aborted by the coordinator
    with nobody holding the bumped epoch; None when it does not (pass the request through)."""
    if desc is None or desc.error_code != ErrorCode.none:
        return None
    if desc.producer_id != candidate.producer_id:
        return None  # a new producer id: epochs exhausted, or another producer: not ours to claim
    if desc.producer_epoch != candidate.epoch + 1:
        return None  # E: still ours, the client's own request is right; E+2 and on: a new producer
    if desc.state not in ABORTING:
        return None  # Empty/Ongoing/commit at E+1: someone was handed E+1
    if desc.start_time_ms < 0 or desc.start_time_ms > candidate.started_ms + START_SKEW_MS:
        return None  # an aborted transaction that began after ours: not the one we saw
    return (f"the coordinator aborted the transaction of epoch {candidate.epoch} "
            f"({desc.state} at epoch {desc.producer_epoch}, started {desc.start_time_ms})")

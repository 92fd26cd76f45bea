"""The kinds of check, as types: what a check is about (`Check`), what it must find out first (`Question`) and
what was found out (`Answer`).

A kind is a frozen dataclass of its own; a `Check`, a `Question` or an `Answer` is the union of them. Code
that treats the kinds differently matches on the class and ends in `assert_never`, so that a new kind is a
type error (mypy) wherever it is not handled. (They were once a string, `RequestContext.api == "end_txn"`,
three flags of one `Question`, and one `Answer` of five optional fields whose meaning hung on which were set,
all decoded by if-chains in the rules and in the guard.)

Each kind of `Question` has its own answers, and each answer carries only what that answer has
(`answers(question, answer)` pairs them):

    VerifyPartitions       ─▶ PartitionVerdicts (and the coordinator's description, when it was asked)
    CountOffsetsPartitions ─▶ OffsetsPartitionCount | OffsetsPartitionCountFailed
    DescribeTransaction    ─▶ TransactionDescription | TransactionDescriptionFailed
    AwaitEndTxn            ─▶ EndTxnSettled | EndTxnStillInDoubt

Each kind of `Check` keeps its `api`: the name that log lines, metric labels and audit records have always
given it (tests/unit/test_check_records.py pins them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, assert_never

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.produce import ProducePartition
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.policies.error_mapping import PRODUCE, TXN_OFFSET_COMMIT
from txnguard.verification.verdicts import Verdict

# -- what is checked ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProduceWrite:
    """A transactional Produce (v3-v11): each of its partitions is verified."""

    partitions: tuple[ProducePartition, ...]
    api: ClassVar[str] = PRODUCE


@dataclass(frozen=True, slots=True)
class OffsetCommitWrite:
    """A TxnOffsetCommit (v0-v4): the group's __consumer_offsets partition is verified."""

    group: str
    api: ClassVar[str] = TXN_OFFSET_COMMIT


_HELD_API = {ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", ApiKey.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn"}


@dataclass(frozen=True, slots=True)
class HeldForEndTxn:
    """An AddPartitionsToTxn (v0-3) or AddOffsetsToTxn held while an EndTxn of the same producer id and epoch
    is in doubt: it could land in the transaction this request opens (KAFKA-17754, verification/in_doubt.py)."""

    key: ApiKey

    def __post_init__(self) -> None:
        if self.key not in _HELD_API:
            raise ValueError(f"only AddPartitionsToTxn and AddOffsetsToTxn are held for an EndTxn, not {self.key!r}")

    @property
    def api(self) -> str:
        return _HELD_API[self.key]


@dataclass(frozen=True, slots=True)
class TimedOutEndTxn:
    """An EndTxn of a transaction the proxy saw outlive its timeout (KIP-588 for old clients, timeouts.py)."""

    committed: bool
    api: ClassVar[str] = "end_txn"


@dataclass(frozen=True, slots=True)
class TimedOutInitProducerId:
    """A KIP-360 InitProducerId (an epoch bump) of a transaction the proxy saw outlive its timeout."""

    api: ClassVar[str] = "init_producer_id"


Write = ProduceWrite | OffsetCommitWrite
Check = ProduceWrite | OffsetCommitWrite | HeldForEndTxn | TimedOutEndTxn | TimedOutInitProducerId


# -- what someone with IO must find out first (mitmproxy's blocking command) ----------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyPartitions:
    """Are these partitions in the producer's transaction? The coordinator (VerifyOnly or DescribeTransactions)
    and, with `ask_leader`, DescribeProducers on this connection's broker."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    ask_leader: bool = False
    # While the coordinator can only say "not now", keep asking for this long from the start of
    # verification (verification/hold_limits.py); 0: one question.
    hold_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class CountOffsetsPartitions:
    """How many partitions __consumer_offsets has: a TxnOffsetCommit's first question (once per proxy)."""


@dataclass(frozen=True, slots=True)
class DescribeTransaction:
    """Only the coordinator's DescribeTransactions: did it abort this transaction for its timeout?"""

    transactional_id: str


@dataclass(frozen=True, slots=True)
class AwaitEndTxn:
    """Not a write to verify: wait while an EndTxn of this producer id and epoch, forwarded on another
    connection (not `connection_id`), is unanswered, for at most `hold_ms`. The answer says whether the
    doubt ended (verification/in_doubt.py)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    hold_ms: float
    connection_id: int


Question = VerifyPartitions | CountOffsetsPartitions | DescribeTransaction | AwaitEndTxn


# -- what was found out: the shell's answer, one kind (or two: found, or not) per kind of question --------------------


@dataclass(frozen=True, slots=True)
class PartitionVerdicts:
    """VerifyPartitions: a verdict for each partition asked about, and the coordinator's DescribeTransactions
    answer when it was asked (an "Ongoing" in it is kept as evidence for the generation)."""

    verdicts: dict[TopicPartition, Verdict]
    description: DescribedTransaction | None = None


@dataclass(frozen=True, slots=True)
class OffsetsPartitionCount:
    """CountOffsetsPartitions: __consumer_offsets has this many partitions."""

    partitions: int


@dataclass(frozen=True, slots=True)
class OffsetsPartitionCountFailed:
    """CountOffsetsPartitions: the count could not be read (why: `failure`); the write cannot be verified."""

    failure: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """DescribeTransaction: the coordinator's view of the transaction."""

    description: DescribedTransaction


@dataclass(frozen=True, slots=True)
class TransactionDescriptionFailed:
    """DescribeTransaction: no answer (why: `failure`); nothing proves a timeout, so the request passes."""

    failure: str


@dataclass(frozen=True, slots=True)
class EndTxnSettled:
    """AwaitEndTxn: no EndTxn in doubt can land in the held request's transaction any more (answered or fenced)."""


@dataclass(frozen=True, slots=True)
class EndTxnStillInDoubt:
    """AwaitEndTxn: the hold's bound passed with an EndTxn of this producer id and epoch still unanswered."""


Answer = (PartitionVerdicts | OffsetsPartitionCount | OffsetsPartitionCountFailed | TransactionDescription
          | TransactionDescriptionFailed | EndTxnSettled | EndTxnStillInDoubt)


def answers(question: Question, answer: Answer) -> bool:
    """Whether `answer` is one of the answers `question` can have."""
    match question:
        case VerifyPartitions():
            return isinstance(answer, PartitionVerdicts)
        case CountOffsetsPartitions():
            return isinstance(answer, OffsetsPartitionCount | OffsetsPartitionCountFailed)
        case DescribeTransaction():
            return isinstance(answer, TransactionDescription | TransactionDescriptionFailed)
        case AwaitEndTxn():
            return isinstance(answer, EndTxnSettled | EndTxnStillInDoubt)
        case _:
            assert_never(question)

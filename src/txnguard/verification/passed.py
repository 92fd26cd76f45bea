"""What a write passed on local evidence leaves for the shell to record: one named record per request.

The relay's fast path (connection/relay.py) asks the rules (`TransactionRules.pass_produce_locally`,
`pass_offset_commit_locally`) to pass a transactional Produce whose partitions all have local evidence, or
a TxnOffsetCommit whose group has, without a `Decision`: what that decision's `Decided` would have made the
shell record (metrics, an audit record per partition or group) is one of these records, which the core books
in its ledger (connection/ledger.py) and the shell records in batches (proxy/guard.py, `record_fast`).

NamedTuples: built once per write on the hot path, where a tuple is the cheapest record there is.
"""

from __future__ import annotations

from typing import NamedTuple

from txnguard.codecs.topic_partition import TopicPartition
from txnguard.policies.enforcement import Enforcement
from txnguard.verification.audit import ClientInfo
from txnguard.verification.verdicts import Verdict


class Passed(NamedTuple):
    """A transactional Produce passed on local evidence (its `Decision` would have had one "forwarded" record
    per partition)."""

    client: ClientInfo
    transactional_id: str
    producer_id: int
    producer_epoch: int
    api_version: int
    partitions: list[TopicPartition]
    verdict: Verdict           # the verdict every partition got
    mode: Enforcement
    inspection_ms: float       # reading the request, before verification starts
    verification_ms: float     # VerificationTimeMs
    cpu_ms: float | None       # thread CPU time; None when not measured
    time_ms: int               # the decision's wall-clock time (the record's time when recorded later)
    decided_at: float          # Clock.perf when decided: the check-to-append window opens


class PassedOffsets(NamedTuple):
    """A TxnOffsetCommit (v0-v4) passed on local evidence: as `Passed`, with the group instead of the partitions
    (its `Decision` would have had one "forwarded" record, target "group:<id>"), and its place in the ledger."""

    client: ClientInfo
    transactional_id: str
    producer_id: int
    producer_epoch: int
    api_version: int
    group: str
    verdict: Verdict
    mode: Enforcement
    inspection_ms: float
    verification_ms: float
    cpu_ms: float | None
    time_ms: int
    decided_at: float
    place: int                 # how many `Passed` of the same ledger were booked before it


class Unchecked:
    """What `pass_offset_commit_locally` says of a request the policy leaves unchecked: forwarded as it is,
    nothing recorded (as the general path's `Decision` without a context)."""

    __slots__ = ()


UNCHECKED = Unchecked()

"""What each rejected write would have done to the cluster without the proxy.

Keyed on the verification outcome (`txnguard.policies.outcomes.Outcome`, values as the audit record
writes them) and the API: the same outcome means a different incident for a Produce and for a
TxnOffsetCommit. The scenarios named (S1, S2, S5) are those of the verification tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from txnguard.policies.outcomes import Outcome

ANY_API = "*"


@dataclass(frozen=True, slots=True)
class Incident:
    name: str
    consequence: str


INCIDENTS: dict[tuple[str, str], Incident] = {
    (Outcome.NOT_IN_TRANSACTION.value, "produce"): Incident(
        "hanging_transaction",
        "a transactional write to a partition never added to the transaction: no marker would ever end it, "
        "the partition's last stable offset stops and read_committed consumers stall (S1)"),
    (Outcome.NOT_IN_TRANSACTION.value, "txn_offset_commit"): Incident(
        "hanging_offset_commit",
        "offsets committed for a group never added to the transaction: they would stay pending with no marker "
        "to complete them, and the group's offsets stop moving (S5)"),
    (Outcome.LATE_WRITE.value, ANY_API): Incident(
        "late_write",
        "a write after EndTxn with no new AddPartitionsToTxn: it would open a transaction nobody ends (hanging) "
        "or join the next one, so aborted data is read as committed (S2)"),
    (Outcome.FENCED.value, ANY_API): Incident(
        "zombie_write",
        "a producer fenced by a newer epoch (a zombie instance) would write beside its successor"),
    (Outcome.PRODUCER_ID_MAPPING.value, ANY_API): Incident(
        "unknown_producer",
        "the coordinator does not map this transactional id to this producer id (expired or reassigned): "
        "the write would belong to no transaction"),
    (Outcome.COORDINATOR_RETRIABLE.value, ANY_API): Incident(
        "unverified_write",
        "the coordinator could not confirm the transaction (unavailable, loading, preparing): the write was "
        "held back for a retry instead of landing unverified"),
    # Spelled as the audit record writes it: the outcome is newer than some proxies that feed this pipeline.
    ("invalid_record", ANY_API): Incident(
        "invalid_batch",
        "a record batch the proxy cannot read (truncated, or its length inconsistent): the broker refuses it "
        "too (INVALID_RECORD), so nothing is prevented but the client is told why"),
}

# Keyed on the decision, before the outcome: a decision that is itself the incident, whatever the verdict said.
BY_DECISION: dict[str, Incident] = {
    # verification/decisions.py TIMEOUT_RECOVERED (policy.timeout_recovery, verification/timeouts.py): the verdict
    # is "fenced" (the coordinator bumped the epoch when it aborted the timed-out transaction), but no zombie.
    "timeout_recovered": Incident(
        "coordinator_timeout_recovered",
        "the coordinator aborted a transaction that outlived its timeout and fenced its epoch: the old client would "
        "have met PRODUCER_FENCED and died (KIP-588 never shipped); the proxy answered so that it re-initialised "
        "with the coordinator's epoch and carried on"),
}
# The decisions in which the proxy acted (the others, monitor mode's forwarded_unenforced, only observed).
ACTED = ("rejected", "timeout_recovered")

UNCLASSIFIED = Incident("unclassified", "an outcome this pipeline version does not know")


def classify(outcome: str, api: str, decision: str | None = None) -> Incident:
    return ((BY_DECISION.get(decision) if decision else None) or INCIDENTS.get((outcome, api))
            or INCIDENTS.get((outcome, ANY_API)) or UNCLASSIFIED)


def prevented(decision: str) -> bool:
    return decision in ACTED

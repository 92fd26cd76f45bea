"""What a verification can conclude, and from which evidence.

Outcomes are named after what the transaction coordinator would say (KIP-890,
AddPartitionsToTxnManager); the policies turn them into the error a given
client family should see.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txnguard.policies.outcomes import Outcome

__all__ = ["Evidence", "Outcome", "Verdict", "passed"]


class Evidence(enum.Enum):
    LOCAL = "local"              # an AddPartitionsToTxn/AddOffsetsToTxn/EndTxn this proxy forwarded
    LOG = "log"                  # the coordinator's own log, __transaction_state, as this proxy's follower read it
    LEADER = "leader"            # DescribeProducers on the partition leader: an open transaction there
    COORDINATOR = "coordinator"  # DescribeTransactions answered now
    CACHE = "cache"              # a coordinator answer within its staleness bound
    REQUEST = "request"          # the request itself decides (more than one producer id)
    NONE = "none"                # none could be had: the coordinator lacks DescribeTransactions (Kafka < 3.0)


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    evidence: Evidence
    detail: str = ""          # why, in words, for logs and the audit record
    underlying: str | None = None  # the coordinator's error name, for NOT_ENOUGH_REPLICAS messages

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS


def passed(evidence: Evidence, detail: str = "") -> Verdict:
    return Verdict(Outcome.PASS, evidence, detail)

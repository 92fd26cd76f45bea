"""Which partitions of a request need verification, and what the proxy can decide without asking.

KIP-890 part 1 applies to transactional Produce up to v11 and TxnOffsetCommit
up to v4; from Produce v12 / TxnOffsetCommit v5 (transaction version 2) the
broker adds the partition itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txnguard.codecs.produce import ProducePartition
from txnguard.verification.outcomes import Evidence, Outcome, Verdict
from txnguard.verification.registry import Registry

TopicPartition = tuple[str, int]

LAST_PRODUCE_VERSION_BEFORE_TV2 = 11
LAST_TXN_OFFSET_COMMIT_VERSION_BEFORE_TV2 = 4


@dataclass
class ProducePlan:
    producer_id: int = -1
    producer_epoch: int = -1
    verdicts: dict[TopicPartition, Verdict] = field(default_factory=dict)
    pending: list[TopicPartition] = field(default_factory=list)   # someone must be asked
    unverified: list[TopicPartition] = field(default_factory=list)  # no transactional batch: nothing to verify

    @property
    def complete(self) -> bool:
        return not self.pending


def plan_produce(registry: Registry, txn_id: str, partitions: list[ProducePartition], now_ms: int) -> ProducePlan:
    plan = ProducePlan()
    txn_parts = [p for p in partitions if p.transactional_heads]
    plan.unverified = [(p.topic, p.partition) for p in partitions if not p.transactional_heads]
    if not txn_parts:
        return plan
    producers = {(h.producer_id, h.producer_epoch) for p in txn_parts for h in p.transactional_heads}
    if len({pid for pid, _ in producers}) > 1:
        # ReplicaManager: "Transactional records contained more than one producer ID" fails the
        # whole request, so every partition gets the error, transactional or not.
        v = Verdict(Outcome.PRODUCER_ID_MAPPING, Evidence.REQUEST,
                    "transactional records contained more than one producer id")
        plan.verdicts = {(p.topic, p.partition): v for p in partitions}
        plan.unverified = []
        return plan
    head = txn_parts[0].transactional_heads[0]
    plan.producer_id, plan.producer_epoch = head.producer_id, head.producer_epoch
    for p in txn_parts:
        tp = (p.topic, p.partition)
        local = registry.local_verdict(txn_id, plan.producer_id, plan.producer_epoch, tp, now_ms)
        if local is None:
            plan.pending.append(tp)
        else:
            plan.verdicts[tp] = local
    return plan

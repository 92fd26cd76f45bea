"""Of the coordinator's descriptions that come with a passing verdict, only "Ongoing" is kept as evidence for
the transaction's next writes (`TransactionRules._remember`): a transaction the coordinator is committing or
aborting takes no more writes, so the next one is asked about again, never passed on that answer.

    client ─Produce[orders-0]─▶ rules ─VerifyPartitions(orders-0)─▶ shell
                                      ◀─PartitionVerdicts(orders-0 passed; coordinator: PrepareCommit)─
           ◀────────── forwarded ──────────┘
    client ─Produce[orders-0]─▶ rules ─VerifyPartitions(orders-0)─▶ shell      asked again, not decided here

Each with evidence_ttl_ms 60 s and unset. With 60 s an "Ongoing" in the same sequence is kept (the control at
the end) and the second write comes well inside the bound, so only the state sends it to the coordinator again;
dropping the state check from `_remember` fails these cases. Unset, the registry keeps no given answer at all
today, so that case guards against a registry that keeps them without a bound (as it did before cb7a1aa).
"""

from __future__ import annotations

import pytest
from connection_playbook import EPOCH, PID, T0, TXN, FakeClock, produce

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.policies.families import JAVA
from txnguard.policies.policy import policy_from_config
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import PartitionVerdicts, VerifyPartitions
from txnguard.verification.decisions import Decision, PendingCheck, TransactionRules
from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.verdicts import Evidence, passed

CLIENT = ClientInfo("c", None, None, JAVA, "bootstrap", 2)
TIMEOUT_MS = 60_000
LIMITS = [pytest.param(RegistryLimits(evidence_ttl_ms=None), id="no-ttl"),
          pytest.param(RegistryLimits(evidence_ttl_ms=60_000), id="ttl-60s")]


def _first_write_verified_with(limits: RegistryLimits, state: str) -> tuple[TransactionRules, FakeClock, Decision]:
    """InitProducerId seen, no AddPartitionsToTxn: the first write is asked about, and the answer is a passing
    verdict for orders-0 with the coordinator's description of the transaction in `state`."""
    clock = FakeClock()
    rules = TransactionRules(Registry(limits), policy_from_config({}))
    rules.registry.init_producer_id(TXN, PID, EPOCH, TIMEOUT_MS, clock.wall_ms())
    pending = rules.check_produce(memoryview(produce(1, [T0])), 9, CLIENT, clock)
    assert isinstance(pending, PendingCheck) and isinstance(pending.question, VerifyPartitions), pending
    described = DescribedTransaction(0, TXN, state, TIMEOUT_MS, clock.wall_ms(), PID, EPOCH, frozenset({T0}))
    clock.seconds += 0.001
    first = rules.resume(pending, PartitionVerdicts({T0: passed(Evidence.COORDINATOR)}, described), clock)
    assert isinstance(first, Decision) and first.rejections == {} and first.forward is not None, first
    clock.seconds += 0.001
    return rules, clock, first


@pytest.mark.parametrize("limits", LIMITS)
@pytest.mark.parametrize("state", ["PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Empty"])
def test_a_passing_verdict_beside_a_transaction_not_ongoing_is_not_kept_and_the_next_write_is_asked_again(
        limits: RegistryLimits, state: str) -> None:
    rules, clock, _ = _first_write_verified_with(limits, state)
    again = rules.check_produce(memoryview(produce(2, [T0])), 9, CLIENT, clock)
    assert isinstance(again, PendingCheck) and isinstance(again.question, VerifyPartitions), (
        f"a write after the coordinator described the transaction as {state} was decided here: {again}")


def test_the_same_answer_with_the_transaction_ongoing_is_kept_within_the_bound() -> None:
    """The control: the sequence above does keep a coordinator's answer when it says "Ongoing", so the test
    above fails if the state stops mattering."""
    rules, clock, _ = _first_write_verified_with(RegistryLimits(evidence_ttl_ms=60_000), "Ongoing")
    again = rules.check_produce(memoryview(produce(2, [T0])), 9, CLIENT, clock)
    assert isinstance(again, Decision), again
    assert [(r.target, r.verdict.evidence) for r in again.records] == [("orders-0", Evidence.CACHE)]

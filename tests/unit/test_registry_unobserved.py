"""The registry never decides on what it did not observe (a default timeout, its own clock, an old answer).

Each test is a playbook with a fake clock (milliseconds): what one proxy saw of a client's transaction, what
it did not see (a restart, another gateway, an eviction), and the verdict a write then gets. "Ask" (None) is
always safe: the coordinator decides. A refusal on local evidence is right only after an EndTxn this
process forwarded.
"""

from txnguard.verification.registry import Phase, Registry, RegistryLimits
from txnguard.verification.verdicts import Evidence, Outcome

P0 = ("orders", 0)
P1 = ("orders", 1)
MINUTE = 60_000


def test_a_gateway_restarted_mid_transaction_never_ends_it_on_a_timeout_it_did_not_see():
    """    client ─InitProducerId(timeout 180 s), AddPartitions P0─▶ gateway (before the restart: not this registry)
           client ─AddPartitions P1─▶ restarted gateway      (no InitProducerId seen: the timeout is unknown)
           … 70 s of writes, every 10 s …
           client ─Produce P1─▶ passes on local evidence; P0 ─▶ asked; never a late write"""
    r = Registry()
    r.added("app", 7, 0, 0, partitions={P1})
    for now in range(10_000, 100_001, 10_000):
        r.expire(now)
        assert r.local_verdict("app", 7, 0, P1, now) is not None, now
        assert r.local_verdict("app", 7, 0, P1, now).passed, now  # type: ignore[union-attr]
        assert r.local_verdict("app", 7, 0, P0, now) is None, now


def test_a_timeout_it_observed_drops_the_evidence_but_refuses_nothing_alone():
    """    client ─InitProducerId(timeout 1 s), AddPartitions P0─▶ gateway
           … 1.2 s, no EndTxn …  the coordinator aborts it (or is about to): the evidence is gone
           client ─Produce P0─▶ asked (the coordinator's answer decides), not refused as a late write"""
    r = Registry()
    r.init_producer_id("app", 7, 0, 1000, 0)
    r.added("app", 7, 0, 100, partitions={P0})
    r.expire(1200)
    assert r.get("app").phase is not Phase.ONGOING  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 0, P0, 1300) is None


def test_the_timeout_a_coordinator_reported_is_the_one_the_registry_keeps():
    r = Registry()
    r.added("app", 7, 0, 0, partitions={P1})
    r.coordinator_says_ongoing("app", 7, 0, -5000, {P0, P1}, set(), now_ms=10, timeout_ms=180_000)
    assert r.get("app").timeout_ms == 180_000  # type: ignore[union-attr]
    r.expire(170_000)
    assert r.local_verdict("app", 7, 0, P1, 170_000).passed  # type: ignore[union-attr]


def test_passed_writes_keep_a_record_alive_idle_expiry_counts_from_the_last_write():
    """    client ─AddPartitions P0─▶ (t = 0)   … writes pass every 5 minutes …   at t = 20 min: still known"""
    r = Registry(RegistryLimits(idle_expiry_ms=15 * MINUTE))
    r.init_producer_id("app", 7, 0, 60 * MINUTE, 0)
    r.added("app", 7, 0, 0, partitions={P0})
    for now in range(5 * MINUTE, 20 * MINUTE + 1, 5 * MINUTE):
        assert r.passes_locally("app", 7, 0, [P0], now) is not None, now  # the relay's fast path
        r.expire(now)
    assert r.local_verdict("app", 7, 0, P0, 20 * MINUTE) is not None  # the general path
    r.expire(34 * MINUTE)
    assert r.get("app") is not None
    r.expire(36 * MINUTE)  # 16 minutes after the last write
    assert r.get("app") is None


def test_an_id_evicted_and_seen_again_is_never_refused_on_a_default():
    """    registry full: the id evicted (least recently seen)
           client ─AddPartitions P1─▶ a new record, no InitProducerId seen
           … 70 s …  client ─Produce P1─▶ passes; nothing is a late write"""
    r = Registry(RegistryLimits(max_entries=2))
    r.init_producer_id("app", 7, 0, 180_000, 0)
    r.added("app", 7, 0, 0, partitions={P0})
    r.init_producer_id("b", 8, 0, 60_000, 1)
    r.init_producer_id("c", 9, 0, 60_000, 2)
    assert r.get("app") is None
    assert r.local_verdict("app", 7, 0, P0, 3) is None  # asked, not refused
    r.added("app", 7, 0, 10, partitions={P1})
    r.expire(80_000)
    v = r.local_verdict("app", 7, 0, P1, 80_000)
    assert v is not None and v.passed and v.evidence is Evidence.LOCAL, v


def test_a_coordinator_answer_is_bounded_evidence_in_a_gateway_too():
    """    client ─Init, AddPartitions P0, EndTxn(commit)─▶ gateway A (unseen here)
           client ─Produce P0─▶ gateway B ─DescribeTransactions─▶ Ongoing {P0}: passes
           … A commits …
           client ─Produce P0 (a late write)─▶ gateway B: asked again, not passed on the old answer"""
    r = Registry()  # a gateway's limits: observed evidence lasts until the EndTxn it forwards
    r.coordinator_says_ongoing("app", 7, 0, 1000, {P0}, set(), now_ms=0, timeout_ms=60_000)
    assert r.local_verdict("app", 7, 0, P0, 5_000) is None
    assert r.passes_locally("app", 7, 0, [P0], 5_000) is None


def test_what_this_gateway_forwarded_lasts_beside_a_coordinator_answer():
    """    client ─AddPartitions P0─▶ this gateway ✓ (observed)
           client ─Produce P1 (added elsewhere)─▶ asked: Ongoing {P0, P1}
           client ─Produce P0─▶ local evidence, still; P1 ─▶ asked again"""
    r = Registry()
    r.init_producer_id("app", 7, 0, 60_000, 0)
    r.added("app", 7, 0, 1, partitions={P0})
    r.coordinator_says_ongoing("app", 7, 0, 1, {P0, P1}, set(), now_ms=2, timeout_ms=60_000)
    later = 50_000
    v = r.local_verdict("app", 7, 0, P0, later)
    assert v is not None and v.passed and v.evidence is Evidence.LOCAL, v
    assert r.passes_locally("app", 7, 0, [P0], later) is not None
    assert r.local_verdict("app", 7, 0, P1, later) is None


def test_a_late_write_on_local_evidence_needs_an_end_txn_this_process_forwarded():
    r = Registry()
    r.added("app", 7, 0, 0, partitions={P0})
    r.expire(10 * MINUTE)
    assert r.local_verdict("app", 7, 0, P0, 10 * MINUTE) is not None  # no EndTxn: never late
    assert r.local_verdict("app", 7, 0, P0, 10 * MINUTE).outcome is Outcome.PASS  # type: ignore[union-attr]
    r.end_txn("app", 7, 0, 10 * MINUTE + 1)
    v = r.local_verdict("app", 7, 0, P0, 10 * MINUTE + 2)
    assert v is not None and v.outcome is Outcome.LATE_WRITE

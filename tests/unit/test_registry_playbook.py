"""The registry and the local rules, as sequences of what the proxy observed.

Each test is a little playbook: the requests and answers a client exchanged,
then the question a Produce asks, then the verdict.
"""

from txnguard.verification.registry import Phase, Registry, RegistryLimits
from txnguard.verification.verdicts import Evidence, Outcome

T = ("orders", 0)
U = ("orders", 1)


def test_added_partition_passes_with_local_evidence():
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, now_ms=0)
    r.added("app", 7, 0, 10, partitions={T})
    v = r.local_verdict("app", 7, 0, T, 20)
    assert v is not None and v.passed and v.evidence is Evidence.LOCAL


def test_a_partition_not_added_is_not_decided_locally():
    # The proxy may not have seen every add (a restart, another proxy): the coordinator decides.
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, 0)
    r.added("app", 7, 0, 10, partitions={T})
    assert r.local_verdict("app", 7, 0, U, 20) is None


def test_after_end_txn_a_write_is_late_without_asking_anyone():
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, 0)
    r.added("app", 7, 0, 10, partitions={T})
    r.end_txn("app", 7, 0, 30)
    v = r.local_verdict("app", 7, 0, T, 40)
    assert v is not None and v.outcome is Outcome.LATE_WRITE


def test_the_next_transaction_with_the_same_epoch_starts_a_new_generation():
    # Old clients keep their epoch: evidence of transaction 1 must not carry into transaction 2.
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, 0)
    r.added("app", 7, 0, 1, partitions={T, U})
    r.end_txn("app", 7, 0, 2)
    r.added("app", 7, 0, 3, partitions={U})
    rec = r.get("app")
    assert rec is not None and rec.generation == 2 and rec.partitions == {U}
    assert r.local_verdict("app", 7, 0, T, 4) is None        # T was in the old generation only
    assert r.local_verdict("app", 7, 0, U, 4).passed          # type: ignore[union-attr]


def test_an_older_epoch_is_fenced():
    r = Registry()
    r.init_producer_id("app", 7, 3, 60000, 0)
    v = r.local_verdict("app", 7, 2, T, 1)
    assert v is not None and v.outcome is Outcome.FENCED


def test_init_producer_id_resets_evidence():
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, 0)
    r.added("app", 7, 0, 1, partitions={T})
    r.init_producer_id("app", 7, 1, 60000, 2)
    assert r.get("app").phase is Phase.EMPTY  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 1, T, 3) is None


def test_a_transaction_past_its_timeout_loses_its_evidence():
    r = Registry()
    r.init_producer_id("app", 7, 0, 1000, 0)
    r.added("app", 7, 0, 100, partitions={T})
    r.expire(now_ms=1200)
    assert r.get("app").phase is Phase.TIMED_OUT  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 0, T, 1300) is None  # asked: no evidence, and no refusal on our clock


def test_idle_ids_expire_and_size_is_bounded():
    r = Registry(RegistryLimits(max_entries=3, idle_expiry_ms=1000))
    for i in range(5):
        r.init_producer_id(f"id-{i}", i, 0, 60000, i)
    assert len(r) == 3 and r.get("id-0") is None
    assert r.expire(now_ms=5000) == 3 and len(r) == 0


def test_sidecar_evidence_expires_after_its_staleness_bound():
    r = Registry(RegistryLimits(evidence_ttl_ms=50))
    r.coordinator_says_ongoing("app", 7, 0, 1000, {T}, set(), now_ms=0)
    assert r.local_verdict("app", 7, 0, T, 40).evidence is Evidence.CACHE  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 0, T, 60) is None


def test_a_coordinator_answer_for_a_new_transaction_replaces_the_old_generation():
    r = Registry()
    r.coordinator_says_ongoing("app", 7, 0, start_ms=1000, partitions={T}, groups_partitions=set(), now_ms=0)
    r.coordinator_says_ongoing("app", 7, 0, start_ms=2000, partitions={U}, groups_partitions=set(), now_ms=1)
    assert r.get("app").described == {U}  # type: ignore[union-attr]


def test_the_group_added_by_add_offsets_covers_its_offsets_partition():
    r = Registry()
    r.init_producer_id("app", 7, 0, 60000, 0)
    r.added("app", 7, 0, 1, group="g")
    assert r.local_verdict("app", 7, 0, ("__consumer_offsets", 3), 2, group="g").passed  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 0, ("__consumer_offsets", 3), 2, group="other") is None


def test_a_sidecar_never_infers_a_late_write_from_its_own_clock():
    # leader's sidecar ─DescribeTransactions─▶ coordinator: Ongoing {T}          (cached for 0 ms)
    #                    … the transaction commits through the coordinator's sidecar (unseen here)
    #                    … its timeout passes: the registry drops its evidence by the clock
    # client ─Produce T (the next transaction, added through the coordinator's sidecar)─▶ leader's sidecar
    #                    ─▶ not decided here: asked (it was refused as a late write before)
    r = Registry(RegistryLimits(evidence_ttl_ms=0))
    r.coordinator_says_ongoing("app", 7, 0, 1000, {T}, set(), now_ms=0, timeout_ms=60_000)
    r.expire(now_ms=61_000)
    assert r.get("app").phase is Phase.TIMED_OUT  # type: ignore[union-attr]
    assert r.local_verdict("app", 7, 0, T, 120_000) is None


def test_a_seen_end_txn_is_evidence_of_a_late_write_only_within_the_staleness_bound():
    for limits, at, late in [(RegistryLimits(), 10**9, True),                 # gateway: until the next add
                             (RegistryLimits(evidence_ttl_ms=50), 40, True),  # within the bound
                             (RegistryLimits(evidence_ttl_ms=50), 60, False),  # past it: the coordinator decides
                             (RegistryLimits(evidence_ttl_ms=0), 0, False)]:  # sidecar default: never alone
        r = Registry(limits)
        r.init_producer_id("app", 7, 0, 60_000, 0)
        r.added("app", 7, 0, 0, partitions={T})
        r.end_txn("app", 7, 0, 0)
        v = r.local_verdict("app", 7, 0, T, at)
        assert (v is not None and v.outcome is Outcome.LATE_WRITE) is late, (limits, at, v)
        if not late:
            assert v is None

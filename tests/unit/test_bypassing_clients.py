"""Clients that bypass the proxy: ids active in the coordinator's log that the proxy never saw (pure).

    client A ─InitProducerId─▶ proxy ─▶ coordinator ─▶ __transaction_state: A Empty     (registry: A seen)
    client B ─InitProducerId───────────▶ coordinator ─▶ __transaction_state: B Empty     (never through the proxy)
    follower ─reads the log─▶ view {A, B}            gauge: |active(view) - seen| = 1 (B)
    audit    ─every interval─▶ one transaction_log_id record per active id, B (unseen) first
"""

from __future__ import annotations

from txnguard.codecs.transaction_log import LogRecord, TxnLogValue
from txnguard.testing.transaction_log_writer import key, value
from txnguard.verification.audit import TRANSACTION_LOG_ID, transaction_log_id_record
from txnguard.verification.bypass import ACTIVE_WITHIN_MS, SeenIds, listing, unseen_count
from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.transaction_log_view import TransactionLogView

NOW = 1_700_000_000_000
HOUR = 3_600_000


def state(name: str, *, age_ms: int = 1000, pid: int = 7) -> TxnLogValue:
    return TxnLogValue(pid, 0, 60_000, name, frozenset(), NOW - age_ms, -1)


def log_of(*changes: tuple[str, TxnLogValue | None]) -> TransactionLogView:
    """The follower's view, fed these records in order (None: a tombstone)."""
    view = TransactionLogView()
    for offset, (txn_id, v) in enumerate(changes):
        view.apply(0, LogRecord(offset, key(txn_id), None if v is None else value(v)))
    return view


def seen_through_registry(*txn_ids: str) -> tuple[Registry, SeenIds]:
    registry = Registry()
    registry.seen = SeenIds()
    for txn_id in txn_ids:  # client ─InitProducerId─▶ proxy: answered, the registry learns the id
        registry.init_producer_id(txn_id, 1, 0, 60_000, NOW)
    return registry, registry.seen


def test_an_id_in_the_log_the_proxy_never_saw_is_counted_and_one_it_saw_is_not():
    view = log_of(("proxied", state("Ongoing")), ("direct", state("CompleteCommit")))
    _, seen = seen_through_registry("proxied")
    assert unseen_count(view, seen, NOW) == 1
    assert [i.transactional_id for i in listing(view, seen, NOW, 10).ids if not i.seen] == ["direct"]


def test_every_live_state_is_active_and_dead_tombstoned_or_stale_ids_are_not():
    view = log_of(("empty", state("Empty")), ("ongoing", state("Ongoing")), ("prepare", state("PrepareAbort")),
                  ("committed", state("CompleteCommit")), ("fenced", state("PrepareEpochFence")),
                  ("dead", state("Dead")),                                  # the coordinator's last word
                  ("expired", state("CompleteAbort")), ("expired", None),   # a tombstone: the id is gone
                  ("stopped", state("CompleteCommit", age_ms=ACTIVE_WITHIN_MS + 1)))  # no record for over a day
    assert unseen_count(view, SeenIds(), NOW) == 5
    assert {i.transactional_id for i in listing(view, SeenIds(), NOW, 10).ids} == {
        "empty", "ongoing", "prepare", "committed", "fenced"}


def test_an_id_stays_seen_after_the_registry_forgets_it():
    registry, seen = seen_through_registry("proxied")
    assert registry.expire(NOW + 2 * HOUR) == 1 and len(registry) == 0  # idle past the registry's 15 minutes
    view = log_of(("proxied", state("CompleteCommit", age_ms=-2 * HOUR + 1000)))
    assert unseen_count(view, seen, NOW + 2 * HOUR) == 0


def test_the_seen_ids_are_bounded_and_the_least_recently_seen_go_first():
    seen = SeenIds(max_entries=2)
    for txn_id in ("a", "b", "a", "c"):  # "a" seen again after "b": "b" is the least recently seen
        seen.see(txn_id)
    assert len(seen) == 2 and "a" in seen and "c" in seen and "b" not in seen and seen.evicted == 1


def test_the_registry_bounded_below_the_seen_ids_keeps_its_evicted_ids_seen():
    registry = Registry(RegistryLimits(max_entries=1))
    registry.seen = SeenIds(max_entries=10)
    registry.init_producer_id("a", 1, 0, 60_000, NOW)
    registry.init_producer_id("b", 2, 0, 60_000, NOW)  # evicts "a" from the registry
    assert len(registry) == 1 and "a" in registry.seen and "b" in registry.seen


def test_a_round_is_capped_lists_the_unseen_first_newest_first_and_counts_what_it_left_out():
    view = log_of(("seen-new", state("Ongoing", age_ms=10)), ("old", state("CompleteCommit", age_ms=HOUR)),
                  ("new", state("Ongoing", age_ms=20)), ("seen-old", state("Empty", age_ms=HOUR)))
    _, seen = seen_through_registry("seen-new", "seen-old")
    everything = listing(view, seen, NOW, 10)
    assert [(i.transactional_id, i.seen) for i in everything.ids] == [
        ("new", False), ("old", False), ("seen-new", True), ("seen-old", True)]
    capped = listing(view, seen, NOW, 3)
    assert [i.transactional_id for i in capped.ids] == ["new", "old", "seen-new"]
    assert (capped.active, capped.omitted) == (4, 1)


def test_the_audit_record_carries_the_logs_state_and_whether_this_proxy_saw_it():
    view = log_of(("direct", state("CompleteCommit", pid=42)))
    found = listing(view, SeenIds(), NOW, 10)
    record = transaction_log_id_record(time_ms=NOW, proxy_id="gateway@gw:9092", log_id=found.ids[0],
                                       active_ids=found.active, omitted_ids=found.omitted)
    assert record == {"schema_version": 2, "kind": TRANSACTION_LOG_ID, "proxy_id": "gateway@gw:9092", "time_ms": NOW,
                      "transactional_id": "direct", "producer_id": 42, "producer_epoch": 0,
                      "coordinator_state": "CompleteCommit", "last_update_ms": NOW - 1000, "seen_by_proxy": False,
                      "active_ids": 1, "omitted_ids": 0}


def test_a_registry_without_seen_ids_works_as_before():
    registry = Registry()
    registry.init_producer_id("a", 1, 0, 60_000, NOW)
    assert registry.seen is None and len(registry) == 1

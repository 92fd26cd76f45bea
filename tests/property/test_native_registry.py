"""Hypothesis: the native registry answers as the Python one, over any history of what a proxy observes.

Both registries get the same calls, in the same order, at the same times: every answer, every record, the order
eviction follows, and the ids each told its `seen`, must be equal after every call. The Python registry is the
oracle here (as kio is for the native readers) and the fallback where the native module is missing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

# `make test` builds the native module; without it this import fails, and so does the run (not a skip).
from txnguard.verification.registry import NativeRegistry, PythonRegistry, RegistryLimits

IDS = ["a", "b", "c"]
PARTS = [("t", 0), ("t", 1), ("u", 0)]
# (id, producer id, epoch): mostly each id's own producer at epoch 0, so that histories pass writes; sometimes a
# bumped epoch, an older one, another producer, or none (-1).
txn = st.sampled_from([("a", 1, 0)] * 4 + [("b", 2, 0)] * 3 + [("c", 3, 0)] * 2
                      + [("a", 1, 1), ("a", 1, -1), ("a", 2, 0), ("b", -1, 0), ("c", 3, 1)])
parts = st.frozensets(st.sampled_from(PARTS), min_size=1, max_size=2)
# Times from a few round values, so that the bounds' edges (an age equal to a limit) come up often.
STEPS = [0, 1, 10, 100, 500, 1000]
later = st.sampled_from(STEPS)  # ms since the previous call
within = st.sampled_from([0, 1, 10, 100, 500, 1000, 2000, 5000])

added = st.tuples(st.just("added"), txn, later, parts, st.none() | st.sampled_from(["g", "h"]))
passes = st.tuples(st.just("passes_locally"), txn, st.lists(st.sampled_from(PARTS), min_size=1, max_size=2), later)
call = st.one_of(
    added, added, passes, passes,  # a transaction's adds and writes, most often
    st.tuples(st.just("init_producer_id"), txn, within, later),
    st.tuples(st.just("request_timeout"), st.sampled_from(IDS), within),
    st.tuples(st.just("end_txn"), txn, later),
    st.tuples(st.just("coordinator_says_ongoing"), txn, st.integers(0, 3), parts, parts, later,
              st.none() | st.just(-1) | within),
    st.tuples(st.just("expire"), later),
    st.tuples(st.just("timeout_candidate"), txn, later),
    st.tuples(st.just("local_verdict"), txn, st.sampled_from(PARTS), later, st.none() | st.sampled_from(["g", "h"])),
)
# Mostly long enough for a transaction to get to its writes; sometimes short enough to cut it.
limits = st.builds(RegistryLimits, max_entries=st.integers(1, 4),
                   idle_expiry_ms=st.sampled_from([10, 1000, 2000, 10**6, 10**6]),
                   evidence_ttl_ms=st.none() | st.sampled_from([0, 100, 1000, 2000]))


class Told:
    """A registry's `seen`: the ids it was told, in order."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def see(self, txn_id: str) -> None:
        self.ids.append(txn_id)


def _apply(registry: Any, step: tuple[Any, ...], now: int) -> tuple[int, Any]:
    """Make one call on `registry`; (the time after it, its answer)."""
    name = step[0]
    match step:
        case ("init_producer_id", (txn_id, pid, epoch), timeout_ms, dt):
            return now + dt, registry.init_producer_id(txn_id, pid, epoch, timeout_ms, now + dt)
        case ("added", (txn_id, pid, epoch), dt, partitions, group):
            return now + dt, registry.added(txn_id, pid, epoch, now + dt, partitions=partitions, group=group)
        case ("request_timeout", txn_id, timeout_ms):
            return now, registry.request_timeout(txn_id, timeout_ms)
        case ("end_txn", (txn_id, pid, epoch), dt):
            return now + dt, registry.end_txn(txn_id, pid, epoch, now + dt)
        case ("coordinator_says_ongoing", (txn_id, pid, epoch), start, partitions, groups, dt, timeout_ms):
            return now + dt, registry.coordinator_says_ongoing(txn_id, pid, epoch, start, set(partitions),
                                                               set(groups), now + dt, timeout_ms)
        case ("expire", dt):
            return now + dt, registry.expire(now + dt)
        case ("timeout_candidate", (txn_id, pid, epoch), dt):
            return now + dt, registry.timeout_candidate(txn_id, pid, epoch, now + dt)
        case ("local_verdict", (txn_id, pid, epoch), tp, dt, group):
            return now + dt, registry.local_verdict(txn_id, pid, epoch, tp, now + dt, group)
        case ("passes_locally", (txn_id, pid, epoch), tps, dt):
            return now + dt, registry.passes_locally(txn_id, pid, epoch, tps, now + dt)
    raise AssertionError(f"no such call: {name}")


def _state(registry: Any) -> tuple[Any, ...]:
    order = registry.ids() if isinstance(registry, NativeRegistry) else list(registry._records)
    return len(registry), order, [registry.get(txn_id) for txn_id in IDS]


# The bounds' edges, each once for sure: a write as old as the observed or given evidence's bound (a sidecar's), a
# transaction as old
# as its timeout less the slack (a gateway's), and a passed write that saves its id from eviction.
@example(RegistryLimits(evidence_ttl_ms=100), [("added", ("a", 1, 0), 0, {("t", 0)}, None),
                                               ("passes_locally", ("a", 1, 0), [("t", 0)], 100)])
@example(RegistryLimits(evidence_ttl_ms=100), [("coordinator_says_ongoing", ("a", 1, 0), 1, {("t", 0)}, set(), 0, None),
                                               ("local_verdict", ("a", 1, 0), ("t", 0), 100, None)])
@example(RegistryLimits(), [("init_producer_id", ("a", 1, 0), 1000, 0), ("added", ("a", 1, 0), 0, {("t", 0)}, None),
                            ("timeout_candidate", ("a", 1, 0), 500)])
@example(RegistryLimits(max_entries=2), [("added", ("a", 1, 0), 0, {("t", 0)}, None),
                                         ("added", ("b", 2, 0), 0, {("t", 0)}, None),
                                         ("passes_locally", ("a", 1, 0), [("t", 0)], 1),
                                         ("added", ("c", 3, 0), 0, {("t", 0)}, None)])
@settings(max_examples=1500, deadline=None)
@given(limits, st.lists(call, min_size=10, max_size=60))
def test_the_native_registry_answers_as_the_python_one(limits: RegistryLimits, calls: list[tuple[Any, ...]]) -> None:
    oracle, native_ = PythonRegistry(limits), NativeRegistry(limits)
    oracle.seen, native_.seen = told_oracle, told_native = Told(), Told()
    now = 0
    for step in calls:
        after, expected = _apply(oracle, step, now)
        _, answered = _apply(native_, step, now)
        assert answered == expected, step
        assert _state(native_) == _state(oracle), step
        assert told_native.ids == told_oracle.ids, step
        now = after


def test_changed_limits_apply_to_the_next_call() -> None:
    """A registry's limits may be set again (a test does; the proxy does not): the native one reads them too."""
    registry = NativeRegistry(RegistryLimits(max_entries=2))
    registry.coordinator_says_ongoing("a", 1, 0, 5, {("t", 0)}, set(), 100)
    assert registry.local_verdict("a", 1, 0, ("t", 0), 101) is None  # a gateway keeps no given evidence
    registry.limits = RegistryLimits(max_entries=2, evidence_ttl_ms=60_000)
    verdict = registry.local_verdict("a", 1, 0, ("t", 0), 101)
    assert verdict is not None and verdict.evidence.value == "cache"

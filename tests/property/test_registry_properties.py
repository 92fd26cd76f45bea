"""Hypothesis: whatever order the proxy observes events in, evidence never outlives its transaction."""

from hypothesis import given, settings
from hypothesis import strategies as st

from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.verdicts import Outcome

PARTS = [("t", 0), ("t", 1), ("u", 0)]
event = st.one_of(
    st.tuples(st.just("init"), st.integers(0, 2)),
    st.tuples(st.just("add"), st.sampled_from(PARTS)),
    st.tuples(st.just("end"), st.just(None)),
    st.tuples(st.just("tick"), st.integers(0, 5000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=40), st.sampled_from(PARTS))
def test_a_pass_needs_an_add_in_the_current_generation(events, probe):
    r = Registry(RegistryLimits(max_entries=10, idle_expiry_ms=10**9))
    now, epoch = 0, 0
    added_since_boundary: set[tuple[str, int]] = set()
    ended = False
    for kind, arg in events:
        now += 1
        if kind == "init":
            epoch = arg
            r.init_producer_id("x", 1, epoch, 10**9, now)
            added_since_boundary, ended = set(), False
        elif kind == "add":
            if ended:
                added_since_boundary, ended = set(), False
            r.added("x", 1, epoch, now, partitions={arg})
            added_since_boundary.add(arg)
        elif kind == "end":
            r.end_txn("x", 1, epoch, now)
            added_since_boundary, ended = set(), True
        else:
            now += arg
            r.expire(now)
    v = r.local_verdict("x", 1, epoch, probe, now)
    if v is not None and v.passed:
        assert probe in added_since_boundary
    if ended and r.get("x") is not None:
        assert v is not None and v.outcome is Outcome.LATE_WRITE
    assert len(r) <= 10

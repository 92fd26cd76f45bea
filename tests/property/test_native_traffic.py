"""Hypothesis: the native traffic arrays (native/src/traffic.rs) count as the Python ones (connection/traffic.py).

Both get the same calls in the same order: requests and responses of any API key (negative, past the per-key
slots, ordinary), any size, round trips on the buckets' bounds, between them, past the last and negative. After
the run: every list the shell reads at scrape time is equal (the Python class is the oracle, and the fallback
where the native module is missing).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txnguard.codecs import native
from txnguard.connection.traffic import KEYS, RTT_BUCKETS, Traffic

key = st.one_of(st.integers(-3, 3), st.integers(KEYS - 3, KEYS + 3), st.integers(-(1 << 15), (1 << 15) - 1))
seconds = st.one_of(st.sampled_from([*RTT_BUCKETS, 0.0, -0.001, 60.0]), st.floats(-1.0, 100.0))
call = st.one_of(st.tuples(st.just("in"), key, st.integers(0, 1 << 31)),
                 st.tuples(st.just("out"), key, st.integers(0, 1 << 31), seconds))


@settings(max_examples=300, deadline=None)
@given(st.lists(call, max_size=60))
def test_the_native_counters_count_as_the_python_ones(calls: list[tuple]) -> None:
    # `make test` builds the native module; without it this test fails (not a skip).
    theirs, ours = Traffic(), native.new_traffic(RTT_BUCKETS)
    for c in calls:
        for t in (theirs, ours):
            if c[0] == "in":
                t.count_in(c[1], c[2])
            else:
                t.count_out(c[1], c[2], c[3])
    for name in ("frames_in", "bytes_in", "frames_out", "bytes_out", "rtt_buckets", "rtt_sum"):
        assert getattr(ours, name) == getattr(theirs, name), name

"""A read of the coordinator's log applied whole is its records applied one by one.

The follower hands the view each partition's records of an answer reduced to each id's last record and every
unreadable one (codecs/transaction_log.py's `latest`, natively in `read_log_answer`), with the counts and the ids
whose transaction ended. Over generated histories of one partition, cut into reads that may repeat records read
already (a sync and a long poll both carrying them), the view fed reads holds what the view fed every record holds:
the same ids, states, order, positions and counts; the ids ended are those a record ended. With the view's bound
met, it holds no more ids than the bound, each with its latest state, and every id the view fed record by record
holds (it may hold more: an id set and removed within one read pushes no other out)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from txnguard.codecs.transaction_log import (
    ENDED,
    MALFORMED,
    STATE,
    TOMBSTONE,
    UNKNOWN,
    Decoded,
    TxnLogValue,
    latest,
)
from txnguard.verification.transaction_log_view import LogViewLimits, TransactionLogView

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PARTITION = 3

_value = st.builds(TxnLogValue, st.just(7), st.integers(0, 2), st.just(60_000),
                   st.sampled_from(["Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "CompleteAbort"]),
                   st.just(frozenset({("orders", 0)})), st.just(1), st.just(1))
_ids = st.sampled_from(["a", "b", "c", "d"])
# (kind, transactional id, value): mostly states of a few ids, as a busy cluster's log is.
_change = st.one_of(
    st.tuples(st.just(STATE), _ids, _value), st.tuples(st.just(STATE), _ids, _value),
    st.tuples(st.just(TOMBSTONE), _ids, st.none()),
    st.tuples(st.sampled_from([UNKNOWN, MALFORMED]), st.none() | _ids, st.none()))


@st.composite
def _history(draw: st.DrawFn) -> tuple[list[Decoded], list[tuple[int, int]]]:
    """Records at offsets 0.., and the reads: (from, to) offsets, in order, each starting at or before where the last
    ended (a read may repeat records), together reaching the end."""
    changes = draw(st.lists(_change, min_size=1, max_size=30))
    records: list[Decoded] = [(offset, kind, txn_id, v) for offset, (kind, txn_id, v) in enumerate(changes)]
    reads, at = [], 0
    while at < len(records):
        start = draw(st.integers(max(0, at - 3), at))
        stop = draw(st.integers(at + 1, len(records)))
        reads.append((start, stop))
        at = stop
    return records, reads


def _one_by_one(records: list[Decoded], reads: list[tuple[int, int]], bound: int) -> tuple[TransactionLogView,
                                                                                              list[list[str]]]:
    """The view fed every record of each read not read yet (the follower before reads were reduced), and the ids
    whose transaction each read ended."""
    view, ended = TransactionLogView(LogViewLimits(max_entries=bound)), []
    for start, stop in reads:
        said: dict[str, None] = {}
        for record in records[start:stop]:
            offset, kind, txn_id, value = record
            if offset < view.positions.get(PARTITION, 0):
                continue
            view.apply_decoded(PARTITION, record)
            if txn_id is not None and (kind == TOMBSTONE or (kind == STATE and value is not None
                                                             and value.state in ENDED)):
                said.setdefault(txn_id)
        ended.append(list(said))
    return view, ended


def _by_reads(records: list[Decoded], reads: list[tuple[int, int]], bound: int) -> tuple[TransactionLogView,
                                                                                            list[list[str]]]:
    view, ended = TransactionLogView(LogViewLimits(max_entries=bound)), []
    for start, stop in reads:
        position = view.positions.get(PARTITION, 0)
        read = latest(records[start:stop], position)
        # Every record that could not be read is kept: the follower warns of each kind once.
        assert [r for r in read.kept if r[1] in (UNKNOWN, MALFORMED)] == [
            r for r in records[start:stop] if r[0] >= position and r[1] in (UNKNOWN, MALFORMED)]
        view.apply_read(PARTITION, read)
        ended.append(read.ended)
    return view, ended


@SETTINGS
@given(history=_history())
@example(history=([(0, STATE, "a", TxnLogValue(7, 0, 60_000, "Ongoing", frozenset(), 1, 1)),
                   (1, UNKNOWN, "a", None), (2, STATE, "b", TxnLogValue(7, 0, 60_000, "Ongoing", frozenset(), 1, 1))],
                  [(0, 3)]))
def test_a_read_applied_whole_is_its_records_applied_one_by_one(history):
    records, reads = history
    expected, expected_ended = _one_by_one(records, reads, 1_000)
    view, ended = _by_reads(records, reads, 1_000)
    assert list(view.items()) == list(expected.items())
    assert view.positions == expected.positions
    assert view.counts == expected.counts
    assert ended == expected_ended


_EMPTY = TxnLogValue(7, 0, 60_000, "Empty", frozenset({("orders", 0)}), 1, 1)


@SETTINGS
@given(history=_history(), bound=st.integers(1, 3))
# Found by the gate: "a" is removed at 9, then the read's last record of it (12) removes it again. Kept until 12
# with its state, it held a place when "c" came at 11 and pushed "d" out, which the one-by-one view keeps.
@example(history=([*((o, STATE, "a", _EMPTY) for o in range(4)), (4, STATE, "d", _EMPTY),
                   (5, TOMBSTONE, "a", None), *((o, STATE, "a", _EMPTY) for o in (6, 7, 8)),
                   (9, TOMBSTONE, "a", None), (10, STATE, "b", _EMPTY), (11, STATE, "c", _EMPTY),
                   (12, TOMBSTONE, "a", None)], [(0, 7), (4, 13)]), bound=3)
def test_at_the_bound_a_read_keeps_only_latest_states_and_no_fewer_ids(history, bound):
    records, reads = history
    expected, _ = _one_by_one(records, reads, bound)
    view, _ = _by_reads(records, reads, bound)
    assert len(view) <= bound
    final = {txn_id: (value, offset) for offset, _, txn_id, value in records if txn_id is not None}
    for txn_id, logged in view.items():
        assert (logged.value, logged.offset) == final[txn_id]
    assert set(dict(expected.items())) <= set(dict(view.items()))
    assert (view.positions, view.counts) == (expected.positions, expected.counts)

"""The log follower's incremental fetch session (KIP-227), as the broker expects it:

    follower ─Fetch(session 0, epoch 0, all 3 partitions)─▶ broker ─session 41─▶
             ─Fetch(session 41, epoch 1, none moved)──────▶        (answers only partitions with news)
             ─Fetch(session 41, epoch 2, partition 1 at 7)─▶       (the one whose offset moved)
    a leader moved (the set changed), an error, FETCH_SESSION_ID_NOT_FOUND: a full Fetch again
"""

from __future__ import annotations

from txnguard.codecs.log_fetch import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    FetchSession,
    Wanted,
)

EPOCHS = {0: 5, 1: 5, 2: 5}


def at(*offsets: int) -> list[Wanted]:
    return [Wanted(p, 5, offset, 1024) for p, offset in enumerate(offsets)]


Request = tuple[int, int, list[Wanted], bool]


def ask(s: FetchSession, *offsets: int, plan: int = 1, epochs: dict[int, int] = EPOCHS) -> Request:
    return s.next(plan, list(range(len(offsets))), epochs, dict(enumerate(offsets)), 1024)


def test_a_session_lists_only_what_moved_after_its_full_fetch() -> None:
    s = FetchSession()
    assert ask(s, 0, 0, 0) == (0, 0, at(0, 0, 0), True)
    s.answered(0, 41)
    assert ask(s, 0, 0, 0) == (41, 1, [], False)
    s.answered(0, 41)
    assert ask(s, 0, 7, 0) == (41, 2, [Wanted(1, 5, 7, 1024)], False)
    s.answered(0, 41)
    assert ask(s, 0, 7, 0) == (41, 3, [], False)


def test_an_offset_moved_while_its_request_got_no_answer_is_listed_again_in_full() -> None:
    s = FetchSession()
    ask(s, 0, 0)
    s.answered(0, 41)
    ask(s, 0, 3)
    s.lost()  # the connection dropped before the answer
    assert ask(s, 0, 3) == (41, 0, at(0, 3), True)


def test_a_new_plan_a_leader_or_its_epoch_moved_starts_a_full_fetch_that_closes_the_old_session() -> None:
    s = FetchSession()
    ask(s, 0, 0, 0)
    s.answered(0, 41)
    # Partition 2 moved to another leader (the caller's plan moved): the old session's id with epoch 0, which the
    # broker closes as it opens another.
    assert ask(s, 0, 0, plan=2) == (41, 0, at(0, 0), True)
    s.answered(0, 42)
    assert ask(s, 0, 0, plan=2) == (42, 1, [], False)
    s.answered(0, 42)
    moved = {0: 5, 1: 6}
    assert ask(s, 0, 0, plan=3, epochs=moved) == (42, 0, [Wanted(0, 5, 0, 1024), Wanted(1, 6, 0, 1024)], True)


def test_a_broker_without_a_slot_gets_full_fetches() -> None:
    s = FetchSession()
    ask(s, 0, 0)
    s.answered(0, 0)
    assert ask(s, 3, 0) == (0, 0, at(3, 0), True)


def test_a_session_the_broker_lost_or_an_error_means_full_again() -> None:
    s = FetchSession()
    ask(s, 0)
    s.answered(0, 41)
    ask(s, 0)
    s.answered(INVALID_FETCH_SESSION_EPOCH, 0)
    assert ask(s, 0) == (41, 0, at(0), True)  # the id kept: the full Fetch closes it
    s.answered(FETCH_SESSION_ID_NOT_FOUND, 0)
    assert ask(s, 0) == (0, 0, at(0), True)   # forgotten: the broker no longer knows it
    s.answered(0, 50)
    ask(s, 0)
    s.answered(6, 50)  # any other top-level error
    assert ask(s, 0)[3]


def test_the_epoch_wraps_to_one() -> None:
    s = FetchSession()
    ask(s, 0)
    s.answered(0, 41)
    s.epoch = 2 ** 31 - 1
    ask(s, 0)
    s.answered(0, 41)
    assert ask(s, 0)[:2] == (41, 1)


def test_a_partition_an_incremental_answer_leaves_out_is_still_at_its_watermark() -> None:
    """follower ─Fetch(session, epoch 3)─▶ broker ─news of partition 0 only─▶ partition 1 was at its end and still
    is (a new watermark would have been listed); partition 2, stopped below its end, is not taken for caught up."""
    from txnguard.codecs.log_fetch import LogAnswer, LogPartition
    from txnguard.proxy.config import HostPort
    from txnguard.proxy.log_follower import LogFollower
    from txnguard.proxy.metrics import ProxyMetrics
    from txnguard.verification.transaction_log_view import TransactionLogView

    leader = HostPort("127.0.0.1", 9092)
    f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (leader,), lambda h, p: HostPort(h, p))
    f.leaders = {0: leader, 1: leader, 2: leader}
    f.caught_up_at = {0: 1.0, 1: 1.0, 2: 1.0}
    f._behind = {2}
    answer = LogAnswer(0, 41, [LogPartition(0, 0, 0, 0, None, None)])
    reached, failed = f._apply(answer, leader, [0, 1, 2], complete=False)
    assert (reached, failed) == ({0, 1}, set())
    assert f.caught_up_at[1] > 1.0 and f.caught_up_at[2] == 1.0
    # The same answer taken as complete (a full Fetch) says nothing of partition 1.
    f.caught_up_at[1] = 1.0
    assert f._apply(answer, leader, [0, 1, 2])[0] == {0}


def test_a_partition_behind_only_until_its_epoch_started_is_at_its_end_without_news() -> None:
    """follower ─Fetch(session)─▶ new leader of partition 2: records to its watermark 10, but the epoch's start not
    confirmed yet (behind) ─ListOffsets─▶ started ─Fetch(session)─▶ nothing new to list for partition 2: it is at its
    end now (waiting for news that never comes left the follower behind forever after a broker crash)."""
    from txnguard.codecs.log_fetch import LogAnswer
    from txnguard.proxy.config import HostPort
    from txnguard.proxy.log_follower import LogFollower
    from txnguard.proxy.metrics import ProxyMetrics
    from txnguard.verification.transaction_log_view import TransactionLogView

    leader = HostPort("127.0.0.1", 9092)
    f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (leader,), lambda h, p: HostPort(h, p))
    f.leaders = {2: leader}
    f.leader_epochs = {2: 4}
    f.view.positions[2] = 10
    f.high_watermarks[2] = 10
    f._behind = {2}
    empty = LogAnswer(0, 41, [])
    assert f._apply(empty, leader, [2], complete=False)[0] == set()  # the epoch not started: still behind
    f._epoch_checked[2] = 4
    f._epochs_unchecked.discard(2)
    assert f._apply(empty, leader, [2], complete=False)[0] == {2}
    assert f.partition_usable(2)


def test_told_what_moved_a_session_compares_only_those_and_takes_its_own_out_of_the_record() -> None:
    """    follower ─(partition 1 read to 7; partition 9, another leader's, moved too)─▶ next(moved={1, 9})
             ─Fetch(session 41, epoch 2, partition 1 at 7)─▶ broker; {9} left for its own session"""
    s = FetchSession()
    ask(s, 0, 0, 0)
    s.answered(0, 41)
    moved = {1, 9}
    offsets = {0: 0, 1: 7, 2: 3}  # 2 moved but the caller did not say so: not compared (the caller records all)
    assert s.next(1, [0, 1, 2], EPOCHS, offsets, 1024, moved) == (41, 1, [Wanted(1, 5, 7, 1024)], False)
    assert moved == {9}
    s.answered(0, 41)
    # What the broker's session holds moved with the answer: partition 1 at 7, and said again only when it moves.
    assert s.next(1, [0, 1, 2], EPOCHS, {0: 0, 1: 7, 2: 3}, 1024, {1}) == (41, 2, [], False)
    s.answered(0, 41)
    assert ask(s, 0, 7, 3) == (41, 3, [Wanted(2, 5, 3, 1024)], False)  # every partition compared: 2 is listed

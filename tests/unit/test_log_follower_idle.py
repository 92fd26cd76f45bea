"""An idle follower never passes a write at once on its view, a write wakes its long poll, and it reads the log once
per idle read, never in a loop (proxy/log_follower.py, "Idle").

    the view: "app" Ongoing {orders-0}, producer 7 epoch 0 (what the last read left)
    long poll live  ─▶ a write of "app" to orders-0: passed at once on the view, no Fetch
    no live long poll (idle) ─▶ the same write: the log read to its end first (one Fetch), then the log's verdict
    an idle loop resting for idle_read_s ─▶ a write asks the log: the rest ends at once
    an idle loop ─Fetch (max wait 0)─▶ leader, at the end ─▶ rests idle_read_s ─▶ Fetch ...
    an idle loop ─Fetch─▶ leader: below the end, nothing read (a batch it cannot open) ─▶ rests all the same
    the leader moves ─▶ a write: the log read to its end from the new leader first, even with its long poll live;
    an answer of the old leader (late) does not count, one of the new leader does
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.codecs.topic_partition import TopicPartition
from txnguard.codecs.transaction_log import STATE, TxnLogValue
from txnguard.proxy.config import HostPort
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.testing.fetch_answers import FetchesAsBytes
from txnguard.verification.transaction_log_view import TransactionLogView

LEADER = HostPort("127.0.0.1", 9092)
NEW_LEADER = HostPort("127.0.0.1", 9093)
WRITE: TopicPartition = ("orders", 0)


class Leader(FetchesAsBytes):
    """A fake leader of every partition: each Fetch answers "no new records, high watermark `end`" at once."""

    def __init__(self, partition: int, end: int = 1) -> None:
        self.partition, self.end, self.fetches = partition, end, 0

    async def request(self, payload: Any, timeout: float) -> Any:
        self.fetches += 1
        part = SimpleNamespace(partition_index=self.partition, error_code=ErrorCode.none, high_watermark=self.end,
                               log_start_offset=0, records=None)
        return SimpleNamespace(responses=[SimpleNamespace(partitions=[part])])


def follower_holding_app_ongoing(idle_after_s: float | None) -> tuple[LogFollower, Leader]:
    view = TransactionLogView()
    view.partition_count = 4
    partition = view.partition_of("app")
    assert partition is not None
    view.apply_decoded(partition, (0, STATE, "app", TxnLogValue(7, 0, 60_000, "Ongoing", frozenset({WRITE}), 1, 1)))
    f = LogFollower(view, ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p), idle_after_s=idle_after_s,
                    idle_read_s=60.0)
    leader = Leader(partition)
    f._syncs = leader  # type: ignore[assignment]
    f.leaders = {partition: LEADER}
    f.caught_up_at = {partition: 0.0}
    f._listed_by[partition] = LEADER  # the leader's last answer listed it, as the read that caught it up did
    return f, leader


def verdict(f: LogFollower) -> Any:
    async def ask() -> Any:
        found = await f.verdicts("app", 7, 0, [WRITE], 1.0)
        await f.close()
        return found.get(WRITE)
    return asyncio.run(ask())


def test_while_the_long_poll_is_live_the_view_passes_at_once() -> None:
    f, leader = follower_holding_app_ongoing(idle_after_s=30.0)
    f._live.add(LEADER)

    v = verdict(f)

    assert v is not None and v.passed and leader.fetches == 0


def test_a_follower_that_never_idles_passes_at_once_as_before() -> None:
    f, leader = follower_holding_app_ongoing(idle_after_s=None)

    v = verdict(f)

    assert v is not None and v.passed and leader.fetches == 0


def test_after_its_leader_moved_a_partition_passes_nothing_at_once_until_the_new_leader_listed_it() -> None:
    # Never idle, and the new leader's long poll live (for the partitions it led before): before the fix, the write
    # passed at once on the view the old leader's last answer left, which may miss records it had acknowledged.
    async def scenario() -> tuple[int, bool, int, bool]:
        f, leader = follower_holding_app_ongoing(idle_after_s=None)
        partition = f.view.partition_of("app")
        assert partition is not None
        f.leaders = {partition: NEW_LEADER}  # the old leader died: Metadata names the new one
        f._live.add(NEW_LEADER)
        first = (await f.verdicts("app", 7, 0, [WRITE], 1.0)).get(WRITE)
        fetches_first = leader.fetches
        second = (await f.verdicts("app", 7, 0, [WRITE], 1.0)).get(WRITE)
        await f.close()
        return fetches_first, first is not None and first.passed, leader.fetches, \
            second is not None and second.passed

    fetches_first, first_passed, fetches_after, second_passed = asyncio.run(scenario())

    assert (fetches_first, first_passed) == (1, True)  # read to its end from the new leader, then the verdict
    assert (fetches_after, second_passed) == (1, True)  # listed by the new leader: at once again, no Fetch


def test_a_partition_without_a_leader_for_a_while_waits_for_its_next_leader_too() -> None:
    f, _ = follower_holding_app_ongoing(idle_after_s=None)
    partition = f.view.partition_of("app")
    assert partition is not None
    f.leaders = {}  # Metadata names no leader for it (an election under way)
    f.leaders = {partition: NEW_LEADER}

    assert not f._passes_at_once(partition)


def test_only_an_answer_of_the_new_leader_ends_the_wait() -> None:
    from txnguard.codecs.log_fetch import LogAnswer, LogPartition

    f, _ = follower_holding_app_ongoing(idle_after_s=None)
    partition = f.view.partition_of("app")
    assert partition is not None
    f.leaders = {partition: NEW_LEADER}
    position = f.view.positions.get(partition, 0)
    answer = LogAnswer(0, 0, [LogPartition(partition, 0, position, 0, None, None)])

    f._apply(answer, LEADER, [partition])  # the old leader's answer, arriving late
    assert not f._passes_at_once(partition)
    f._apply(answer, NEW_LEADER, [partition])
    assert f._passes_at_once(partition)


def test_without_a_live_long_poll_the_log_is_read_to_its_end_first() -> None:
    f, leader = follower_holding_app_ongoing(idle_after_s=30.0)  # no long poll ran: nothing live

    v = verdict(f)

    assert leader.fetches == 1  # the read to the end, before the verdict
    assert v is not None and v.passed


def test_a_write_that_asks_the_log_ends_an_idle_loops_rest_and_the_idling() -> None:
    async def scenario() -> tuple[float, bool, bool]:
        f, _ = follower_holding_app_ongoing(idle_after_s=0.05)
        await asyncio.sleep(0.1)
        idle_before = f._idle()
        started = time.monotonic()
        rest = asyncio.ensure_future(f._rest(LEADER))
        await asyncio.sleep(0.05)
        f._asked()
        await asyncio.wait_for(rest, 5.0)
        waited = time.monotonic() - started
        await f.close()
        return waited, idle_before, f._idle()

    waited, idle_before, idle_after = asyncio.run(scenario())
    assert idle_before and not idle_after
    assert waited < 1.0  # not idle_read_s (60 s)


def fetches_in(seconds: float, leader: Leader, idle_read_s: float) -> int:
    async def scenario() -> int:
        f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p),
                        idle_after_s=0.01, idle_read_s=idle_read_s)
        f._polls = leader  # type: ignore[assignment]
        f.leaders = {leader.partition: LEADER}
        await asyncio.sleep(0.02)  # idle from the first round
        loop = asyncio.ensure_future(f._follow(LEADER))
        await asyncio.sleep(seconds)
        await f.close()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return leader.fetches
    return asyncio.run(scenario())


def test_an_idle_loop_reads_once_per_idle_read() -> None:
    fetches = fetches_in(0.55, Leader(3, end=0), idle_read_s=0.1)  # at the end each time

    assert 4 <= fetches <= 7, fetches  # at 0, then every 0.1 s


def test_an_idle_read_that_moves_nothing_rests_instead_of_fetching_again_at_once() -> None:
    # "No records, high watermark 5": below the end, the position never moving (a batch this reader cannot open).
    fetches = fetches_in(0.3, Leader(3, end=5), idle_read_s=60.0)

    assert fetches == 1, fetches  # not a loop of Fetches that do not wait

"""The follower's read-to-the-end (`sync`) under many writes at once: one Fetch in flight per partition.

    write 1 ─sync(p)─▶ Fetch #1 (max_wait 0) ─────────────▶ leader … slow answer
    writes 2..10 ─sync(p)─▶ wait for the next one (#1 may have been sent before they came)
    #1 answered ─▶ Fetch #2, for writes 2..10 ─▶ answered: every write learns the log's end as of its arrival
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.proxy.config import HostPort
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.testing.fetch_answers import FetchesAsBytes
from txnguard.verification.transaction_log_view import TransactionLogView

LEADER = HostPort("127.0.0.1", 9092)


class SlowLeader(FetchesAsBytes):
    """A fake connection: each Fetch waits for `release`, then answers "no records, high watermark 0"."""

    def __init__(self) -> None:
        self.fetches = 0
        self.release = asyncio.Event()

    async def request(self, payload: Any, timeout: float) -> Any:
        self.fetches += 1
        await self.release.wait()
        part = SimpleNamespace(partition_index=3, error_code=ErrorCode.none, high_watermark=0, log_start_offset=0,
                               records=None)
        return SimpleNamespace(responses=[SimpleNamespace(partitions=[part])])


def follower_reading(leader: SlowLeader) -> LogFollower:
    f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p))
    f._syncs = leader  # type: ignore[assignment]
    f.leaders = {3: LEADER}
    f.caught_up_at = {3: 0.0}
    return f


def test_writes_that_come_while_a_fetch_is_in_flight_share_the_next_one() -> None:
    async def scenario() -> tuple[list[bool], int]:
        leader = SlowLeader()
        follower = follower_reading(leader)
        first = asyncio.ensure_future(follower.sync(3, 5.0))
        await asyncio.sleep(0)  # Fetch #1 is on its way
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(follower.sync(3, 5.0)) for _ in range(9)]
        await asyncio.sleep(0)
        leader.release.set()
        done = await asyncio.gather(first, *rest)
        await follower.close()
        return done, leader.fetches

    done, fetches = asyncio.run(scenario())
    assert done == [True] * 10
    assert fetches == 2


def test_a_write_after_the_fetches_ended_sends_a_fresh_one() -> None:
    async def scenario() -> int:
        leader = SlowLeader()
        leader.release.set()
        follower = follower_reading(leader)
        assert await follower.sync(3, 5.0)
        assert await follower.sync(3, 5.0)
        await follower.close()
        return leader.fetches

    assert asyncio.run(scenario()) == 2


class RefusingLeader(SlowLeader):
    """A fake connection whose every Fetch is refused at once: the principal may DESCRIBE the log, not READ it."""

    async def request(self, payload: Any, timeout: float) -> Any:
        self.fetches += 1
        part = SimpleNamespace(partition_index=3, error_code=ErrorCode.topic_authorization_failed, high_watermark=-1,
                               log_start_offset=-1, records=None)
        return SimpleNamespace(responses=[SimpleNamespace(partitions=[part])])


def test_a_refused_fetch_is_asked_again_after_a_backoff_not_in_a_loop() -> None:
    """    follower ─Fetch (long poll)─▶ leader ─TOPIC_AUTHORIZATION_FAILED, at once─▶ denied: the metric, the log line
           follower ─sleeps 0.1 s, 0.2 s, 0.4 s … (at most 5 s)─▶ Fetch again: a handful in a second, not thousands"""
    refusals: list[Any] = []

    async def scenario() -> tuple[int, bool]:
        leader = RefusingLeader()
        follower = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p),
                               on_refused=refusals.append)
        follower._polls = leader  # type: ignore[assignment]
        follower.leaders = {3: LEADER}
        loop = asyncio.ensure_future(follower._follow(LEADER))
        await asyncio.sleep(1.0)
        denied = follower.denied
        await follower.close()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return leader.fetches, denied

    fetches, denied = asyncio.run(scenario())
    assert denied and 2 <= fetches <= 6, fetches   # 0, 0.1, 0.3, 0.7 s: four (before the fix: every round trip)
    assert {(m.api, m.operation) for m in refusals} == {("transaction_log_fetch", "READ")}

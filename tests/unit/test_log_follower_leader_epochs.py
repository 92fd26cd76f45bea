"""The follower reads `__transaction_state` from its leader only, and trusts a new leader's watermark only once it is
past the start of its epoch (a false refusal seen while the copier's partition moved: test_log_follower_faults.py).

    follower ─Fetch(current_leader_epoch = Metadata's)─▶ a broker that lost the leadership: FENCED_LEADER_EPOCH,
                                                         not what it holds as a follower
    follower ─ListOffsets LATEST(epoch)─▶ new leader: OFFSET_NOT_AVAILABLE (its watermark below its epoch's start)
             ─Fetch─▶ "no more records, high watermark H": not the end yet ─▶ ListOffsets again: none ─▶ the end
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


class NewLeader(FetchesAsBytes):
    """A fake connection to a leader just elected: ListOffsets answers OFFSET_NOT_AVAILABLE `not_yet` times, then
    none; every Fetch answers "no records, high watermark 0"."""

    def __init__(self, not_yet: int) -> None:
        self.not_yet = not_yet
        self.asked: list[str] = []
        self.fetched: list[Any] = []  # the Fetches as kio decodes the follower's bytes

    async def request(self, payload: Any, timeout: float) -> Any:
        if type(payload).__name__ == "ListOffsetsRequest":
            self.asked.append("ListOffsets")
            code = ErrorCode.offset_not_available if self.not_yet > 0 else ErrorCode.none
            self.not_yet -= 1
            part = SimpleNamespace(partition_index=3, error_code=code)
            return SimpleNamespace(topics=[SimpleNamespace(partitions=[part])])
        self.asked.append("Fetch")
        self.fetched.append(payload)
        part = SimpleNamespace(partition_index=3, error_code=ErrorCode.none, high_watermark=0, log_start_offset=0,
                               records=None)
        return SimpleNamespace(responses=[SimpleNamespace(partitions=[part])])


def follower_of(leader: NewLeader) -> LogFollower:
    f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p))
    f._syncs = leader  # type: ignore[assignment]
    f.leaders = {3: LEADER}
    f.leader_epochs = {3: 7}
    f.caught_up_at = {3: 0.0}
    return f


def test_every_fetch_names_the_leader_epoch_metadata_gave() -> None:
    async def scenario() -> list[int]:
        leader = NewLeader(0)
        f = follower_of(leader)
        await f.sync(3, 5.0)
        await f.close()
        return [int(p.current_leader_epoch) for t in leader.fetched[-1].topics for p in t.partitions]

    assert asyncio.run(scenario()) == [7]


def test_a_new_leaders_watermark_is_the_end_only_once_past_its_epochs_start() -> None:
    async def scenario() -> tuple[bool, list[str], bool]:
        leader = NewLeader(not_yet=2)
        f = follower_of(leader)
        reached = await f.sync(3, 5.0)
        usable = f.partition_usable(3)
        await f.close()
        return reached, leader.asked, usable

    reached, asked, usable = asyncio.run(scenario())
    assert reached and usable
    # Two Fetches that did not count as the end, then ListOffsets answered and the Fetch after it did; the epoch
    # is not asked about again.
    assert asked == ["ListOffsets", "Fetch", "ListOffsets", "Fetch", "ListOffsets", "Fetch"]


def test_a_leader_whose_watermark_stays_below_its_epochs_start_decides_nothing() -> None:
    async def scenario() -> tuple[bool, bool]:
        f = follower_of(NewLeader(not_yet=10**6))
        reached = await f.sync(3, 0.2)
        usable = f.partition_usable(3)
        await f.close()
        return reached, usable

    assert asyncio.run(scenario()) == (False, False)


def test_without_an_epoch_from_metadata_nothing_is_asked() -> None:
    async def scenario() -> tuple[bool, list[str]]:
        leader = NewLeader(not_yet=10**6)
        f = follower_of(leader)
        f.leader_epochs = {}
        reached = await f.sync(3, 5.0)
        await f.close()
        return reached, leader.asked

    assert asyncio.run(scenario()) == (True, ["Fetch"])


class MovingPlan(NewLeader):
    """A leader that comes to lead partition 4 too while the follower waits for its ListOffsets answer (Metadata
    arrived meanwhile); each Fetch answers "no records" for every partition it lists (a session of id 9)."""

    def __init__(self, follower: list[LogFollower]) -> None:
        super().__init__(not_yet=0)
        self.follower = follower

    async def request(self, payload: Any, timeout: float) -> Any:
        if type(payload).__name__ == "ListOffsetsRequest":
            self.asked.append("ListOffsets")
            f = self.follower[0]
            f.leaders = {3: LEADER, 4: LEADER}  # the plan moves while this answer is on its way
            f.leader_epochs = {3: 7, 4: 2}
            parts = [SimpleNamespace(partition_index=int(p.partition_index), error_code=ErrorCode.none)
                     for t in payload.topics for p in t.partitions]
            return SimpleNamespace(topics=[SimpleNamespace(partitions=parts)])
        self.asked.append("Fetch")
        self.fetched.append(payload)
        parts = [SimpleNamespace(partition_index=int(p.partition), error_code=ErrorCode.none, high_watermark=0,
                                 log_start_offset=0, records=None) for t in payload.topics for p in t.partitions]
        await asyncio.sleep(0.01)
        return SimpleNamespace(session_id=9, responses=[SimpleNamespace(partitions=parts)])


def test_a_partition_that_moves_to_the_leader_while_the_loop_awaits_is_fetched() -> None:
    """    follower ─ListOffsets(3)─▶ leader        (meanwhile Metadata: the leader leads 4 too: a new plan)
             ─Fetch(3, 4)─▶ leader              the session holds both: 4 is read, not left out for good"""
    async def scenario() -> list[set[int]]:
        holder: list[LogFollower] = []
        leader = MovingPlan(holder)
        f = LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p))
        holder.append(f)
        f._polls = leader  # type: ignore[assignment]
        f.leaders = {3: LEADER}
        f.leader_epochs = {3: 7}
        loop = asyncio.ensure_future(f._follow(LEADER))
        await asyncio.sleep(0.2)
        await f.close()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return [{int(p.partition) for t in fetch.topics for p in t.partitions} for fetch in leader.fetched]

    fetched = asyncio.run(scenario())
    assert fetched and fetched[0] == {3, 4}, fetched  # the first Fetch is the new plan's: both partitions

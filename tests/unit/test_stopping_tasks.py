"""A background loop that lost its cancellation still stops: the proxy's SIGTERM never hangs on it.

Python 3.11's wait_for drops a cancellation that arrives with its inner future's result (CPython gh-86296); the
loop below drops its first one the same way, on purpose, so the test does not depend on winning that race.
"""

from __future__ import annotations

import asyncio

from txnguard.proxy.tasks import cancel_and_wait


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def warning(self, event: str, **kw: object) -> None:
        self.lines.append((event, kw))


async def _loop_that_drops(cancellations: int, turns: list[int], until: list[bool] | None = None) -> None:
    dropped = 0
    while not (until and until[0]):
        try:
            await asyncio.sleep(0.01)
            turns.append(1)
        except asyncio.CancelledError:
            if dropped == cancellations:
                raise
            dropped += 1  # as wait_for does when the inner result and the cancellation meet: the loop goes on


def test_a_loop_that_dropped_its_cancellation_is_cancelled_again_until_it_ends() -> None:
    async def main() -> tuple[set[asyncio.Future[object]], bool, _Log]:
        turns: list[int] = []
        task = asyncio.get_running_loop().create_task(_loop_that_drops(2, turns))
        await asyncio.sleep(0.03)
        log = _Log()
        # proxy stop ─▶ cancel ─▶ dropped ─▶ cancel ─▶ dropped ─▶ cancel ─▶ ended
        left = await cancel_and_wait([task], log, bound_s=2.0)
        return left, task.cancelled(), log

    left, cancelled, log = asyncio.run(main())
    assert left == set() and cancelled and log.lines == []


def test_a_single_cancel_and_await_would_have_waited_forever() -> None:
    """The control: what the proxy did before (cancel once, await) does not end on this loop."""
    async def main() -> bool:
        task = asyncio.get_running_loop().create_task(_loop_that_drops(1, []))
        await asyncio.sleep(0.03)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=0.3)
        ended = bool(done)
        task.cancel()
        await asyncio.wait([task])
        return ended

    assert asyncio.run(main()) is False


def test_a_task_that_never_stops_is_named_and_let_go_at_the_bound() -> None:
    async def main() -> tuple[int, _Log]:
        until = [False]
        task = asyncio.get_running_loop().create_task(_loop_that_drops(10**9, [], until))
        await asyncio.sleep(0.02)
        log = _Log()
        left = await cancel_and_wait([task], log, bound_s=0.2)
        until[0] = True  # the test's own cleanup: the loop ends at its next turn
        await task
        return len(left), log

    n, log = asyncio.run(main())
    assert n == 1
    [(event, fields)] = log.lines
    assert event == "tasks_would_not_stop" and fields["count"] == 1
    assert fields["tasks"] == ["_loop_that_drops"]


def test_errors_of_the_tasks_being_stopped_are_retrieved_not_reported_at_exit() -> None:
    async def fails() -> None:
        raise RuntimeError("broken before the stop")

    async def main() -> bool:
        task = asyncio.get_running_loop().create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait([task])
        return task.done()

    assert asyncio.run(main())

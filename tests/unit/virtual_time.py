"""A fake clock for the asyncio shell: an event loop whose time moves only when nothing is ready to run.

    loop.time() ── virtual seconds, starting at `VirtualClock.seconds`
    asyncio.sleep / wait_for / call_later ── scheduled on that time
    nothing ready, a timer due in d ─▶ the clock jumps d at once (no real waiting), the timer runs

So a test of the shell's waits (a hold's bound, a retry's backoff) reads exact virtual durations, runs in
no wall time, and cannot be disturbed by a loaded machine. The same clock gives the wall milliseconds the
shell hands its pure core (`VirtualClock.wall_ms`, a `verification.decisions.Clock`), so both agree.
A loop that would wait for IO with no timer due fails at once: nothing here does real IO.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from connection_playbook import FakeClock

T = TypeVar("T")


# The core's fake clock (the playbook's) is the clock here too: the loop moves its `seconds`.
VirtualClock = FakeClock


class _Selector(selectors.DefaultSelector):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("the loop would wait for IO forever: no timer is due and nothing does real IO here")
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if not events and timeout > 0:
            self.clock.seconds += timeout  # nothing else can happen before the next timer: jump to it
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_Selector(clock))
        self.clock = clock

    def time(self) -> float:
        return self.clock.seconds


def run(coro: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """asyncio.run on a VirtualTimeLoop (a new clock unless one is given)."""
    loop = VirtualTimeLoop(clock or VirtualClock())
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(coro)

"""The proxy's once-a-second timer survives a tick that fails: the failure is said, and the next tick runs.

    tick 1 ─▶ the guard's housekeeping panics (native code: the registry's or the EndTxn ledger's expiry)
           ─▶ "timer_tick_failed" logged, the loop goes on
    tick 2, tick 3 ─▶ every session's timers and the housekeeping run again

Before, one failing tick ended the loop for good: no session timer, no expiry, no ledger recording by the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from virtual_time import run

from txnguard.codecs import native
from txnguard.proxy.server import Proxy


class _Log:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.errors.append((event, fields))


def test_a_tick_that_fails_is_said_and_the_next_tick_runs() -> None:
    calls: list[str] = []

    def housekeeping() -> None:
        calls.append("housekeeping")
        if len(calls) == 2:  # the first tick's: after its session's timers
            raise native.PanicException("index out of bounds")

    session = SimpleNamespace(check_timers=lambda: calls.append("timers"))
    proxy: Any = SimpleNamespace(metrics=SimpleNamespace(metadata_age=SimpleNamespace(set=lambda _: None)),
                                 last_metadata_ok=None, started_at=0.0, sessions=[session],
                                 guard=SimpleNamespace(housekeeping=housekeeping), log=_Log())
    proxy._tick = lambda: Proxy._tick(proxy)

    async def three_ticks() -> None:
        task = asyncio.ensure_future(Proxy._timer_loop(proxy))
        await asyncio.sleep(3.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(three_ticks())
    assert calls == ["timers", "housekeeping"] * 3
    [(event, fields)] = proxy.log.errors
    assert event == "timer_tick_failed" and "index out of bounds" in fields["error"]

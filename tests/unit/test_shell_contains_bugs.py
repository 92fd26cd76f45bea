"""The asyncio shell survives a bug in what it calls: a failing timer tick is said and the next runs; a panic while a
question is answered closes only that connection, with its reason.

The timer:

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


def test_a_panic_while_a_question_is_answered_closes_that_connection_with_its_reason() -> None:
    # core ─▶ Ask ─▶ the guard's answer reads native state, which panics ─▶ the core is told the verification
    # failed (it answers or closes with the reason), not a task dying with the held request never answered.
    from txnguard.proxy.session import Session

    async def answer(question: Any, upstream: Any) -> Any:
        raise native.PanicException("index out of bounds")

    told: list[tuple[int, str, str]] = []
    session: Any = SimpleNamespace(
        guard=SimpleNamespace(answer=answer), upstream_address=None, closed=False, log=_Log(),
        core=SimpleNamespace(verification_failed=lambda check_id, reason, detail: told.append((check_id, reason,
                                                                                                detail)) or []),
        _execute=lambda commands: None)
    run(Session._answer(session, SimpleNamespace(question=None, check_id=7)))
    assert told == [(7, "verification_error", "PanicException('index out of bounds')")]
    [(event, fields)] = session.log.errors
    assert event == "verification_error" and "index out of bounds" in fields["error"]

"""Stopping background tasks so that they really stop.

Python 3.11's `asyncio.wait_for` loses a cancellation that arrives in the same loop iteration as its inner
future's result (CPython gh-86296, fixed in 3.12 by the rewrite on `asyncio.timeout`): the task goes on as if
it had not been cancelled. A loop such as the transaction log's long poll then never ends, and a proxy that
awaited it after SIGTERM hung until it was killed (seen under load: the drain finished in milliseconds, the
process was SIGKILLed 30 s later). So a task is cancelled again until it has ended, within a bound, and one
that still runs past the bound is named in a log line instead of holding the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

# How often a task that swallowed its cancellation is cancelled again, and how long in all before giving up.
RECANCEL_EVERY_S = 0.05
STOP_BOUND_S = 5.0


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], log: Any = None,
                          bound_s: float = STOP_BOUND_S) -> set[asyncio.Future[Any]]:
    """Cancel `tasks` until every one has ended or `bound_s` has passed; the ones still running (logged)."""
    loop = asyncio.get_running_loop()
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    deadline = loop.time() + bound_s
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left))
    for t in tasks:
        if t.done() and not t.cancelled():
            with contextlib.suppress(BaseException):
                t.exception()  # retrieved: an error of a task being stopped is no news
    if pending and log is not None:
        log.warning("tasks_would_not_stop", count=len(pending), bound_s=bound_s,
                    tasks=sorted(_name(t) for t in pending))
    return pending


def _name(task: asyncio.Future[Any]) -> str:
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        return getattr(coro, "__qualname__", None) or task.get_name()
    return repr(task)

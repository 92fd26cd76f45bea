"""structlog set-up: one JSON object per line on stderr (what `txnguard run` writes, for machines).

A person at a terminal (`txnguard demo`, `txnguard dev`) gets structlog's ConsoleRenderer instead:
`render="auto"` picks it when the stream is a TTY, and JSON when it is a pipe or a file, as structlog's
own default set-up does.

Every connection carries a bound logger with its connection id, listener,
client address and, once known, the client id and KIP-511 software name and
version; per-request debug lines add the correlation id.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
RENDERS = ("json", "console", "auto")


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def configure(level: str = "info", stream: Any = None, render: str = "json") -> None:
    """`render`: "json" (one object a line), "console" (aligned, coloured key=value lines) or "auto"
    (console when `stream` is a terminal, JSON otherwise)."""
    if render not in RENDERS:
        raise ValueError(f"render must be one of {', '.join(RENDERS)}, not {render!r}")
    out = stream or sys.stderr
    console = render == "console" or (render == "auto" and is_terminal(out))
    renderer: Any
    if console:
        renderer = structlog.dev.ConsoleRenderer(colors=is_terminal(out))
        exceptions: list[Any] = []  # the ConsoleRenderer formats exceptions itself
    else:
        renderer = structlog.processors.JSONRenderer()
        exceptions = [structlog.processors.format_exc_info]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *exceptions,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def get(**context: Any) -> Any:
    return structlog.get_logger("txnguard").bind(**context)

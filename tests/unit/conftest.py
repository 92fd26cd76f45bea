"""Fixtures the unit tests share."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txnguard.proxy import logs


@pytest.fixture
def log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The proxy's structlog lines (JSON) written during the test, parsed."""
    stream = io.StringIO()
    logs.configure("info", stream)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    # Back to the process's own stderr: pytest's capture of this test's stderr is closed after it, and a later
    # test that logs without this fixture would write to a closed file.
    logs.configure("info", sys.__stderr__)


@pytest.fixture(autouse=True)
def _logs_back_to_the_process_stderr() -> Iterator[None]:
    """After every test the proxy's logs go to the process's own stderr again: a test that calls
    `logs.configure("info")` binds them to pytest's capture of its stderr, closed after it, and the next
    test that logs (test_upstream_auth's readyz test, then test_verify_only_support's warning) raised
    "I/O operation on closed file"."""
    yield
    logs.configure("info", sys.__stderr__)


@pytest.fixture(autouse=True)
def _playbook_commands_all_asserted() -> Iterator[None]:
    """A connection playbook's test fails when the core emitted a command the test never asserted
    (tests/unit/connection_playbook.py), as mitmproxy's playbook does."""
    yield
    playbook = sys.modules.get("connection_playbook")
    if playbook is None:
        return
    made, playbook.RECORDERS[:] = list(playbook.RECORDERS), []
    left = [f"{step}: {command!r:.300}" for rec in made for step, command in rec.unasserted()]
    if left:
        pytest.fail("commands the test never asserted:\n" + "\n".join(left), pytrace=False)

"""Shared real parts for integration tests: clusters come from the session pool, proxies are per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txnguard.testing.proxy import ProxyThread


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., ProxyThread]]:
    """`start_proxy(upstream=..., mode=..., **settings)` -> a running in-thread proxy, stopped after the test."""
    started: list[ProxyThread] = []

    def start(**settings: Any) -> ProxyThread:
        settings.setdefault("admin", "127.0.0.1:0")
        p = ProxyThread.from_settings(**settings).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()

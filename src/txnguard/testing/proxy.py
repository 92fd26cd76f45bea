"""Run a real txnguard proxy for tests and benchmarks: in a thread (uvloop) or as a process.

In a thread the test can read the proxy's metrics registry directly and watch
every byte it writes to clients (`wire` below). As a process (`txnguard run`)
it is exactly what an operator runs, which SIGTERM and CLI tests need.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from txnguard.proxy import logs
from txnguard.proxy.admin import AdminServer
from txnguard.proxy.config import ProxyConfig
from txnguard.proxy.config import load as load_config
from txnguard.proxy.server import Proxy
from txnguard.testing.kafka import Cluster, _alive


class WireRecorder:
    """Everything the proxy wrote to clients, to prove no broker address ever reached one."""

    def __init__(self, limit: int = 64 * 1024 * 1024) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self.limit = limit
        self.lock = threading.Lock()

    def __call__(self, data: Iterable[bytes | memoryview]) -> None:
        with self.lock:
            for d in data:
                if self._size < self.limit:
                    b = bytes(d)
                    self._chunks.append(b)
                    self._size += len(b)

    def data(self) -> bytes:
        with self.lock:
            return b"".join(self._chunks)

    def leaks(self, brokers: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """Broker (host, port) pairs that appear as an encoded address in client-bound bytes."""
        blob = self.data()
        found = []
        for host, port in brokers:
            if host.encode() + struct.pack(">i", port) in blob:
                found.append((host, port))
        return found


class ProxyThread:
    def __init__(self, config: ProxyConfig, *, record_wire: bool = True, log_stream: Any = None,
                 log_render: str = "json") -> None:
        self.config = config
        self.log_stream, self.log_render = log_stream, log_render  # logs.configure's stream and render
        self.proxy: Proxy | None = None
        self.admin: AdminServer | None = None
        self.wire = WireRecorder() if record_wire else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @classmethod
    def from_settings(cls, record_wire: bool = True, log_stream: Any = None, log_render: str = "json",
                      **settings: Any) -> ProxyThread:
        settings.setdefault("listen", "127.0.0.1:0")
        return cls(load_config(None, settings, environ={}), record_wire=record_wire, log_stream=log_stream,
                   log_render=log_render)

    def start(self) -> ProxyThread:
        logs.configure(self.config.log_level, self.log_stream, self.log_render)
        self._thread = threading.Thread(target=self._run, name="txnguard-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("proxy did not start within 30s")
        if self._error is not None:
            raise RuntimeError(f"proxy failed to start: {self._error!r}") from self._error
        return self

    def _run(self) -> None:
        import uvloop

        loop = uvloop.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._error = e
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _start(self) -> None:
        self.proxy = Proxy(self.config)
        if self.wire is not None:
            self.proxy.response_observer = self.wire
        await self.proxy.start()
        if self.config.admin is not None:
            self.admin = AdminServer(self.proxy, self.config.admin)
            await self.admin.start()

    def call(self, coro: Any, timeout: float = 60.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, drain_s: float | None = None) -> None:
        if self._loop is None or self.proxy is None:
            return
        proxy, admin = self.proxy, self.admin

        async def shutdown() -> None:
            if drain_s is None:
                await proxy.stop()
            else:
                await proxy.drain_and_stop(drain_s)
            if admin is not None:
                await admin.stop()

        with contextlib.suppress(Exception):
            self.call(shutdown(), timeout=(drain_s or 0) + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self.proxy = None

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests read -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        assert self.proxy is not None
        a = self.proxy.bootstrap_address
        return f"{a.host}:{a.port}"

    @property
    def admin_url(self) -> str:
        assert self.admin is not None
        return f"http://{self.admin.address.host}:{self.admin.address.port}"

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        assert self.proxy is not None
        value = self.proxy.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else float(value)

    def wait_for(self, predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")


class ProxyProcess:
    """`txnguard run` as a child process; stdout/stderr go to a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    # A cold interpreter importing kio's schemas, pydantic and uvloop takes about 1 s on an idle machine, and
    # twenty times that on two cores loaded by a dozen JVMs: the bound is for a process that never comes up.
    def start(self, wait_port: tuple[str, int] | None = None, timeout: float = 90.0) -> ProxyProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txnguard.cli", "run", *self.args],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(self.env or {})},
        )
        log.close()
        if wait_port is not None:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"proxy exited with {self.proc.returncode}:\n{self.log()}")
                with contextlib.suppress(OSError), socket.create_connection(wait_port, timeout=0.5):
                    return self
                time.sleep(0.1)
            self.proc.kill()  # a proxy that comes up after the test gave up must not outlive it
            self.proc.wait()
            raise RuntimeError(f"proxy did not listen on {wait_port} within {timeout:.0f} s:\n{self.log()}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def direct_bootstrap(cluster: Cluster, *, live: bool = False) -> str:
    """Where a client reaches the brokers themselves (`live`: only the running ones).

    The client listener, except in the sidecar layout: there the client listener advertises the
    sidecars' ports, so this is the listener the brokers replicate over (BROKER), whose Metadata names
    the brokers. A gateway bootstrapped there stands in front of the brokers of a sidecar-layout
    cluster as in front of any other, and a test reads the brokers directly through it.
    """
    nodes = [n for n in cluster.nodes if not live or _alive(n.pid)] or cluster.nodes
    return ",".join(f"{n.host}:{n.broker_port or n.port}" for n in nodes)


def gateway_for(cluster: Cluster, start_proxy: Any, **settings: Any) -> ProxyThread:
    """A gateway in front of the cluster's brokers (in the sidecar layout, on their own listener)."""
    proxy: ProxyThread = start_proxy(upstream=direct_bootstrap(cluster), mode="gateway", **settings)
    return proxy


def broker_addresses(cluster: Cluster) -> list[tuple[str, int]]:
    """Every address at which a broker really listens: what must never reach a proxied client."""
    out = [(n.host, n.port) for n in cluster.nodes]
    out += [(n.host, n.broker_port) for n in cluster.nodes if n.broker_port]
    return out

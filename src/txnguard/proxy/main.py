"""`txnguard run`: the proxy process, with signals: SIGTERM/SIGINT drain and stop."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from txnguard.proxy import logs
from txnguard.proxy.admin import AdminServer
from txnguard.proxy.config import ProxyConfig
from txnguard.proxy.server import Proxy


async def serve(config: ProxyConfig, ready: Any = None) -> None:
    proxy = Proxy(config)
    await proxy.start()
    admin = AdminServer(proxy, config.admin) if config.admin else None
    if admin is not None:
        await admin.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"txnguard {config.mode} listening on {proxy.bootstrap_address} "
          f"(upstream {','.join(str(u) for u in config.upstream)})", flush=True)
    if ready is not None:
        ready(proxy, admin)
    await stop.wait()
    proxy.log.info("draining", deadline_s=config.limits.drain_timeout_s)
    await proxy.drain_and_stop()
    if admin is not None:
        await admin.stop()


def run(config: ProxyConfig) -> None:
    logs.configure(config.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        asyncio.run(serve(config))
        return
    uvloop.run(serve(config))

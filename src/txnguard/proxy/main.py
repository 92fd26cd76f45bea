"""`txnguard run`: the proxy process, with signals: SIGTERM/SIGINT drain and stop."""

from __future__ import annotations

import asyncio
import gc
import signal
from typing import Any

from txnguard.proxy import config, logs
from txnguard.proxy.admin import AdminServer
from txnguard.proxy.config import ProxyConfig
from txnguard.proxy.server import Proxy
from txnguard.proxy.tasks import cancel_and_wait


def _reload(proxy: Proxy, path: str | None) -> None:
    """SIGHUP: re-read the file's policy section; a broken file keeps the running policy."""
    if path is None:
        proxy.log.warning("policy_reload_ignored", reason="no_config_file",
                          detail="started without --config: there is no file to re-read")
        return
    try:
        fresh = config.load(path)
        proxy.reload_policy(fresh.policy.as_mapping())
    except (config.ConfigError, ValueError) as e:
        proxy.log.error("policy_reload_failed", path=path, error=str(e))


async def serve(cfg: ProxyConfig, ready: Any = None, config_path: str | None = None,
                freeze_heap: bool = False) -> None:
    proxy = Proxy(cfg)
    await proxy.start()
    admin = AdminServer(proxy, cfg.admin) if cfg.admin else None
    if admin is not None:
        await admin.start()
    if freeze_heap:
        # Everything alive now (modules, kio's schema classes: ~90k objects) lives as long as the
        # process. A full collection walked them all: ~50 ms with the event loop stopped, measured
        # as multi-millisecond VerificationTimeMs p99s. Frozen, the collector skips them.
        gc.collect()
        gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP's default action ends the process: always handle it, even with nothing to re-read.
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload(proxy, config_path))
    print(f"txnguard {cfg.mode} listening on {proxy.bootstrap_address} "
          f"(upstream {','.join(str(u) for u in cfg.upstream)})", flush=True)
    if ready is not None:
        ready(proxy, admin)
    await stop.wait()
    proxy.log.info("draining", deadline_s=cfg.limits.drain_timeout_s)
    await proxy.drain_and_stop()
    if admin is not None:
        await admin.stop()
    # Whatever is left (a connection's reader, a shielded connect): asyncio.run would cancel it once and wait for
    # it without a bound; a task that lost that cancellation would hold the process (see tasks.py).
    await cancel_and_wait(asyncio.all_tasks() - {asyncio.current_task()}, proxy.log)


def run(cfg: ProxyConfig, config_path: str | None = None, log_render: str = "json") -> None:
    """`log_render` "auto" (`txnguard dev`): terminal-rendered lines when stderr is a TTY; `txnguard run`
    always writes JSON."""
    logs.configure(cfg.log_level, render=log_render)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        asyncio.run(serve(cfg, config_path=config_path, freeze_heap=True))
        return
    uvloop.run(serve(cfg, config_path=config_path, freeze_heap=True))

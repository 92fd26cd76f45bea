"""Admin HTTP: /metrics (Prometheus), /livez, /readyz. A deliberately tiny HTTP/1.1 server.

/readyz answers 200 only while the proxy's own Metadata request to the cluster
succeeded recently; a load balancer then stops sending clients to a proxy that
cannot reach its brokers.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from txnguard.proxy.config import HostPort
from txnguard.proxy.server import Proxy

_MAX_REQUEST = 8192


class AdminServer:
    def __init__(self, proxy: Proxy, address: HostPort) -> None:
        self.proxy = proxy
        self.address = address
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> HostPort:
        self._server = await asyncio.start_server(self._handle, self.address.host, self.address.port)
        port = self._server.sockets[0].getsockname()[1]
        self.address = HostPort(self.address.host, port)
        self.proxy.log.info("admin_listening", address=str(self.address))
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            line = head[:_MAX_REQUEST].split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(parts[0] if parts else "", path)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode() + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.proxy.metrics.registry)
        if path == "/livez":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ok, why = self.proxy.ready()
            return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", f"{why}\n".encode()
        return "404 Not Found", "text/plain", b"not found\n"

"""TLS contexts from the configuration: the listeners' (clients to the proxy) and the upstream's (the proxy to
the brokers). A module of its own so that everything that dials the brokers with the proxy's settings (the
proxy, `txnguard hanging --config`) builds the same context without importing the proxy's server."""

from __future__ import annotations

import ssl

from txnguard.proxy.config import ProxyConfig


def server_ssl_context(cfg: ProxyConfig) -> ssl.SSLContext | None:
    """The listeners' context (`tls`); None: plaintext listeners."""
    if cfg.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.tls.certfile, cfg.tls.keyfile)
    if cfg.tls.cafile:
        ctx.load_verify_locations(cfg.tls.cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.tls.require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def upstream_ssl_context(cfg: ProxyConfig) -> ssl.SSLContext | None:
    """The proxy's own broker connections' context (`upstream_tls`); None: plaintext to the brokers."""
    t = cfg.upstream_tls
    if t is None:
        return None
    ctx = ssl.create_default_context(cafile=t.cafile)
    ctx.check_hostname = t.check_hostname
    if t.certfile:
        ctx.load_cert_chain(t.certfile, t.keyfile)
    return ctx

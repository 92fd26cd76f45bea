"""TLS: the proxy terminates TLS from clients and originates TLS (or mTLS) to brokers, and says clearly
when one side speaks TLS to a plaintext port or the reverse.

    client ══TLS══▶ txnguard ══TLS══▶ broker (SSL listener, PEM key store)
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import uuid

import pytest

from txnguard.testing import kafka
from txnguard.testing.certificates import make_certs
from txnguard.testing.proxy import broker_addresses
from txnguard.testing.raw import create_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_cluster(certs, tmp_path_factory):
    cluster = kafka.up("3.5.2", 1, tmp_path_factory.mktemp("kafka-tls"), tls=certs, quick_jit=True)
    yield cluster
    cluster.down()


def _tls_proxy(start_proxy, cluster, certs, **extra):
    node = cluster.nodes[0]
    return start_proxy(
        upstream=f"{node.host}:{node.ssl_port}",
        tls={"certfile": str(certs.server_cert), "keyfile": str(certs.server_key), **extra},
        upstream_tls={"cafile": str(certs.ca)},
    )


def test_clients_speak_tls_to_the_proxy_which_speaks_tls_to_the_broker(tls_cluster, certs, start_proxy):
    proxy = _tls_proxy(start_proxy, tls_cluster, certs)
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    create_topic(tls_cluster.bootstrap_servers, topic)
    from confluent_kafka import Consumer, Producer

    tls_settings = {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL",
                    "ssl.ca.location": str(certs.ca)}
    producer = Producer({**tls_settings, "enable.idempotence": True})
    values = [f"v{i}".encode() for i in range(10)]
    for v in values:
        producer.produce(topic, value=v)
    assert producer.flush(30) == 0
    consumer = Consumer({**tls_settings, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.partition.eof": True})
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        while len(got) < len(values):
            msg = consumer.poll(30)
            assert msg is not None, f"only {len(got)} of {len(values)} records came back over TLS"
            if msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    assert got == values
    assert proxy.wire.leaks(broker_addresses(tls_cluster) + [(n.host, n.ssl_port) for n in tls_cluster.nodes]) == []
    assert proxy.metric("txnguard_connection_closes_total", {"reason": "tls_handshake_failed"}) == 0


def test_a_plaintext_client_on_the_tls_listener_is_told_and_counted(tls_cluster, certs, start_proxy):
    proxy = _tls_proxy(start_proxy, tls_cluster, certs)
    api_versions_v0 = struct.pack(">hhih", 18, 0, 1, -1)
    with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(api_versions_v0)) + api_versions_v0)
        # Closed with our request unread, the kernel may answer with a reset instead of an end of file.
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(100) == b""
    proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", {"reason": "plaintext_on_tls"}) == 1,
                   what="the plaintext-on-TLS close")


def test_client_certificates_are_required_when_configured(tls_cluster, certs, start_proxy):
    proxy = _tls_proxy(start_proxy, tls_cluster, certs, cafile=str(certs.ca), require_client_cert=True)
    port = proxy.proxy.bootstrap_address.port
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    try:
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                             server_hostname="127.0.0.1") as s:
            s.sendall(b"\x00\x00\x00\x00")
            # TLS 1.3 completes the client's side first; the refusal arrives on the first read.
            assert s.recv(10) == b""
    except (ssl.SSLError, ConnectionError):
        pass
    proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", {"reason": "tls_handshake_failed"}) == 1,
                   what="the refused handshake")
    ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                         server_hostname="127.0.0.1") as s:
        body = struct.pack(">hhih", 18, 0, 7, -1)
        s.sendall(struct.pack(">i", len(body)) + body)
        assert struct.unpack(">ii", s.recv(8))[1] == 7  # the correlation id of our ApiVersions


def test_tls_to_a_plaintext_broker_fails_with_a_clear_reason(tls_cluster, certs, start_proxy):
    plain = tls_cluster.nodes[0]
    proxy = start_proxy(upstream=f"{plain.host}:{plain.port}", upstream_tls={"cafile": str(certs.ca)},
                        limits={"connect_timeout_s": 3.0})
    with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=10) as s:
        s.settimeout(10)
        assert s.recv(10) == b""
    proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", {"reason": "upstream_unreachable"}) == 1,
                   what="the upstream close")

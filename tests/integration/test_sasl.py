"""SASL passes through the proxy untouched (the proxy never needs a client's credentials), and until
authentication completes a client may send no frame above 512 KiB, as a broker enforces.

    client ─SaslHandshake/SaslAuthenticate (PLAIN)─▶ txnguard ─(same bytes)─▶ broker SASL_PLAINTEXT
"""

from __future__ import annotations

import socket
import struct
import uuid

import pytest

from txnguard.testing import kafka
from txnguard.testing.raw import create_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory):
    cluster = kafka.up("3.5.2", 1, tmp_path_factory.mktemp("kafka-sasl"), sasl_users={"alice": "alice-secret"},
                       die_with_parent=True, quick_jit=True)
    yield cluster
    cluster.down()


def _proxy(start_proxy, cluster):
    node = cluster.nodes[0]
    return start_proxy(upstream=f"{node.host}:{node.sasl_port}", client_auth="sasl")


def _client(bootstrap: str, password: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "alice", "sasl.password": password}


def test_a_sasl_client_authenticates_with_the_broker_through_the_proxy(sasl_cluster, start_proxy):
    from confluent_kafka import Consumer, Producer

    proxy = _proxy(start_proxy, sasl_cluster)
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    create_topic(sasl_cluster.bootstrap_servers, topic)
    producer = Producer({**_client(proxy.bootstrap, "alice-secret"), "enable.idempotence": True})
    producer.produce(topic, value=b"authenticated")
    assert producer.flush(30) == 0
    consumer = Consumer({**_client(proxy.bootstrap, "alice-secret"), "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        msg = None
        for _ in range(60):
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.value() == b"authenticated"
    finally:
        consumer.close()


def test_wrong_credentials_are_the_brokers_to_refuse(sasl_cluster, start_proxy):
    from confluent_kafka import KafkaException, Producer

    proxy = _proxy(start_proxy, sasl_cluster)
    producer = Producer(_client(proxy.bootstrap, "wrong"))
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=10)
    # The refusal is the broker's answer, carried back unchanged; the proxy only counted it.
    assert proxy.metric("txnguard_frames_total", {"api": "sasl_authenticate", "direction": "broker_to_client"}) >= 1


def test_frames_above_512_kib_before_authentication_close_the_connection(sasl_cluster, start_proxy):
    proxy = _proxy(start_proxy, sasl_cluster)
    with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=5) as s:
        s.sendall(struct.pack(">i", 600 * 1024))
        s.settimeout(5)
        assert s.recv(10) == b""
    proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", {"reason": "frame_too_large"}) == 1,
                   what="the pre-authentication limit")

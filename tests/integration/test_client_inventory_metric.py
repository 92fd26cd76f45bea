"""Who is connected, live: txnguard_client_connections by KIP-511 software name and version.

    confluent-kafka ─ApiVersions v3 (confluent-kafka-python, <its version>)─▶ proxy ─▶ Kafka 3.5.2
    kafka-python    ─ApiVersions v3 (kafka-python, <its version>)─▶ proxy
    each closes ─▶ its series goes
"""

from __future__ import annotations

import pytest

from txnguard.testing.fixtures import fresh_topic

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]


def _live(proxy) -> dict[tuple[str, str, str], float]:
    return {(s.labels["software_name"], s.labels["software_version"], s.labels["family"]): s.value
            for f in proxy.proxy.metrics.registry.collect() for s in f.samples
            if s.name == "txnguard_client_connections"}


def test_real_clients_are_counted_by_software_and_version_while_connected(kafka_pool, start_proxy, unique_name):
    import confluent_kafka

    cluster = kafka_pool.get("3.5.2", 1)
    topic = fresh_topic(cluster, unique_name("who"))
    proxy = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway")
    producer = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap})
    producer.produce(topic, b"x")
    assert producer.flush(10) == 0  # connected to the leader's listener, and it stays connected
    live = _live(proxy)
    [(name, version, family)] = [k for k, n in live.items() if n >= 1]
    assert (name, family) == ("confluent-kafka-python", "librdkafka"), live
    assert version.startswith(confluent_kafka.version()[0]), (version, confluent_kafka.version())
    del producer  # closes its connections
    proxy.wait_for(lambda: _live(proxy) == {}, 10, "the series gone with the connections")

    # kafka-python, connected: counted under what it sent, beside nothing else.
    import kafka

    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest",
                                   consumer_timeout_ms=5000)
    assert next(consumer).value == b"x"  # connected, and it stays connected
    print(f"kafka-python {kafka.__version__}: {_live(proxy)}")
    [(name, version, family)] = [k for k, n in _live(proxy).items() if n >= 1]
    assert (name, version, family) == ("kafka-python", kafka.__version__, "kafka-python")
    consumer.close()
    proxy.wait_for(lambda: _live(proxy) == {}, 10, "the series gone with the connections")

"""The broker's listener change of docs/deployment/sidecar.md, step by step, on a running ZooKeeper-mode 3.0.2 cluster.

Two brokers start as the page's starting point (one listener, clients and replication on it), then the page's
three rolls, one broker at a time, and step 3's rollback on one broker; after each broker a confluent-kafka
transaction commits on the address the clients always used and read_committed reads it back:

    start     broker N: PLAINTEXT on :P (clients and replication)
    step 1    + BROKER on :R, advertised                      (replication still on PLAINTEXT)
    step 2    inter.broker.listener.name=BROKER                (replication moves to :R)
    step 3    the sidecar (the unit's ExecStart) takes :P, the broker's PLAINTEXT moves to 127.0.0.1:L
              (step 3's sed, applied to the server.properties as step 2 left it), still advertised as :P
    rollback  broker 1: the sidecar stops, PLAINTEXT back on :P (step 2's file)

P, R and L are this test's ports for the page's 9092, 9093 and 9192. Each setting below is checked to be written
on the page, so the page and this test cannot drift apart silently.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from test_systemd_sidecar import PAGE_LISTENERS, Sidecar, _properties

from txnguard.testing import kafka
from txnguard.testing.fixtures import fresh_topic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deployment" / "sidecar.md"
VERSION = "3.0.2"

# The page's settings, as written there (broker 1, its example host and ports).
START = {"listeners": "PLAINTEXT://0.0.0.0:9092", "advertised.listeners": "PLAINTEXT://broker-1.example:9092"}
STEP_1 = {"listeners": "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093",
          "advertised.listeners": "PLAINTEXT://broker-1.example:9092,BROKER://broker-1.example:9093",
          "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT"}
STEP_2 = {"inter.broker.listener.name": "BROKER"}
STEP_3_SED = "s#^listeners=PLAINTEXT://0.0.0.0:9092,#listeners=PLAINTEXT://127.0.0.1:9192,#"


def test_the_settings_below_are_the_pages():
    page = PAGE.read_text()
    for settings in (START, STEP_1, STEP_2):
        for key, value in settings.items():
            assert f"{key}={value}" in page
    assert f"sed -i '{STEP_3_SED}' server.properties" in page


def _ports(node: kafka.Node, client_port: int, loopback_port: int) -> dict[str, int]:
    assert node.broker_port is not None
    return {"9092": client_port, "9093": node.broker_port, "9192": loopback_port}


def _for_node(settings: dict[str, str], node: kafka.Node, ports: dict[str, int]) -> dict[str, str]:
    """The page's broker-1 settings for `node`: its host, and this test's ports for the page's."""
    def port(m: re.Match[str]) -> str:
        return f":{ports[m.group(1)]}"

    return {k: re.sub(r":(9092|9093|9192)\b", port, v).replace("broker-1.example", node.host)
            for k, v in settings.items()}


def _sed_step_3(line: str, ports: dict[str, int]) -> str:
    """Step 3's sed expression, with this test's ports, on one line of server.properties."""
    pattern, replacement = STEP_3_SED.split("#")[1:3]
    for page_port, port in ports.items():
        pattern, replacement = pattern.replace(f":{page_port}", f":{port}"), replacement.replace(f":{page_port}",
                                                                                                  f":{port}")
    return re.sub(pattern.replace(".", r"\."), replacement, line)


def _server_properties(cluster: kafka.Cluster, node: kafka.Node) -> Path:
    return cluster.node_dir(node.id) / "server.properties"


def _merge(cluster: kafka.Cluster, node: kafka.Node, settings: dict[str, str]) -> None:
    path = _server_properties(cluster, node)
    values = _properties(path.read_text())
    path.write_text("".join(f"{k}={v}\n" for k, v in {**values, **settings}.items()))


class Rollout:
    """The cluster, the port clients use for each broker (never changes), and the sidecars started so far."""

    def __init__(self, cluster: kafka.Cluster, folder: Path) -> None:
        self.cluster, self.folder = cluster, folder
        # At the start each broker's client listener is the harness's node.port; its loopback port comes later.
        self.client_port = {n.id: n.port for n in cluster.nodes}
        self.loopback_port = {n.id: n.sidecar_port for n in cluster.nodes}
        self.sidecars: dict[int, Sidecar] = {}

    def ports(self, node: kafka.Node) -> dict[str, int]:
        loopback = self.loopback_port[node.id]
        assert loopback is not None
        return _ports(node, self.client_port[node.id], loopback)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{n.host}:{self.client_port[n.id]}" for n in self.cluster.nodes)

    def roll(self, node: kafka.Node, settings: dict[str, str]) -> None:
        """Steps 1 and 2 (and the rollback's file): the page's settings merged in, a clean restart."""
        self.cluster.upgrade_node(node.id, VERSION, _for_node(settings, node, self.ports(node)))
        self.cluster.wait_in_sync()

    def sidecar_takes_the_client_port(self, node: kafka.Node) -> None:
        """Step 3: stop the broker, step 3's sed, start the sidecar, start the broker."""
        self.cluster.stop_node(node.id)
        path = _server_properties(self.cluster, node)
        path.write_text("".join(_sed_step_3(line, self.ports(node)) + "\n" for line in path.read_text().splitlines()))
        # The harness reaches the broker on node.port and maps node.sidecar_port (advertised) to it.
        loopback = self.loopback_port[node.id]
        assert loopback is not None
        node.port, node.sidecar_port = loopback, self.client_port[node.id]
        self.cluster.save()
        self.sidecars[node.id] = Sidecar(node, self.folder / f"sidecar-{node.id}-{time.monotonic_ns()}")
        self.cluster.start_node(node.id)
        self.cluster.wait_ready()
        self.sidecars[node.id].wait_ready()
        self.cluster.wait_in_sync()

    def roll_back_step_3(self, node: kafka.Node) -> None:
        """The page's rollback: stop the broker, step 2's listeners, stop the sidecar, start the broker."""
        self.cluster.stop_node(node.id)
        _merge(self.cluster, node, _for_node({"listeners": STEP_1["listeners"]}, node, self.ports(node)))
        assert self.sidecars.pop(node.id).stop() == 0
        node.port, node.sidecar_port = self.client_port[node.id], self.loopback_port[node.id]
        self.cluster.save()
        self.cluster.start_node(node.id)
        self.cluster.wait_ready()
        self.cluster.wait_in_sync()

    def stop(self) -> None:
        for sidecar in self.sidecars.values():
            sidecar.stop()


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[Rollout]:
    # The page's starting point on every broker; the harness's sidecar layout only allocates the ports.
    def start(node: kafka.Node) -> dict[str, str]:
        assert node.sidecar_port is not None
        return {**_for_node(START, node, _ports(node, node.port, node.sidecar_port)),
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT", "inter.broker.listener.name": "PLAINTEXT"}

    cluster = kafka.up(VERSION, 2, tmp_path / "kafka", sidecars=True, zookeeper=True, die_with_parent=True,
                       quick_jit=True, listener_config=start)
    r = Rollout(cluster, tmp_path)
    try:
        yield r
    finally:
        r.stop()
        cluster.down()


def _transaction_commits(bootstrap: str, topic: str, transactional_id: str, expected_total: int) -> int:
    """client ──bootstrap──▶ a transaction of 10 records commits; read_committed then reads every committed record."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "acks": "all"})
    producer.init_transactions(90)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, f"{transactional_id}-{i}".encode(), partition=i % 2)
    producer.commit_transaction(90)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{transactional_id}-reader",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    read = 0
    deadline = time.monotonic() + 60
    quiet_until = None  # once all are read, two more seconds in which nothing more may come (no duplicate)
    while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read += 1
        if read >= expected_total and quiet_until is None:
            quiet_until = time.monotonic() + 2
    consumer.close()
    return read


def _advertised(cluster: kafka.Cluster, node: kafka.Node) -> str:
    return _properties(_server_properties(cluster, node).read_text())["advertised.listeners"]


def test_the_pages_three_rolls_and_step_3s_rollback_keep_transactions_committing(
    rollout: Rollout, unique_name: Any,
) -> None:
    cluster = rollout.cluster
    topic = fresh_topic(cluster, unique_name("orders"), partitions=2, replication_factor=2)
    committed = 0

    def check(stage: str) -> None:
        nonlocal committed
        committed += 10
        read = _transaction_commits(rollout.bootstrap, topic, unique_name(f"tid-{stage}"), committed)
        assert read == committed, f"after {stage}: read {read} of {committed} committed records"

    check("start")
    for node in cluster.nodes:
        rollout.roll(node, STEP_1)
        check(f"step-1-broker-{node.id}")
    for node in cluster.nodes:
        rollout.roll(node, STEP_2)
        check(f"step-2-broker-{node.id}")
    before = {n.id: _advertised(cluster, n) for n in cluster.nodes}
    for node in cluster.nodes:
        rollout.sidecar_takes_the_client_port(node)
        check(f"step-3-broker-{node.id}")

    # The end state is the page's end state (deploy/systemd/broker-listeners.properties), and step 3 changed
    # nothing clients or brokers are told.
    for node in cluster.nodes:
        written = _properties(_server_properties(cluster, node).read_text())
        end_state = _for_node(_properties(PAGE_LISTENERS.read_text()), node, rollout.ports(node))
        assert {k: written[k] for k in end_state} == end_state
        assert written["advertised.listeners"] == before[node.id]
    verified = sum(s.metric("txnguard_verifications_total", decision="forwarded") for s in rollout.sidecars.values())
    assert verified > 0  # the last transaction went through the sidecars

    first = cluster.nodes[0]
    rollout.roll_back_step_3(first)
    check("rollback-broker-1")
    assert list(rollout.sidecars) == [cluster.nodes[1].id]

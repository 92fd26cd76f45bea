"""The VM sidecar as shipped: the systemd unit's own command line beside ZooKeeper-mode Kafka 3.0.2 brokers whose
listeners are set exactly as docs/deployment/sidecar.md says (deploy/systemd/broker-listeners.properties, the file
the page includes, with each broker's host and ports put in).

    broker N: PLAINTEXT on loopback (the page's 127.0.0.1:9192), advertised as its sidecar (the page's :9092);
              BROKER (the page's :9093) for replication and ZooKeeper's controller
    sidecar N: ExecStart of deploy/systemd/txnguard-sidecar.service, --config = deploy/systemd/sidecar.yaml with
              listen/upstream/admin/audit moved to this test's ports and folder

    confluent-kafka ──▶ sidecar 1/2 ──▶ broker 1/2 (loopback)      Metadata names the sidecars only
    broker 1 ◀──BROKER──▶ broker 2                                   a topic with 2 replicas, both in sync

The unit's sandbox (DynamicUser, ProtectSystem, ...) is systemd's to apply and is not exercised here: there is no
systemd running in the test environment. tests/unit/test_systemd_unit.py checks the unit with systemd-analyze.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from txnguard.testing import kafka
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.raw import RawClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "txnguard-sidecar.service"
SIDECAR_YAML = ROOT / "deploy" / "systemd" / "sidecar.yaml"
PAGE_LISTENERS = ROOT / "deploy" / "systemd" / "broker-listeners.properties"
VERSION = "3.0.2"
# The page's example host and ports, and where each one is in this test's cluster.
PAGE_HOST, PAGE_SIDECAR, PAGE_LOOPBACK, PAGE_REPLICATION = "broker-1.example", 9092, 9192, 9093


def _properties(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def page_listeners(node: kafka.Node) -> dict[str, str]:
    """The page's listener settings for this node: its host and its ports in place of the page's."""
    out = {}
    for key, value in _properties(PAGE_LISTENERS.read_text()).items():
        for page_port, port in ((PAGE_SIDECAR, node.sidecar_port), (PAGE_LOOPBACK, node.port),
                                (PAGE_REPLICATION, node.broker_port)):
            value = value.replace(f":{page_port}", f":{port}")
        out[key] = value.replace(PAGE_HOST, node.host)
    return out


def exec_start() -> list[str]:
    """The unit's ExecStart, split as systemd splits it."""
    lines = [line for line in UNIT.read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1
    return shlex.split(lines[0].removeprefix("ExecStart="))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sidecar_config(node: kafka.Node, admin_port: int, folder: Path) -> Path:
    """deploy/systemd/sidecar.yaml with the test's addresses in place of the shipped ones; the rest as shipped."""
    config = yaml.safe_load(SIDECAR_YAML.read_text())
    assert (config["listen"], config["upstream"], config["admin"]) == (
        f"0.0.0.0:{PAGE_SIDECAR}", [f"127.0.0.1:{PAGE_LOOPBACK}"], "0.0.0.0:9404")
    config["listen"] = f"{node.host}:{node.sidecar_port}"
    config["upstream"] = [f"127.0.0.1:{node.port}"]
    config["admin"] = f"127.0.0.1:{admin_port}"
    config["audit"]["path"] = str(folder / "audit.jsonl")
    path = folder / "sidecar.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Sidecar:
    """One broker's sidecar: the unit's command line, with the installed txnguard and this sidecar's config file."""

    def __init__(self, node: kafka.Node, folder: Path) -> None:
        folder.mkdir(parents=True)
        self.node, self.folder, self.admin_port = node, folder, _free_port()
        argv = exec_start()
        assert argv[0] == "/opt/txnguard/venv/bin/txnguard" and argv[1:] == [
            "run", "--config", "/etc/txnguard/sidecar.yaml"]
        self.argv = [str(Path(sys.executable).parent / "txnguard"), "run", "--config",
                     str(sidecar_config(node, self.admin_port, folder))]
        log = open(folder / "sidecar.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    @property
    def address(self) -> str:
        return f"{self.node.host}:{self.node.sidecar_port}"

    def log(self) -> str:
        return (self.folder / "sidecar.log").read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        # A cold interpreter on two loaded cores takes seconds; the follower of __transaction_state reads it once.
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, last = self.get("/readyz")
                if status == 200:
                    return
            except OSError as e:
                last = repr(e)
            time.sleep(0.3)
        raise AssertionError(f"sidecar not ready within {timeout_s:.0f} s ({last}):\n{self.log()[-3000:]}")

    def metric(self, name: str, **labels: str) -> float:
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def audit(self) -> list[dict[str, Any]]:
        path = self.folder / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> int:
        """What `systemctl stop` sends (KillSignal=SIGTERM), and its bound (TimeoutStopSec=45)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(45)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka.Cluster]:
    """Two ZooKeeper-mode brokers, their listeners as the page sets them: a cluster of its own kind, not pooled."""
    directory = tmp_path_factory.mktemp("kafka-zk-page-listeners")
    cluster = kafka.up(VERSION, 2, directory, sidecars=True, zookeeper=True, die_with_parent=True, quick_jit=True,
                       listener_config=page_listeners)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def sidecars(cluster: kafka.Cluster, tmp_path: Path) -> Iterator[list[Sidecar]]:
    started = [Sidecar(n, tmp_path / f"sidecar-{n.id}") for n in cluster.nodes]
    try:
        for s in started:
            s.wait_ready()
        yield started
    finally:
        for s in started:
            s.stop()


def test_brokers_run_with_the_pages_listener_settings(cluster: kafka.Cluster) -> None:
    for n in cluster.nodes:
        written = _properties((cluster.node_dir(n.id) / "server.properties").read_text())
        page = page_listeners(n)
        assert {k: written[k] for k in page} == page
        assert page["advertised.listeners"].startswith(f"PLAINTEXT://{n.host}:{n.sidecar_port},")
        assert page["listeners"].startswith(f"PLAINTEXT://127.0.0.1:{n.port},")


def test_a_transaction_commits_through_the_units_sidecars_and_the_brokers_advertise_them(
    cluster: kafka.Cluster, sidecars: list[Sidecar], unique_name: Any,
) -> None:
    # The topic has a replica on each broker: they replicate over BROKER, the listener no sidecar is in front of.
    topic = fresh_topic(cluster, unique_name("orders"), partitions=2, replication_factor=2)
    bootstrap = ",".join(s.address for s in sidecars)
    sidecar_addresses = {n.id: f"{n.host}:{n.sidecar_port}" for n in cluster.nodes}

    # client ──Metadata──▶ sidecar ──▶ broker: the brokers are known by their sidecars' addresses only ...
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == sidecar_addresses
    # ... and so they are to anyone who reaches a broker's loopback listener itself.
    with RawClient(cluster.nodes[0].host, cluster.nodes[0].port, timeout=10) as direct:
        answer = direct.metadata([topic])
    assert {int(b.node_id): f"{b.host}:{b.port}" for b in answer.brokers} == sidecar_addresses
    assert all(sorted(p.isr_nodes) == [1, 2] for t in answer.topics for p in t.partitions)

    # confluent-kafka ──InitProducerId, AddPartitionsToTxn, Produce, EndTxn──▶ the sidecars
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("tid"),
                         "enable.idempotence": True, "acks": "all"})
    producer.init_transactions(60)
    producer.begin_transaction()
    values = [f"order-{i}".encode() for i in range(20)]
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 2)
    producer.commit_transaction(60)

    # read_committed through the sidecars reads back every record, once.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("group"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(read) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None and (record := message.value()) is not None:
            read.append(record)
    consumer.close()
    assert sorted(read) == sorted(values)

    # Each sidecar verified its broker's partitions' first transactional writes, passed every one, refused none.
    passed = sum(s.metric("txnguard_verifications_total", decision="forwarded") for s in sidecars)
    unenforced = sum(s.metric("txnguard_verifications_total", decision="forwarded_unenforced") for s in sidecars)
    assert (passed >= 2, unenforced) == (True, 0)
    decisions = [r for s in sidecars for r in s.audit() if r["kind"] == "decision"]
    assert {r["target"] for r in decisions} == {f"{topic}-0", f"{topic}-1"}
    assert {r["decision"] for r in decisions} == {"forwarded"} and {r["mode"] for r in decisions} == {"monitor"}


def test_the_units_reload_and_stop_signals(cluster: kafka.Cluster, sidecars: list[Sidecar]) -> None:
    # ExecReload=/bin/kill -HUP $MAINPID: the policy is read again, nothing is dropped.
    sidecar = sidecars[0]
    sidecar.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "policy_reloaded" not in sidecar.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    reloaded = [json.loads(line) for line in sidecar.log().splitlines() if '"policy_reloaded"' in line]
    assert [r["mode"] for r in reloaded] == ["monitor"]  # the shipped file's mode, read again
    assert sidecar.proc.poll() is None and sidecar.get("/readyz")[0] == 200
    # KillSignal=SIGTERM: the proxy drains and exits 0 (Restart=on-failure does not restart a clean exit).
    assert sidecar.stop() == 0

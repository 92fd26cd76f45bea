"""Start, stop and inspect real Apache Kafka clusters (KRaft or ZooKeeper, loopback) from Maven Central jars.

A cluster lives in a folder: `cluster.json` (ports, pids, version), one
`node-N/` per node with its `server.properties`, data and `server.log`. The
folder is the handle: `up` writes it, `down` and `status` read it, so a
cluster started by one process (the CLI) can be stopped by another.

KRaft (the default): every node is a combined broker+controller. Three nodes form a
3-voter quorum, so the cluster survives the loss of any one node.

ZooKeeper mode (`zookeeper=True`; Kafka 2.8-3.9, the clusters most users of pre-3.6 brokers
run): one ZooKeeper server in `zookeeper/` (org.apache.zookeeper.server.ZooKeeperServerMain
from the jar the Kafka POM names, already on the broker's classpath: 2.8.2 -> 3.5.9,
3.0.2-3.3.2 -> 3.6.3, 3.4.1 -> 3.6.4), then N brokers with `zookeeper.connect`; one of them
is elected controller through ZooKeeper. ZooKeeper itself is not one of the nodes: stop,
kill and restart act on brokers, and `down` stops the brokers and then ZooKeeper.

ACLs (`acls=True`): KRaft brokers authorize with StandardAuthorizer (ACLs in the metadata log), ZooKeeper-mode
brokers with kafka.security.authorizer.AclAuthorizer (ACLs in ZooKeeper: the authorizer most users of
pre-3.6 brokers run). Either way the PLAINTEXT listener is User:ANONYMOUS, the super user (inter-broker,
the harness's probes, ACL changes through the Admin API), and clients meet the ACLs on the SASL listener.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.alter_user_scram_credentials.v0.request import (
    AlterUserScramCredentialsRequest,
    ScramCredentialUpsertion,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32

from txnguard.testing import jars
from txnguard.testing.raw import RawClient, RawProtocolError

HEAP = "512m"
# The brokers' collector (G1, short pauses), and with `quick_jit` the client compiler only (C1, no C2). Test
# sessions set quick_jit: measured on three idle Kafka 3.5.2 nodes, a cluster reached "up" on 13.9 s of CPU
# instead of 23.0 s and idled at 5.0 % of a core per node instead of 7.7 %; on two cores that run a dozen
# brokers at once, that is CPU the tests get back. Benchmarks leave it off: peak broker throughput wants C2.
BROKER_GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
QUICK_JIT = ("-XX:TieredStopAtLevel=1",)
STOP_GRACE_S = 20.0
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM-SHA-512, what kafka-configs.sh uses
READY_TIMEOUT_S = 120.0

# Broker settings for fast, small test clusters. Replication of the internal
# topics follows the node count (3 and 2 on three nodes, per the issue).
def _base_config(nodes: int) -> dict[str, str]:
    rf = str(min(3, nodes))
    return {
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": str(min(2, nodes)),
        "transaction.state.log.num.partitions": "10",
        "default.replication.factor": rf,
        "min.insync.replicas": "1",
        "num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Clients default to a 60 s transaction timeout; the broker must allow it. Timeout
        # tests lower the client's transaction.timeout.ms instead, and the coordinator
        # looks for expired transactions every second rather than every 10 s.
        "transaction.max.timeout.ms": "60000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "transaction.remove.expired.transaction.cleanup.interval.ms": "60000",
        "auto.create.topics.enable": "true",
        "log.segment.bytes": str(64 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
        "socket.request.max.bytes": str(100 * 1024 * 1024),
    }


class HarnessError(RuntimeError):
    """The cluster could not be started, reached or stopped; the message says why."""


@dataclass
class Node:
    id: int
    host: str
    port: int
    controller_port: int
    pid: int | None = None
    # Sidecar layout: clients are told to use sidecar_port (where a txnguard sidecar listens and
    # forwards to `port`); brokers talk to each other on broker_port.
    sidecar_port: int | None = None
    broker_port: int | None = None
    ssl_port: int | None = None  # a TLS listener (PEM key store), when the cluster was made with certs
    sasl_port: int | None = None  # a SASL_PLAINTEXT listener (PLAIN; SCRAM-SHA-512 too with scram users)
    version: str | None = None  # the Kafka this node runs, when a rolling upgrade moved it off the cluster's

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Cluster:
    version: str
    dir: str
    nodes: list[Node]
    config: dict[str, str] = field(default_factory=dict)
    # Test sessions set this: if the process that started a node dies (a killed pytest), the
    # kernel stops the node too. The CLI's clusters must outlive the CLI, so it does not.
    die_with_parent: bool = False
    # Test sessions set this too: brokers on the client compiler only (QUICK_JIT above).
    quick_jit: bool = False
    # ZooKeeper mode: the ZooKeeper server's client port and pid (None in KRaft mode).
    zookeeper_port: int | None = None
    zookeeper_pid: int | None = None

    @property
    def zookeeper(self) -> bool:
        return self.zookeeper_port is not None

    @property
    def zookeeper_connect(self) -> str | None:
        return f"{self.nodes[0].host}:{self.zookeeper_port}" if self.zookeeper else None

    # -- addresses -----------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise HarnessError(f"no node {node_id} in {self.dir}")

    @property
    def sidecar_bootstrap(self) -> str:
        return ",".join(f"{n.host}:{n.sidecar_port}" for n in self.nodes)

    def real_address(self, host: str, port: int) -> tuple[str, int]:
        """Where an advertised address really listens (a sidecar port maps to its broker)."""
        for n in self.nodes:
            if n.sidecar_port == port:
                return n.host, n.port
        return host, port

    def live_bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes if _alive(n.pid)) or self.bootstrap_servers

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "nodes": [{"id": n.id, "host": n.host, "port": n.port} for n in self.nodes],
            "version": self.version,
            "mode": "zookeeper" if self.zookeeper else "kraft",
            "dir": self.dir,
        }
        if self.zookeeper:
            out["zookeeper_connect"] = self.zookeeper_connect
        if any(n.sidecar_port is not None for n in self.nodes):
            out["sidecar_bootstrap"] = self.sidecar_bootstrap
        return out

    # -- persistence ------------------------------------------------------------

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def save(self) -> None:
        (self.path / "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Cluster:
        f = Path(directory) / "cluster.json"
        if not f.exists():
            raise HarnessError(f"no cluster in {directory} (no cluster.json)")
        raw = json.loads(f.read_text())
        raw["nodes"] = [Node(**n) for n in raw["nodes"]]
        return cls(**raw)

    # -- node life cycle -----------------------------------------------------------

    def node_dir(self, node_id: int) -> Path:
        return self.path / f"node-{node_id}"

    def log_tail(self, node_id: int, lines: int = 40) -> str:
        log = self.node_dir(node_id) / "server.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def start_node(self, node_id: int) -> None:
        node = self.node(node_id)
        if _alive(node.pid):
            return
        # A SIGKILLed node's accepted connections linger on its port for a while (in ZooKeeper mode the
        # controller's connection to every broker, itself included, lands on the broker's port): a node
        # that ran before gets time for them to go. A node that never ran has nothing of its own there,
        # so a taken port is someone else's and is named at once (waiting would only delay the error).
        if (self.node_dir(node_id) / "server.log").exists():
            _wait_port_free(node.host, node.port)
        else:
            _check_port_free(node.host, node.port)
        if not self.zookeeper:
            _check_port_free(node.host, node.controller_port)
        else:
            self._wait_unregistered(node_id)
        classpath = jars.classpath(jars.resolve("kafka_2.13", node.version or self.version))
        nd = self.node_dir(node_id)
        log = open(nd / "server.log", "ab")  # noqa: SIM115 - handed to the child process
        cmd = [
            "java", f"-Xmx{HEAP}", f"-Xms{HEAP}", *BROKER_GC, *(QUICK_JIT if self.quick_jit else ()),
            "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            f"-Dlog4j2.configurationFile={nd / 'log4j2.properties'}",
            f"-Dlog4j.configuration=file:{nd / 'log4j.properties'}",
            f"-Dkafka.logs.dir={nd / 'logs'}",
            "-cp", classpath, "kafka.Kafka", str(nd / "server.properties"),
        ]
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        log.close()
        node.pid = proc.pid
        self.save()

    def stop_node(self, node_id: int, *, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after `grace_s`."""
        node = self.node(node_id)
        _terminate(node.pid, grace_s)
        node.pid = None
        self.save()

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: the broker gets no chance to flush or hand over leadership."""
        self.stop_node(node_id, grace_s=0)

    def pause_node(self, node_id: int, *, timeout_s: float = 10.0) -> None:
        """SIGSTOP the node's process group: its sockets stay open (connects still succeed, the kernel
        accepts them) but it answers nothing, as a broker in a long GC pause or a frozen VM.

        Returns once every thread of the node is stopped. Always pair with `resume_node` (try/finally):
        a paused node holds its partitions and its place in the quorum hostage.
        """
        node = self.node(node_id)
        if not _alive(node.pid):
            raise HarnessError(f"node {node_id} is not running; nothing to pause")
        assert node.pid is not None
        os.killpg(node.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while not _stopped(node.pid):
            if time.monotonic() > deadline:
                raise HarnessError(f"node {node_id} (pid {node.pid}) did not stop within {timeout_s:.0f}s")
            time.sleep(0.01)

    def resume_node(self, node_id: int) -> None:
        """SIGCONT the node's process group; a no-op for a node that is not paused or not running."""
        node = self.node(node_id)
        if node.pid is not None and _alive(node.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGCONT)

    def paused(self, node_id: int) -> bool:
        node = self.node(node_id)
        return node.pid is not None and _alive(node.pid) and _stopped(node.pid)

    def restart_node(self, node_id: int, *, kill: bool = False, timeout_s: float = READY_TIMEOUT_S) -> None:
        if kill:
            self.kill_node(node_id)
        else:
            self.stop_node(node_id)
        self.start_node(node_id)
        self.wait_ready(timeout_s)

    def upgrade_node(self, node_id: int, version: str, config: Mapping[str, str] | None = None, *,
                     timeout_s: float = READY_TIMEOUT_S) -> None:
        """One step of a rolling upgrade: a clean shutdown (SIGTERM), `config` merged into the node's
        server.properties, the node started on Kafka `version` with its data folder, and the cluster ready.
        The same version with new settings is a rolling restart (inter.broker.protocol.version raised).
        ZooKeeper stays as it is: the broker's own ZooKeeper client talks to it."""
        self.stop_node(node_id)
        props = self.node_dir(node_id) / "server.properties"
        values = dict(line.split("=", 1) for line in props.read_text().splitlines() if "=" in line)
        props.write_text(_properties({**values, **(config or {})}))
        self.node(node_id).version = version
        self.save()
        self.start_node(node_id)
        self.wait_ready(timeout_s)

    def versions(self) -> dict[int, str]:
        """The Kafka version each node runs (differs from `version` during a rolling upgrade)."""
        return {n.id: n.version or self.version for n in self.nodes}

    # -- ZooKeeper (ZooKeeper mode only) ---------------------------------------------------------

    @property
    def zookeeper_dir(self) -> Path:
        return self.path / "zookeeper"

    def start_zookeeper(self, timeout_s: float = 30.0) -> None:
        """ZooKeeperServerMain from the broker's own classpath (the ZooKeeper its Kafka POM names)."""
        if not self.zookeeper or _alive(self.zookeeper_pid):
            return
        host, port = self.nodes[0].host, self.zookeeper_port
        assert port is not None
        _check_port_free(host, port)
        zd = self.zookeeper_dir
        log = open(zd / "zookeeper.log", "ab")  # noqa: SIM115 - handed to the child process
        proc = subprocess.Popen(
            ["java", "-Xmx128m", "-Xms64m", *(QUICK_JIT if self.quick_jit else ()),
             f"-Dlog4j.configuration=file:{zd / 'log4j.properties'}",
             f"-Dlog4j2.configurationFile={zd / 'log4j2.properties'}", "-Dzookeeper.admin.enableServer=false",
             "-cp", jars.classpath(jars.resolve("kafka_2.13", self.version)),
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(zd / "zoo.cfg")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        log.close()
        self.zookeeper_pid = proc.pid
        self.save()
        deadline = time.monotonic() + timeout_s
        while not _port_open(host, port):
            if not _alive(self.zookeeper_pid):
                raise HarnessError(f"ZooKeeper exited early; last lines of its log:\n{self._zk_tail()}")
            if time.monotonic() > deadline:
                raise HarnessError(f"ZooKeeper did not open {host}:{port} within {timeout_s:.0f}s:\n"
                                   f"{self._zk_tail()}")
            time.sleep(0.1)

    def _wait_unregistered(self, node_id: int, timeout_s: float = 30.0) -> None:
        """A SIGKILLed broker's registration (an ephemeral znode) lives until its ZooKeeper session expires
        (zookeeper.session.timeout.ms, 6 s here); a broker started before that dies with "node already
        exists". ZooKeeper's `dump` command lists every session's ephemeral nodes."""
        if not _alive(self.zookeeper_pid):
            return
        host, port = self.nodes[0].host, self.zookeeper_port
        assert port is not None
        path = f"/brokers/ids/{node_id}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((host, port), timeout=2) as s:
                    s.sendall(b"dump")
                    out = b""
                    while chunk := s.recv(65536):
                        out += chunk
            except OSError:
                return  # ZooKeeper cannot say: let the broker try
            if path not in out.decode(errors="replace").split():
                return
            time.sleep(0.2)
        raise HarnessError(f"broker {node_id} is still registered in ZooKeeper after {timeout_s:.0f}s")

    def stop_zookeeper(self) -> None:
        _terminate(self.zookeeper_pid, STOP_GRACE_S)
        self.zookeeper_pid = None
        self.save()

    def _zk_tail(self, lines: int = 40) -> str:
        log = self.zookeeper_dir / "zookeeper.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"

    def down(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every node: SIGTERM to all at once (one at a time, the last waits for the others'
        timeouts), wait up to `grace_s`, then SIGKILL whatever is left. ZooKeeper last: brokers shut down
        cleanly only while they can reach it. `grace_s=0` kills at once, for a cluster whose data is thrown
        away (a clean shutdown of three nodes can take the whole grace while the quorum shrinks)."""
        running = [n.pid for n in self.nodes if n.pid is not None and _alive(n.pid)]
        for pid in running if grace_s > 0 else ():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_alive(pid) for pid in running) and time.monotonic() < deadline:
            for pid in running:
                _reap(pid)
            time.sleep(0.1)
        for n in self.nodes:
            _terminate(n.pid, 0)  # SIGKILL only what ignored SIGTERM
            n.pid = None
        self.save()
        if self.zookeeper:
            self.stop_zookeeper()

    def status(self) -> dict[str, Any]:
        out = self.summary()
        for entry, n in zip(out["nodes"], self.nodes, strict=True):
            entry["pid"] = n.pid
            entry["alive"] = _alive(n.pid)
            entry["listening"] = _port_open(n.host, n.port)
        if self.zookeeper:
            assert self.zookeeper_port is not None
            out["zookeeper"] = {"pid": self.zookeeper_pid, "alive": _alive(self.zookeeper_pid),
                                "listening": _port_open(self.nodes[0].host, self.zookeeper_port)}
        return out

    # -- readiness ---------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Every live broker registered in metadata, a transactional id gets a producer id, and a group
        has a coordinator (__consumer_offsets exists and is loaded: a confluent-kafka client's first
        send_offsets_to_transaction on a fresh cluster can otherwise hang while it is being created)."""
        deadline = time.monotonic() + timeout_s
        live = [n for n in self.nodes if n.pid is not None]
        for n in live:
            while not _port_open(n.host, n.port):
                self._check_alive(n)
                if time.monotonic() > deadline:
                    raise HarnessError(f"node {n.id} did not open {n.address} within {timeout_s:.0f}s:\n"
                                       f"{self.log_tail(n.id)}")
                time.sleep(0.2)
        want = {n.id for n in live}
        last = ""
        while True:
            for n in live:
                self._check_alive(n)
            try:
                if self._registered(live[0]) >= want and self._transactions_work(live[0]) \
                        and self._groups_work(live[0]):
                    return
                last = "brokers not all registered, or the transaction or group coordinator is not ready"
            except (OSError, RawProtocolError) as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise HarnessError(f"cluster in {self.dir} not ready after {timeout_s:.0f}s: {last}")
            time.sleep(0.3)

    def wait_in_sync(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Every partition (the internal topics too) has all its replicas in sync: a rolling upgrade takes
        the next broker down only then, or a partition can drop below its min.insync.replicas."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = [n for n in self.nodes if _alive(n.pid)]
            try:
                with RawClient(live[0].host, live[0].port, timeout=5) as c:
                    md = c.metadata(None)
                lagging = [f"{t.name}-{p.partition_index}" for t in md.topics for p in t.partitions
                           if set(p.isr_nodes) != set(p.replica_nodes)]
            except (OSError, RawProtocolError) as e:
                lagging = [repr(e)]
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"not in sync after {timeout_s:.0f}s: {', '.join(lagging[:10])}")
            time.sleep(0.3)

    def _check_alive(self, n: Node) -> None:
        if not _alive(n.pid):
            raise HarnessError(f"Kafka {self.version} node {n.id} exited early; last lines of its log:\n"
                               f"{self.log_tail(n.id)}")

    def _registered(self, n: Node) -> set[int]:
        with RawClient(n.host, n.port, timeout=5) as c:
            md = c.metadata([])
        return {int(b.node_id) for b in md.brokers}

    def _transactions_work(self, n: Node) -> bool:
        with RawClient(n.host, n.port, timeout=10) as c:
            fc = c.find_coordinator("txnguard-harness-probe", key_type=1)
            if fc.error_code != ErrorCode.none:
                return False
        host, port = self.real_address(str(fc.host), int(fc.port))
        with RawClient(host, port, timeout=10) as c:
            r = c.init_producer_id("txnguard-harness-probe", 10000)
            return bool(r.error_code == ErrorCode.none)

    def _groups_work(self, n: Node) -> bool:
        with RawClient(n.host, n.port, timeout=10) as c:
            return bool(c.find_coordinator("txnguard-harness-probe", key_type=0).error_code == ErrorCode.none)

    # -- SCRAM credentials (ZooKeeper mode) ---------------------------------------------------

    def add_scram_users(self, users: Mapping[str, str], timeout_s: float = 60.0) -> None:
        """SCRAM-SHA-512 credentials for `users`, through AlterUserScramCredentials (KIP-554, Kafka 2.7+) as the
        super user on the PLAINTEXT listener; the controller stores them in ZooKeeper and every broker reads
        them from there. Returns once each user authenticates on each broker's SASL listener. (KRaft clusters
        get theirs at format time instead: `kafka-storage format --add-scram`.)"""
        upsertions = []
        for user, password in users.items():
            salt = os.urandom(32)
            upsertions.append(ScramCredentialUpsertion(
                name=user, mechanism=i8(2), iterations=i32(SCRAM_ITERATIONS), salt=salt,  # 2: SCRAM-SHA-512
                salted_password=hashlib.pbkdf2_hmac("sha512", password.encode(), salt, SCRAM_ITERATIONS)))
        request = AlterUserScramCredentialsRequest(deletions=(), upsertions=tuple(upsertions))
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            try:
                live = [n for n in self.nodes if _alive(n.pid)]
                with RawClient(live[0].host, live[0].port, timeout=10) as c:
                    controller = int(c.metadata([]).controller_id)
                node = self.node(controller)
                with RawClient(node.host, node.port, timeout=10) as c:
                    errors = {r.user: r.error_code for r in c.request(request).results
                              if r.error_code != ErrorCode.none}
                if not errors:
                    break
                last = f"AlterUserScramCredentials answered {errors}"  # NOT_CONTROLLER while it moves
            except (OSError, RawProtocolError, HarnessError) as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise HarnessError(f"SCRAM credentials not stored after {timeout_s:.0f}s: {last}")
            time.sleep(0.3)
        # Each broker learns them from ZooKeeper's change notification: wait until every one accepts them.
        for n in self.nodes:
            for user, password in users.items():
                while True:
                    try:
                        with RawClient(n.host, int(n.sasl_port or 0), timeout=10, sasl=(user, password)):
                            break
                    except (OSError, RawProtocolError) as e:
                        if time.monotonic() > deadline:
                            raise HarnessError(f"node {n.id} refuses {user}'s SCRAM credentials after "
                                               f"{timeout_s:.0f}s: {e!r}") from e
                        time.sleep(0.2)

    # -- lookups ----------------------------------------------------------------------

    def transaction_coordinator(self, transactional_id: str) -> int:
        from txnguard.testing.raw import coordinator_for

        return coordinator_for(self.live_bootstrap(), transactional_id, key_type=1)[0]

    def group_coordinator(self, group_id: str) -> int:
        from txnguard.testing.raw import coordinator_for

        return coordinator_for(self.live_bootstrap(), group_id, key_type=0)[0]

    def leader(self, topic: str, partition: int) -> int:
        from txnguard.testing.raw import leader_of

        return leader_of(self.live_bootstrap(), topic, partition)[0]


# -- creating a cluster ---------------------------------------------------------------------


def _ephemeral_floor() -> int | None:
    """The first port of the kernel's ephemeral range (outgoing connections' local ports); None: not readable."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# A node's ports are picked below the ephemeral range. A port picked by binding port 0 was free when picked, but
# an outgoing connection (a client, the other test worker's) could take it before the node bound it, or while a
# stopped node was down: a gate run failed so. Each pytest-xdist worker picks from a share of its own.
_PORTS_FROM = 20000
_PICKED: set[int] = set()  # every port this process picked
_RNG = random.Random()  # its own: a test that seeds the module's generator is not disturbed


def _port_range() -> range:
    """This worker's share of the ports below the ephemeral range (empty when that range is not known)."""
    floor = _ephemeral_floor()
    if floor is None:
        return range(0)
    low, high = _PORTS_FROM, floor - 1
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and workers > 1:
        share = (high - low + 1) // workers
        low += int(worker[2:]) % workers * share
        high = low + share - 1
    return range(low, high + 1)


def _free_port(host: str, taken: set[int]) -> int:
    ports = _port_range()
    for _ in range(200):
        if len(ports) < 1000:  # an ephemeral range not known, or starting low: the kernel's pick, as before
            with socket.socket() as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
        else:
            port = _RNG.choice(ports)
            if port in _PICKED:
                continue
            try:
                _check_port_free(host, port)
            except HarnessError:
                continue
        if port not in taken:
            taken.add(port)
            _PICKED.add(port)
            return port
    raise HarnessError("no free loopback port found")


def _cluster_id() -> str:
    # URL-safe base64 of a UUID, as Kafka's Uuid.randomUuid; like it, never one starting
    # with "-", which StorageTool would read as an option.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _listener_layout(cluster: Cluster, n: Node, voters: str, sidecars: bool) -> dict[str, str]:
    """A node's role and listeners: KRaft broker+controller or a ZooKeeper-mode broker; with `sidecars`,
    clients learn the sidecar's address and brokers replicate over a listener of their own."""
    host = n.host
    if cluster.zookeeper:
        props = {
            "broker.id": str(n.id),
            "zookeeper.connect": str(cluster.zookeeper_connect),
            "zookeeper.session.timeout.ms": "6000",  # a killed broker leaves the cluster within 6 s
            "listeners": f"PLAINTEXT://{host}:{n.port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{n.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT",
        }
        if sidecars:
            props.update({
                "listeners": f"PLAINTEXT://{host}:{n.port},BROKER://{host}:{n.broker_port}",
                "advertised.listeners": f"PLAINTEXT://{host}:{n.sidecar_port},BROKER://{host}:{n.broker_port}",
                "inter.broker.listener.name": "BROKER",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT",
            })
        return props
    props = {
        "process.roles": "broker,controller",
        "node.id": str(n.id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{n.port},CONTROLLER://{host}:{n.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{n.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    }
    if sidecars:
        props.update({
            "listeners": f"PLAINTEXT://{host}:{n.port},BROKER://{host}:{n.broker_port},"
                         f"CONTROLLER://{host}:{n.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{n.sidecar_port},BROKER://{host}:{n.broker_port}",
            "inter.broker.listener.name": "BROKER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        })
    return props


def _security(props: dict[str, str], n: Node, tls: Any, sasl_users: Mapping[str, str] | None,
              scram_users: Mapping[str, str] | None, acls: bool, zookeeper: bool = False) -> None:
    """Extra TLS and SASL listeners, SCRAM and the authorizer, added to a node's settings."""
    host = n.host
    if tls is not None:
        # An extra TLS listener; KIP-651 PEM stores, so the test certificates need no keytool.
        props["listeners"] += f",SSL://{host}:{n.ssl_port}"
        props["advertised.listeners"] += f",SSL://{host}:{n.ssl_port}"
        props["listener.security.protocol.map"] += ",SSL:SSL"
        props.update({
            "listener.name.ssl.ssl.keystore.type": "PEM",
            "listener.name.ssl.ssl.keystore.location": str(tls.server_pem),
            "listener.name.ssl.ssl.truststore.type": "PEM",
            "listener.name.ssl.ssl.truststore.location": str(tls.ca),
            "listener.name.ssl.ssl.client.auth": "requested",
        })
    if sasl_users or scram_users:
        users = " ".join(f'user_{u}="{pw}"' for u, pw in {**(sasl_users or {}), **(scram_users or {})}.items())
        props["listeners"] += f",SASL_PLAINTEXT://{host}:{n.sasl_port}"
        props["advertised.listeners"] += f",SASL_PLAINTEXT://{host}:{n.sasl_port}"
        props["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
        props.update({
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        })
    if scram_users:
        props.update({
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        })
    if acls:
        props.update({
            # ZooKeeper mode: the ACLs live in ZooKeeper (/kafka-acl), written by the Admin API through a super user
            # (no zookeeper.set.acl: that guards the znodes themselves, not Kafka's authorization).
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer" if zookeeper
                                     else "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",  # the inter-broker (PLAINTEXT) listener's principal
            "allow.everyone.if.no.acl.found": "false",
        })


def _before_kraft(version: str) -> bool:
    """Kafka before 3.0 has no KRaft storage tool this harness can drive (2.8's KRaft was early access)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) < (3, 0)


def _zookeeper_config(cluster: Cluster, host: str) -> None:
    """A standalone ZooKeeper for the cluster: its own data folder, no admin server (it would take port 8080)."""
    zd = cluster.zookeeper_dir
    if zd.exists():
        subprocess.run(["rm", "-rf", str(zd)], check=True)
    (zd / "data").mkdir(parents=True)
    _log_config(zd)
    (zd / "zoo.cfg").write_text(_properties({
        "dataDir": str(zd / "data"),
        "clientPort": str(cluster.zookeeper_port),
        "clientPortAddress": host,
        "tickTime": "2000",
        "initLimit": "10",
        "syncLimit": "5",
        "maxClientCnxns": "0",
        "admin.enableServer": "false",
        "4lw.commands.whitelist": "dump,ruok,srvr",  # `dump`: the harness waits for a killed broker's znode to go
    }))


def _properties(values: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def _log_config(nd: Path) -> None:
    # Kafka 3.x logs through log4j 1 (reload4j) or slf4j-simple, 4.x through log4j2.
    # Either way everything goes to stdout, which start_node sends to server.log.
    (nd / "log4j.properties").write_text(
        "log4j.rootLogger=INFO, stdout\n"
        "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        "log4j.logger.kafka.request.logger=WARN\n"
    )
    (nd / "log4j2.properties").write_text(
        "appender.stdout.type=Console\n"
        "appender.stdout.name=STDOUT\n"
        "appender.stdout.layout.type=PatternLayout\n"
        "appender.stdout.layout.pattern=[%d] %p %m (%c)%n\n"
        "rootLogger.level=INFO\n"
        "rootLogger.appenderRefs=stdout\n"
        "rootLogger.appenderRef.stdout.ref=STDOUT\n"
    )


def create(
    version: str,
    nodes: int,
    directory: str | os.PathLike[str],
    config: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    sidecars: bool = False,
    tls: Any = None,
    sasl_users: Mapping[str, str] | None = None,
    scram_users: Mapping[str, str] | None = None,
    acls: bool = False,
    zookeeper: bool = False,
    listener_config: Callable[[Node], Mapping[str, str]] | None = None,
) -> Cluster:
    """Write the configuration of a fresh cluster and format its storage (nothing runs yet).

    With `zookeeper`, a ZooKeeper-mode cluster (Kafka 2.8-3.9): a `zookeeper/` folder with its
    zoo.cfg, brokers with `broker.id` and `zookeeper.connect`, no storage to format. There SCRAM
    credentials go into ZooKeeper once the brokers run (`up` does it: `Cluster.add_scram_users`), and
    `acls` means AclAuthorizer.

    With `sidecars`, every broker advertises a sidecar port for clients (see
    deploy/sidecar/README.md): the layout a txnguard sidecar deployment uses. `listener_config(node)`
    replaces settings of that layout per node (a page's own `listeners`/`advertised.listeners`, with the
    node's ports put in); the harness still reaches each broker on `node.port`, so that is where the
    broker must listen for plaintext clients.

    With `scram_users`, the SASL listener offers SCRAM-SHA-512 (and PLAIN) for these users, their
    credentials written into the metadata log at format time (`kafka-storage format --add-scram`,
    KIP-900, Kafka 3.5+). With `acls`, StandardAuthorizer (AclAuthorizer in ZooKeeper mode) denies
    whatever no ACL allows (`allow.everyone.if.no.acl.found=false`); the
    PLAINTEXT listener (inter-broker, controller, this harness's own probes and ACL changes: loopback
    only) is User:ANONYMOUS, the super user, so clients that must meet the ACLs use the SASL port.
    """
    if nodes < 1:
        raise HarnessError("a cluster needs at least one node")
    if not zookeeper and _before_kraft(version):
        raise HarnessError(f"Kafka {version} has no production KRaft mode here: use --zookeeper")
    path = Path(directory).absolute()
    if (path / "cluster.json").exists():
        old = Cluster.load(path)
        if any(_alive(n.pid) for n in old.nodes) or _alive(old.zookeeper_pid):
            raise HarnessError(f"a cluster is already running in {path}: run `txnguard kafka down --dir {path}`")
    path.mkdir(parents=True, exist_ok=True)
    taken: set[int] = set()
    members = [Node(id=i, host=host, port=_free_port(host, taken), controller_port=_free_port(host, taken),
                    sidecar_port=_free_port(host, taken) if sidecars else None,
                    broker_port=_free_port(host, taken) if sidecars else None,
                    ssl_port=_free_port(host, taken) if tls is not None else None,
                    sasl_port=_free_port(host, taken) if sasl_users or scram_users else None)
               for i in range(1, nodes + 1)]
    settings = {**_base_config(nodes), **(config or {})}
    cluster = Cluster(version=version, dir=str(path), nodes=members, config=settings,
                      zookeeper_port=_free_port(host, taken) if zookeeper else None)
    if zookeeper:
        _zookeeper_config(cluster, host)
    voters = ",".join(f"{n.id}@{n.host}:{n.controller_port}" for n in members)
    cluster_id = _cluster_id()
    server_jars = jars.resolve("kafka_2.13", version)
    for n in members:
        nd = cluster.node_dir(n.id)
        if nd.exists():
            subprocess.run(["rm", "-rf", str(nd)], check=True)
        (nd / "data").mkdir(parents=True)
        (nd / "logs").mkdir()
        _log_config(nd)
        props = {**_listener_layout(cluster, n, voters, sidecars), "log.dirs": str(nd / "data"), **settings,
                 **(listener_config(n) if listener_config else {})}
        _security(props, n, tls, sasl_users, scram_users, acls, zookeeper)
        scram = [a for u, pw in (scram_users or {}).items()
                 for a in ("--add-scram", f"SCRAM-SHA-512=[name={u},password={pw}]")]
        (nd / "server.properties").write_text(_properties(props))
        if zookeeper:
            continue  # ZooKeeper mode formats nothing: the broker creates its log dirs and registers itself
        fmt = subprocess.run(
            ["java", "-Xmx256m", f"-Dlog4j.configuration=file:{nd / 'log4j.properties'}",
             f"-Dlog4j2.configurationFile={nd / 'log4j2.properties'}",
             "-cp", jars.classpath(server_jars), "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(nd / "server.properties"), *scram],
            capture_output=True, text=True, check=False,
        )
        if fmt.returncode != 0:
            raise HarnessError(f"formatting node {n.id} failed:\n{fmt.stdout}\n{fmt.stderr}")
    cluster.save()
    return cluster


def up(
    version: str,
    nodes: int,
    directory: str | os.PathLike[str],
    config: Mapping[str, str] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    sidecars: bool = False,
    tls: Any = None,
    die_with_parent: bool = False,
    sasl_users: Mapping[str, str] | None = None,
    scram_users: Mapping[str, str] | None = None,
    acls: bool = False,
    zookeeper: bool = False,
    quick_jit: bool = False,
    listener_config: Callable[[Node], Mapping[str, str]] | None = None,
) -> Cluster:
    """Create, start and wait until every broker is registered and transactions and groups work."""
    cluster = create(version, nodes, directory, config, sidecars=sidecars, tls=tls, sasl_users=sasl_users,
                     scram_users=scram_users, acls=acls, zookeeper=zookeeper, listener_config=listener_config)
    cluster.die_with_parent = die_with_parent
    cluster.quick_jit = quick_jit
    try:
        cluster.start_zookeeper()
        for n in cluster.nodes:
            cluster.start_node(n.id)
        cluster.wait_ready(timeout_s)
        if zookeeper and scram_users:
            cluster.add_scram_users(scram_users, timeout_s)
    except BaseException:
        cluster.down()
        raise
    return cluster


def down(directory: str | os.PathLike[str]) -> Cluster:
    cluster = Cluster.load(directory)
    cluster.down()
    return cluster


# -- process helpers ----------------------------------------------------------------------------


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (exited, not yet reaped) still answers signal 0.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stopped(pid: int) -> bool:
    """Every thread of the process is in the stopped state (SIGSTOP delivered everywhere)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().split(")")[-1].split()[0]
        except OSError:
            continue  # the thread exited meanwhile
        if state not in ("T", "t"):
            return False
    return True


def _die_with_parent() -> None:
    """In the child before exec: ask Linux for SIGTERM when the parent thread exits (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _terminate(pid: int | None, grace_s: float) -> None:
    if pid is None or not _alive(pid):
        return
    try:
        # The node runs in its own session, so its process group is its pid. A paused node
        # (pause_node) handles SIGTERM only once continued.
        if grace_s > 0:
            os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < end:
            _reap(pid)
            time.sleep(0.05)
    _reap(pid)


def java_processes_in(directory: str | Path) -> int:
    """Kafka and ZooKeeper JVMs whose command line names `directory` (read whole: ps cuts long class paths).

    What "nothing left running" means for a cluster: a port it used may already belong to another process
    (a parallel test's broker or client takes a freed port), a JVM naming its folder cannot."""
    needle = str(directory)
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace")
        except OSError:
            continue
        if ("kafka.Kafka" in args or "ZooKeeperServerMain" in args) and needle in args:
            count += 1
    return count


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port_free(host: str, port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _check_port_free(host, port)
            return
        except HarnessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise HarnessError(f"port {host}:{port} is already in use ({e.strerror}); "
                               "another cluster or process holds it") from e


def parse_config(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise HarnessError(f"--config expects key=value, got {p!r}")
        out[key.strip()] = value.strip()
    return out

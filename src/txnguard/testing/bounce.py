"""The proxy itself fails (issue 10, deliverable 3): SIGKILL a txnguard process in the middle of an
exactly-once copy, restart it on the same ports, and check what came out.

    gateway mode:  copier ──▶ gateway (a `txnguard run` process) ──▶ Kafka, 3 nodes
    sidecar mode:  copier ──▶ sidecar 1 ─▶ broker 1, sidecar 2 ─▶ broker 2, sidecar 3 ─▶ broker 3
                   (the cluster in sidecar layout; each sidecar a process; the one killed is the sidecar
                   in front of the transaction coordinator of the copier's transactional id: every
                   AddPartitionsToTxn, AddOffsetsToTxn and EndTxn goes through it, and
                   the other sidecars' DescribeTransactions questions reach the coordinator through it)
    relay mode:    copier ──▶ relay 1 ─▶ broker 1, relay 2 ─▶ broker 2, relay 3 ─▶ broker 3
                   (the control without any txnguard: plain TCP relays (testing.faults.FaultRelay, no
                   fault installed) on the sidecar ports; all three stopped at once, every connection
                   reset as a gateway's SIGKILL resets them, and started again on the same ports)
          SIGKILL once the output holds `kill_at` records; restart `pause_s` later on the same ports

The confluent-kafka loop runs in a child process: librdkafka can block in send_offsets_to_transaction
past its own timeout (see `ConfluentChild`), and a blocked handle can only be abandoned with its process.

A run passes when the copier finished, the output equals the input at read_committed (no loss, no
duplicate, in order), no transaction is left open (LSO == high watermark, and find-hanging with a
0-minute bound, so that every open transaction is a candidate, is empty on the output and on the group's
__consumer_offsets partition), and every write refused after the kill is justified: it carries a reason,
and it is either retriable (the coordinator did not answer: the client retries it) or rests on an answer
from Kafka (the coordinator's DescribeTransactions, the leader's DescribeProducers), never on local
evidence that died with the killed process. `lost` counts input records missing from the output at
read_committed: for a copier that hung, the ones it never copied.
Used by tests/integration/test_proxy_bounce.py and bench/proxy_bounce.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import random
import signal
import socket
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.codecs.groups import CONSUMER_OFFSETS, offsets_partition_for
from txnguard.testing import clients, raw
from txnguard.testing.faults import FaultRelay
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kafka import Cluster, Node
from txnguard.testing.proxy import ProxyProcess

COPIERS = ("java-3.5.2", "java-2.8.2", "confluent-kafka")
MODES = ("gateway", "sidecar", "relay")
# A refusal the client retries (the coordinator did not answer, or answered CONCURRENT_TRANSACTIONS and the like).
RETRIABLE = "coordinator_unavailable"
# What an answer from Kafka itself is ("cache": a coordinator answer within its staleness bound, which a
# restarted process can only have asked for itself; "log": the coordinator's own log, read to its end before a
# refusal); "local" evidence is what this process observed.
KAFKA_EVIDENCE = frozenset({"coordinator", "cache", "leader", "request", "log"})


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, for a listener opened later (maybe twice: a proxy restarted on it),
    chosen below the kernel's ephemeral range. Outbound connections (clients', every proxy's own to its brokers)
    take their local ports from that range, and one once took a port chosen there before the gateway bound it:
    "Address already in use", a broker listener missing, the copier through it stalled."""
    low = _ephemeral_low()
    for _ in range(500):
        port = random.randint(10_000, low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every try taken: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listener_ports(cluster: Cluster) -> dict[int, int]:
    """A free port per broker listener, chosen once so that a restarted gateway opens the same ones (the
    default, bootstrap port + 1 + node id, may already be taken on a busy machine)."""
    return {n.id: free_port() for n in cluster.nodes}


def _start(settings: dict[str, Any], listen: tuple[str, int], admin: int, log: Path) -> ProxyProcess:
    """A txnguard process, returned once it listens and /readyz says it knows the brokers."""
    config = log.with_suffix(".yaml")
    config.write_text(json.dumps({**settings, "admin": f"127.0.0.1:{admin}", "log_level": "warning"}))
    proxy = ProxyProcess(["--config", str(config)], log).start(wait_port=listen)
    deadline = time.monotonic() + 30
    why = "no answer"
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proxy
        except urllib.error.HTTPError as e:  # 503 and the reason the proxy gives
            why = e.read().decode(errors="replace").strip()
        except OSError as e:
            why = str(e)
        if time.monotonic() > deadline:
            proxy.terminate()  # not left behind: the caller never saw it
            raise RuntimeError(f"the proxy was not ready within 30 s (/readyz: {why}):\n{proxy.log()}")
        time.sleep(0.1)


def gateway(cluster: Cluster, port: int, admin: int, audit: Path, log: Path,
            broker_ports: dict[int, int], *, upstream: str | None = None) -> ProxyProcess:
    """A gateway process, returned once its bootstrap port listens and /readyz says it knows the brokers.

    `upstream`: where it bootstraps (default the brokers; J1-lite gives it the fault relays)."""
    return _start({"mode": "gateway", "upstream": upstream or cluster.bootstrap_servers,
                   "listen": f"127.0.0.1:{port}", "broker_ports": broker_ports, "audit": {"path": str(audit)}},
                  ("127.0.0.1", port), admin, log)


def sidecar(node: Node, admin: int, audit: Path, log: Path) -> ProxyProcess:
    """The sidecar of one broker of a cluster in sidecar layout, on the port the broker advertises."""
    assert node.sidecar_port is not None, "the cluster is not in sidecar layout"
    return _start({"mode": "sidecar", "upstream": node.address, "listen": f"{node.host}:{node.sidecar_port}",
                   "audit": {"path": str(audit)}}, (node.host, node.sidecar_port), admin, log)


def follower_figures(admin: int, timeout_s: float = 10.0) -> tuple[float, float]:
    """A proxy process's log follower from its /metrics: (records of __transaction_state read, records behind),
    waiting (at most `timeout_s`) for the follower to be at the end of the log."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
                samples = [s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples]
        except OSError:  # the process is gone: no figures
            return -1.0, -1.0
        read = sum(s.value for s in samples if s.name == "txnguard_transaction_log_records_total")
        lag = sum(s.value for s in samples if s.name == "txnguard_transaction_log_lag_records")
        if lag == 0 or time.monotonic() > deadline:
            return read, lag
        time.sleep(0.1)


def kill(proxy: ProxyProcess) -> None:
    assert proxy.proc is not None
    os.kill(proxy.proc.pid, signal.SIGKILL)
    proxy.proc.wait(10)


def high_watermark(cluster: Cluster, topic: str) -> int:
    # In sidecar layout the leader is advertised at its sidecar, which may be the one killed: ask the broker.
    _, host, port = raw.leader_of(cluster.live_bootstrap(), topic, 0)
    with raw.RawClient(*cluster.real_address(host, port)) as c:
        return c.list_offsets(topic, 0, read_committed=False)


class _Gateway:
    """One gateway process; the victim is the gateway."""

    def __init__(self, cluster: Cluster, tmp: Path, u: str) -> None:
        self.cluster, self.tmp, self.u = cluster, tmp, u
        self.port, self.admin, self.brokers = free_port(), free_port(), listener_ports(cluster)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.victim = "the gateway"
        self.after = tmp / f"after-{u}.jsonl"
        self.procs: list[ProxyProcess] = []

    def start(self) -> None:
        self.procs.append(gateway(self.cluster, self.port, self.admin, self.tmp / f"before-{self.u}.jsonl",
                                  self.tmp / f"before-{self.u}.log", self.brokers))

    def kill(self) -> None:
        kill(self.procs[0])

    def restart(self) -> None:
        self.procs.append(gateway(self.cluster, self.port, self.admin, self.after,
                                  self.tmp / f"after-{self.u}.log", self.brokers))

    def records_after(self, _killed_ms: int) -> list[dict[str, Any]]:
        return _records(self.after)

    def follower_after(self) -> tuple[float, float]:
        return follower_figures(self.admin)

    @property
    def all_procs(self) -> list[ProxyProcess]:
        return self.procs


class _Sidecars:
    """A sidecar process per broker; the victim is the one in front of `coordinator`."""

    def __init__(self, cluster: Cluster, tmp: Path, u: str, coordinator: int) -> None:
        self.cluster, self.tmp, self.u, self.coordinator = cluster, tmp, u, coordinator
        self.admin = {n.id: free_port() for n in cluster.nodes}
        self.bootstrap = cluster.sidecar_bootstrap
        self.victim = f"sidecar {coordinator}"
        self.procs: dict[int, ProxyProcess] = {}
        self.audits: list[Path] = []

    def _start(self, node: Node, incarnation: int) -> None:
        audit = self.tmp / f"sidecar-{node.id}-{incarnation}-{self.u}.jsonl"
        self.audits.append(audit)
        self.procs[node.id] = sidecar(node, self.admin[node.id], audit, audit.with_suffix(".log"))

    def start(self) -> None:
        for n in self.cluster.nodes:
            self._start(n, 0)

    def kill(self) -> None:
        kill(self.procs[self.coordinator])

    def restart(self) -> None:
        self._start(self.cluster.node(self.coordinator), 1)

    def records_after(self, killed_ms: int) -> list[dict[str, Any]]:
        # The restarted sidecar's records, and the others' from the kill on (their questions to the
        # coordinator went through the killed sidecar).
        return [r for a in self.audits for r in _records(a) if r["time_ms"] >= killed_ms]

    def follower_after(self) -> tuple[float, float]:
        return follower_figures(self.admin[self.coordinator])

    @property
    def all_procs(self) -> list[ProxyProcess]:
        return list(self.procs.values())


class _Relays:
    """The control: a plain TCP relay per broker on its sidecar port, no txnguard; all of them are the victim."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.sidecar_bootstrap
        self.victim = "all three relays (no proxy)"
        self.relays: list[FaultRelay] = []

    def start(self) -> None:
        self.relays = [FaultRelay((n.host, n.port), host=n.host, port=n.sidecar_port or 0).start()
                       for n in self.cluster.nodes]

    def kill(self) -> None:
        for r in self.relays:
            r.stop()  # aborts every connection (RST) and closes the listener: connection refused until restart

    def restart(self) -> None:
        self.start()

    def records_after(self, _killed_ms: int) -> list[dict[str, Any]]:
        return []

    def follower_after(self) -> tuple[float, float]:
        return -1.0, -1.0

    @property
    def all_procs(self) -> list[ProxyProcess]:
        return []

    def stop(self) -> None:
        for r in self.relays:
            r.stop()


def _records(audit: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []


def justified(refusal: dict[str, Any]) -> bool:
    """A write refused during recovery is justified when it says why and the client retries it (the
    coordinator did not answer), or when an answer from Kafka refused it, not a dead process's memory."""
    return bool(refusal.get("reason")) and (refusal["outcome"] == RETRIABLE or refusal["evidence"] in KAFKA_EVIDENCE)


def _confluent_copy(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The child's side of ConfluentChild: run the loop, send back its result or its error."""
    try:
        conn.send(("ok", clients.confluent_exactly_once_copy(*args, **kwargs)))
    except Exception as e:  # noqa: BLE001 - the parent reports it
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        os._exit(0)  # a librdkafka thread still blocked would block a normal exit


class ConfluentChild:
    """clients.confluent_exactly_once_copy in a child process, so that a loop blocked in librdkafka
    (send_offsets_to_transaction past its timeout after a re-bootstrap: librdkafka #5511/#5456's
    decommissioned broker thread, see docs/testing/faults-and-bounces.md) is reported as hung and killed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_confluent_copy, args=(child, args, kwargs), daemon=True)
        self._proc.start()
        child.close()
        self._answer: tuple[str, Any] | None = None

    def _receive(self, timeout: float) -> None:
        try:
            if self._answer is None and self._conn.poll(timeout):
                self._answer = self._conn.recv()
        except (EOFError, OSError):  # the child died without an answer
            self._answer = ("error", f"the child exited with {self._proc.exitcode} and no result")

    def done(self) -> bool:
        self._receive(0)
        return self._answer is not None or not self._proc.is_alive()

    def result(self, timeout: float) -> Any:
        self._receive(timeout)
        self._proc.kill()
        self._proc.join(10)
        if self._answer is None:
            return f"HUNG: no result within {timeout:.0f} s (killed)"
        kind, value = self._answer
        return value if kind == "ok" else f"ERROR: {value}"


@dataclass
class BounceResult:
    copier: str
    mode: str
    victim: str
    passed: bool
    seconds: float
    killed_at: int                    # output log end when the process was killed
    copied_exactly_once: bool
    lost: int
    duplicated: int
    hanging: int
    decisions_after: int
    refused_after: int
    unjustified: int
    evidence_after: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)  # "outcome/evidence: reason" -> count
    # The restarted proxy's follower of __transaction_state (-1: no proxy): records it read (it read the log again,
    # from its start), and how far behind the log's end it was once the copy ended.
    log_records_after: float = -1.0
    log_lag_after: float = -1.0
    detail: str = ""

    def row(self) -> str:
        reasons = "; ".join(f"{n} x {r}" for r, n in sorted(self.refusals.items())) or "none"
        return (f"| {self.copier} | {self.mode} | {self.victim} | {'pass' if self.passed else 'FAIL'} | "
                f"{self.killed_at} | {self.lost} | {self.duplicated} | {self.hanging} | {self.decisions_after} | "
                f"{self.refused_after} ({self.unjustified} unjustified) | {reasons} | "
                f"{', '.join(self.evidence_after)} | {self.seconds:.0f} s | {self.detail} |")


HEADER = ("| copier | mode | killed | result | output at the kill | lost | duplicated | hanging | decisions after | "
          "refused after | refusals (outcome/evidence: reason) | evidence after | run | detail |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _txn_id_coordinated_away_from(cluster: Cluster, leader: int, prefix: str) -> str:
    for i in range(200):
        if cluster.transaction_coordinator(f"{prefix}-{i}") != leader:
            return f"{prefix}-{i}"
    raise AssertionError("every transactional id landed on the leader")


def count_hanging(cluster: Cluster, sink: str, group: str) -> int:
    """find-hanging rows on the output partition and on the group's __consumer_offsets partition (the two
    the copier writes in its transactions), with a 0-minute bound so that every open transaction is a
    candidate (the tool's default, 15 minutes, would see none in a run this short)."""
    offsets = offsets_partition_for(group, int(cluster.config.get("offsets.topic.num.partitions", "50")))
    return sum(len(clients.transactions_find_hanging(cluster.bootstrap_servers, topic=t, partition=p,
                                                     max_transaction_timeout_minutes=0))
               for t, p in ((sink, 0), (CONSUMER_OFFSETS, offsets)))


def read_back(cluster: Cluster, sink: str, group: str) -> tuple[list[bytes], int, str]:
    """After a copy: the output at read_committed, find-hanging's rows (count_hanging), and why the output's
    LSO did not reach its high watermark ("" when it did: no transaction left open)."""
    left_open = ""
    try:
        clients.stable_end_offsets(cluster.bootstrap_servers, sink)
    except clients.ClientError as e:  # a transaction left open: find-hanging names it
        left_open = str(e)
    out = clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, sink)
    return out, count_hanging(cluster, sink, group), left_open


def _front(mode: str, cluster: Cluster, tmp: Path, u: str, sink: str) -> tuple[str, _Gateway | _Sidecars | _Relays]:
    """The transactional id and what stands between the copier and Kafka."""
    txn_id = f"tid-{u}"
    if mode == "sidecar":
        leader = cluster.leader(sink, 0)
        txn_id = _txn_id_coordinated_away_from(cluster, leader, txn_id)
        sidecars = _Sidecars(cluster, tmp, u, cluster.transaction_coordinator(txn_id))
        sidecars.victim += f" (coordinator of the txn id; output leader {leader})"
        return txn_id, sidecars
    if mode == "relay":
        return txn_id, _Relays(cluster)
    return txn_id, _Gateway(cluster, tmp, u)


def run_bounce(cluster: Cluster, copier: str, tmp: Path, *, mode: str = "gateway", records: int = 6000,
               kill_at: int = 1500, pause_s: float = 1.0, timeout_s: float = 240.0,
               rdkafka_config: dict[str, str] | None = None) -> BounceResult:
    """`mode` "sidecar" and "relay" need a cluster in sidecar layout (kafka.up(..., sidecars=True)).

    In sidecar mode the sidecar killed is the one in front of the copier's transaction coordinator, and
    the transactional id is chosen so that this coordinator does not lead the output partition: the
    output's leader keeps its sidecar, which must verify the first write of every transaction with the
    coordinator, whose only address (the advertised sidecar) is gone until the restart.
    `rdkafka_config` adds to the confluent-kafka producer's settings ({"debug": "eos,protocol,broker"}: its
    log on stderr; {"metadata.recovery.strategy": "none"}: no re-bootstrap, the documented workaround:
    docs/testing/faults-and-bounces.md)."""
    u = uuid.uuid4().hex[:8]
    group = f"group-{u}"
    source = fresh_topic(cluster, f"bounce-in-{u}", replication_factor=3)
    sink = fresh_topic(cluster, f"bounce-out-{u}", replication_factor=3)
    txn_id, front = _front(mode, cluster, tmp, u, sink)
    values = [f"bounce-{i:05d}-{'x' * 200}".encode() for i in range(records)]
    started = time.monotonic()
    job: Any = None
    try:
        front.start()  # in sidecar layout even a direct client follows the advertised sidecars
        clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source, values, partition=0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            if copier.startswith("java-"):
                job = pool.submit(clients.java_transactional_copier, front.bootstrap, source, sink, txn_id, group,
                                  max_messages=records, java_version=copier[5:], transaction_size=500,
                                  timeout_s=timeout_s)
            else:
                job = ConfluentChild(front.bootstrap, source, sink, txn_id, group, records, commit_every=500,
                                     timeout_s=timeout_s, producer_config=rdkafka_config)
            deadline = time.monotonic() + 120
            while high_watermark(cluster, sink) < kill_at and not job.done():
                if time.monotonic() > deadline:
                    raise AssertionError("the copier made no progress")
                time.sleep(0.05)
            if job.done():
                raise AssertionError(f"the copier finished before the kill: {job.result(0)}")
            front.kill()
            killed_ms = int(time.time() * 1000)
            killed_at = high_watermark(cluster, sink)
            time.sleep(pause_s)
            front.restart()
            try:
                outcome = job.result(timeout_s + 30)
            except (clients.ClientError, concurrent.futures.TimeoutError) as e:  # a failed run, reported as one
                outcome = f"ERROR: {e}".splitlines()[0]
        seconds = time.monotonic() - started
        finished = (getattr(outcome, "shutdown_complete", True) and getattr(outcome, "remaining", 0) == 0
                    and getattr(outcome, "total_processed", getattr(outcome, "copied", None)) == records)
        out, hanging, left_open = read_back(cluster, sink, group)
        if left_open:
            outcome = f"{outcome}; {left_open}"
        after = front.records_after(killed_ms)
        log_read, log_lag = front.follower_after()
    finally:
        if isinstance(job, ConfluentChild) and not job.done():
            job.result(0)
        for p in front.all_procs:
            if p.proc is not None and p.proc.poll() is None:
                p.terminate()
        if isinstance(front, _Relays):
            front.stop()
    expected = values if copier.startswith("java-") else [clients.copy_of(v) for v in values]
    exactly_once = out == expected
    lost = len(set(expected) - set(out))
    duplicated = len(out) - len(set(out))
    decisions = [r for r in after if r.get("kind") == "decision"]
    refused = [r for r in decisions if r["outcome"] != "pass"]
    unjustified = [r for r in refused if not justified(r)]
    refusals: dict[str, int] = {}
    for r in refused:
        key = f"{r['outcome']}/{r['evidence']}: {r['reason']}"
        refusals[key] = refusals.get(key, 0) + 1
    judged = bool(decisions) or mode == "relay"  # through a proxy, the writes after the kill were judged
    return BounceResult(
        copier, mode, front.victim, bool(finished and exactly_once and hanging == 0 and judged and not unjustified),
        seconds, killed_at, exactly_once, lost, duplicated, hanging, len(decisions), len(refused), len(unjustified),
        sorted({r["evidence"] for r in decisions}), refusals, log_read, log_lag, str(outcome)[:160])

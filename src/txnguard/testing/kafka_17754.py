"""J3 (KAFKA-17754) with real clients through the proxy, the fault relay between the proxy and the broker.

    client ──▶ txnguard (gateway) ──▶ FaultRelay ──▶ broker          (the relay holds T1's EndTxn)

The clients: the Java client (3.5.2 by default) in a small driver of ours (java/J3Client.java,
compiled here against that version's kafka-clients), and confluent-kafka (librdkafka) in a thread.
Both follow the same steps, each on a signal from the scenario:

    T1: send t1 -> p0; commit            the relay holds this EndTxn(COMMIT) past the request timeout:
                                         the client gives up on that connection and retries (T1 commits)
    T2: send t2-a -> p0, t2-b -> p1      both partitions are in T2 (AddPartitionsToTxn)
        ... then the held EndTxn is released (run_once: when): it lands in whatever transaction is open
        send t2-c -> p0; commit (or abort on an error)

Oracle (Jepsen's): T1 and T2 are each all-or-nothing at read_committed in the way the client was told
(committed: every acknowledged value visible; aborted: none), and no partition's last stable offset
hangs behind a write no transaction will end. Direct routing of a real client through the relay needs
the broker's addresses rewritten (Kafka's metadata sends the client around a relay), so the control is
the same proxy with the defence off (`end_txn_in_doubt_hold: false`): an address-rewriting pipe with
KIP-890 part 1 verification still on. The raw-actor control straight to Kafka is
tests/integration/test_kafka_17754.py.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import java_programs, raw
from txnguard.testing.faults import Action, Direction, Fault, FaultRelay
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread

END_TXN, ADD_PARTITIONS = ApiKey.END_TXN, ApiKey.ADD_PARTITIONS_TO_TXN
T2_VALUES = (b"t2-a", b"t2-b", b"t2-c")


# -- the Java client ------------------------------------------------------------------------------------------


class JavaDriver:
    def __init__(self, bootstrap: str, topic: str, transactional_id: str, version: str = "3.5.2",
                 request_timeout_ms: int = 2000) -> None:
        self.name = f"java-{version}"
        self.args = (bootstrap, topic, transactional_id, str(request_timeout_ms))
        self.version = version
        self.lines: queue.Queue[dict[str, str]] = queue.Queue()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: list[str] = []
        self.seen: dict[str, str] = {}

    def start(self) -> None:
        self.proc = subprocess.Popen(
            java_programs.command("J3Client", self.version, *self.args, heap="128m"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.put(json.loads(line))

    def _read_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace").rstrip())
            del self.stderr[:-40]

    def expect(self, step: str, timeout_s: float) -> str:
        return _expect(self.lines, step, timeout_s, self)

    def signal(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)

    def describe(self) -> str:
        return "\n".join(self.stderr[-15:])


# -- confluent-kafka (librdkafka) ---------------------------------------------------------------------------------


class ConfluentDriver:
    """The same steps with confluent-kafka's Producer, in a thread (socket.timeout.ms is its request timeout)."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str, request_timeout_ms: int = 2000) -> None:
        self.name = "confluent-kafka"
        self.bootstrap, self.topic, self.transactional_id = bootstrap, topic, transactional_id
        self.request_timeout_ms = request_timeout_ms
        self.lines: queue.Queue[dict[str, str]] = queue.Queue()
        self.signals: queue.Queue[None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: str | None = None
        self.seen: dict[str, str] = {}
        self.retriable: list[str] = []  # retriable errors commit_transaction() raised (then called again)

    def start(self) -> None:
        self.thread.start()

    def _say(self, step: str, result: str) -> None:
        self.lines.put({"step": step, "result": result})

    def _wait(self) -> None:
        self.signals.get(timeout=120)

    def _run(self) -> None:
        try:
            self._steps()
        except Exception as e:  # noqa: BLE001 - reported through expect()
            self.error = repr(e)
            self._say("failed", repr(e))

    def _steps(self) -> None:
        from confluent_kafka import KafkaException, Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
                      "socket.timeout.ms": self.request_timeout_ms, "linger.ms": 0, "message.timeout.ms": 60000,
                      "transaction.timeout.ms": 60000})
        results: dict[bytes, str] = {}

        def delivered(err: Any, msg: Any) -> None:
            results[bytes(msg.value())] = "ok" if err is None else f"error: {err}"

        def send(partition: int, value: bytes) -> str:
            p.produce(self.topic, value, partition=partition, on_delivery=delivered)
            p.flush(60)
            return results.get(value, "error: not delivered")

        def commit() -> str:
            deadline = time.monotonic() + 60
            while True:
                try:
                    p.commit_transaction(30)
                    return "committed"
                except KafkaException as e:
                    err = e.args[0]
                    if err.retriable() and time.monotonic() < deadline:
                        self.retriable.append(str(err))
                        continue  # the call resumes the commit already under way
                    if err.txn_requires_abort():
                        return f"abortable: {err}"
                    return f"error: {err}"

        p.init_transactions(30)
        p.begin_transaction()
        self._say("t1_sent", send(0, b"t1"))
        self._wait()
        t1 = commit()
        self._say("t1_end", t1)
        if t1 != "committed":
            return
        p.begin_transaction()
        p.produce(self.topic, b"t2-a", partition=0, on_delivery=delivered)
        p.produce(self.topic, b"t2-b", partition=1, on_delivery=delivered)
        self._say("t2_begun", "ok")
        p.flush(60)
        written = "ok" if results.get(b"t2-a") == "ok" and results.get(b"t2-b") == "ok" else \
            f"error: {results.get(b't2-a')}, {results.get(b't2-b')}"
        self._say("t2_open", written)
        self._wait()
        c = send(0, b"t2-c") if written == "ok" else "skipped"
        self._say("t2_c", c)
        if written == "ok" and c == "ok":
            t2 = commit()
            if t2 == "committed":
                self._say("t2_end", "committed")
                return
            self._say("t2_commit_error", t2)
        try:
            p.abort_transaction(30)
            self._say("t2_end", "aborted")
        except KafkaException as e:
            self._say("t2_end", f"unknown: abort failed: {e}")

    def expect(self, step: str, timeout_s: float) -> str:
        return _expect(self.lines, step, timeout_s, self)

    def signal(self) -> None:
        self.signals.put(None)

    def stop(self) -> None:
        self.thread.join(0)  # daemon: a run that hung is abandoned with its (bounded) waits

    def describe(self) -> str:
        return self.error or ""


def _expect(lines: queue.Queue[dict[str, str]], step: str, timeout_s: float, driver: Any) -> str:
    """The result of `step`; every line read on the way is kept in `driver.seen`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{driver.name}: no '{step}' within {timeout_s}s\n{driver.describe()}")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        driver.seen[line.get("step", "")] = line.get("result", "")
        if line.get("step") == step:
            return line.get("result", "")
        if line.get("step") == "failed":
            raise RuntimeError(f"{driver.name} failed: {line.get('result')}")
        if line.get("step") in ("t1_end", "t2_end") and step != line.get("step"):
            # An ending earlier than expected (T1 not committed): the scenario stops here.
            raise RuntimeError(f"{driver.name}: {line['step']} = {line.get('result')} before {step}")


# -- one run ------------------------------------------------------------------------------------------------------


@dataclass
class J3ClientRun:
    client: str
    mode: str                            # MODES
    steps: dict[str, str] = field(default_factory=dict)
    t1_end_txns_seen: int = 0            # EndTxn requests through the relay during T1's commit
    state_at_release: str = ""           # the coordinator's state when the held EndTxn was released
    held_answered: bool = False          # the held EndTxn reached the broker and took effect or was answered
    visible: dict[int, list[bytes]] = field(default_factory=dict)
    last_stable: dict[int, int] = field(default_factory=dict)
    log_end: dict[int, int] = field(default_factory=dict)
    holds: float = 0.0                   # requests the proxy held for an EndTxn in doubt
    hold_timeouts: float = 0.0
    anomalies: list[str] = field(default_factory=list)
    seconds: float = 0.0


def oracle(run: J3ClientRun) -> list[str]:
    """Jepsen's J3 oracle over what the client was told and what read_committed shows."""
    seen = set(run.visible.get(0, []) + run.visible.get(1, []))
    out: list[str] = []
    if run.steps.get("t1_end") == "committed" and b"t1" not in seen:
        out.append("lost write: t1 (T1 acknowledged committed)")
    t2 = run.steps.get("t2_end", "")
    acked = [v for v, step in ((b"t2-a", "t2_open"), (b"t2-b", "t2_open"), (b"t2-c", "t2_c"))
             if run.steps.get(step) == "ok"]
    attempted = ["t2-a", "t2-b"] + (["t2-c"] if run.steps.get("t2_c", "skipped") != "skipped" else [])
    t2_seen = sorted(v.decode() for v in T2_VALUES if v in seen)
    if t2 == "committed":
        missing = [v.decode() for v in acked if v not in seen]
        if missing:
            out.append(f"lost write: {missing} of T2 (acknowledged committed), visible {t2_seen}")
    elif t2 == "aborted":
        if t2_seen:
            out.append(f"aborted read: {t2_seen} of T2 (aborted) visible")
    elif t2_seen and t2_seen != attempted:
        # Neither committed nor aborted as far as the client knows (its abort failed): T2 may have
        # committed, but only whole: part of it visible while another of its writes was refused is torn.
        out.append(f"torn transaction: T2 ({t2[:60]}) shows {t2_seen} of {attempted}")
    for p in (0, 1):
        if run.last_stable.get(p, 0) < run.log_end.get(p, 0):
            out.append(f"hanging: p{p} last stable offset {run.last_stable[p]} < log end {run.log_end[p]}")
    return out


def read_committed(bootstrap: str, topic: str, partition: int) -> tuple[list[bytes], int, int]:
    """What a read_committed consumer can see now, without waiting on a last stable offset that may hang."""
    from confluent_kafka import Consumer, TopicPartition

    with raw.RawClient.connect(bootstrap) as c:
        stable = c.list_offsets(topic, partition, read_committed=True)
        end = c.list_offsets(topic, partition, read_committed=False)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"j3c-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + 10
        while stable and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(bytes(msg.value() or b""))
            # Control records (markers) are never returned: the position says when all is read.
            if consumer.position([TopicPartition(topic, partition)])[0].offset >= stable:
                break
    finally:
        consumer.close()
    return values, stable, end


# How the proxy runs: the defence on (the default), off (KIP-890 part 1 verification alone), or bare (verification
# off too: an address-rewriting pipe, the nearest a real client gets to "direct" through the relay).
MODES: dict[str, dict[str, Any]] = {
    "on": {},
    "off": {"end_txn_in_doubt_hold": False},
    "bare": {"end_txn_in_doubt_hold": False, "enabled": False},
}


@contextlib.contextmanager
def proxied(cluster: Cluster, relay: FaultRelay, *, mode: str) -> Iterator[ProxyThread]:
    """A gateway whose every broker connection goes through `relay` (the verifier's own questions do not)."""
    node = cluster.nodes[0]
    proxy = ProxyThread.from_settings(
        record_wire=False, upstream=relay.address, mode="gateway", log_level="warning", verification=MODES[mode])
    proxy.start()
    assert proxy.proxy is not None
    host = proxy.proxy
    connect = host.connect_upstream

    async def through_relay(target: Any, factory: Any) -> Any:
        if (target.host, target.port) == (node.host, node.port):
            target = type(target)(relay.host, relay.port)
        return await connect(target, factory)

    host.connect_upstream = through_relay  # type: ignore[method-assign]
    try:
        yield proxy
    finally:
        proxy.stop()


def run_once(cluster: Cluster, client: str, *, mode: str = "on", release_after_s: float | None = None,
             request_timeout_ms: int = 2000) -> J3ClientRun:
    """One J3 run of `client` ("java" or "confluent-kafka") through the proxy in `mode` (MODES).

    When the held EndTxn is released: `release_after_s` seconds after the client began T2 (bench/kafka_17754.py's
    timing), or by default once the run has reached the point the scenario is about, whatever the timing:
    with the defence on, once the proxy holds T2's first request (T2 can go no further while T1's EndTxn is
    unanswered); with it off, once the client was told both T2 writes were acknowledged (T2 open at the
    coordinator with both partitions: the late commit must land in it)."""
    started = time.monotonic()
    u = uuid.uuid4().hex[:8]
    topic = fresh_topic(cluster, f"j3c-{u}", partitions=2)
    run = J3ClientRun(client, mode)
    node = cluster.nodes[0]
    with FaultRelay((node.host, node.port)) as relay, proxied(cluster, relay, mode=mode) as proxy:
        tid = f"j3c-tid-{u}"
        driver: JavaDriver | ConfluentDriver
        if client == "java":
            driver = JavaDriver(proxy.bootstrap, topic, tid, request_timeout_ms=request_timeout_ms)
        else:
            driver = ConfluentDriver(proxy.bootstrap, topic, tid, request_timeout_ms=request_timeout_ms)
        driver.start()
        try:
            run.steps["t1_sent"] = driver.expect("t1_sent", 60)
            held = relay.add(Fault(Action.HOLD, api_key=END_TXN, match=_is_commit))
            driver.signal()
            run.steps["t1_end"] = driver.expect("t1_end", 90)
            run.t1_end_txns_seen = sum(1 for d, k, _, _ in relay.seen.frames
                                       if d is Direction.REQUEST and k == END_TXN)
            run.steps["t2_begun"] = driver.expect("t2_begun", 30)
            if release_after_s is not None:
                time.sleep(release_after_s)
            elif mode == "on":
                _wait_for_a_hold(proxy)                    # T2's AddPartitionsToTxn waits for T1's EndTxn
            else:
                run.steps["t2_open"] = driver.expect("t2_open", 60)   # T2 open, both writes acknowledged
            run.state_at_release = _state(cluster, tid)
            relay.release(held)                            # the late commit arrives
            run.held_answered = _landed(cluster, tid, relay, run)
            time.sleep(0.3)  # its markers written
            if "t2_open" not in run.steps:
                run.steps["t2_open"] = driver.expect("t2_open", 60)
            driver.signal()
            run.steps["t2_c"] = driver.expect("t2_c", 60)
            run.steps["t2_end"] = driver.expect("t2_end", 90)
        finally:
            driver.stop()
            run.steps.update({k: v for k, v in driver.seen.items() if k not in run.steps})
            if isinstance(driver, ConfluentDriver) and driver.retriable:
                run.steps["commit_retriable_errors"] = "; ".join(driver.retriable)
            run.holds = sum(proxy.metric("txnguard_end_txn_hold_endings_total", {"ending": e})
                            for e in ("settled", "timeout"))
            run.hold_timeouts = proxy.metric("txnguard_end_txn_hold_endings_total", {"ending": "timeout"})
    bootstrap = cluster.bootstrap_servers
    for p in (0, 1):
        run.visible[p], run.last_stable[p], run.log_end[p] = read_committed(bootstrap, topic, p)
    run.anomalies = oracle(run)
    run.seconds = time.monotonic() - started
    return run


def _wait_for_a_hold(proxy: ProxyThread, timeout_s: float = 30.0) -> None:
    """Until the defence has held a request of T2 (held now, or a hold already ended at its bound)."""
    proxy.wait_for(lambda: proxy.metric("txnguard_end_txn_holds", {}) + sum(
        proxy.metric("txnguard_end_txn_hold_endings_total", {"ending": e}) for e in ("settled", "timeout")) >= 1,
        timeout_s, "a request of T2 held for T1's EndTxn")


def _state(cluster: Cluster, txn_id: str) -> str:
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:
        (s,) = c.describe_transactions(txn_id).transaction_states
    return str(s.transaction_state)


def _landed(cluster: Cluster, txn_id: str, relay: FaultRelay, run: J3ClientRun, timeout_s: float = 20.0) -> bool:
    """Wait until the released EndTxn did what it could: with T2 open at the coordinator, until it ended T2
    (its markers written); else until the broker answered it (the proxy's kept connection reads that)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.state_at_release == "Ongoing":
            if _state(cluster, txn_id) not in ("Ongoing", "PrepareCommit"):
                return True
        elif relay.seen.count(END_TXN, Direction.RESPONSE) >= run.t1_end_txns_seen:
            return True
        time.sleep(0.05)
    return False


def _is_commit(frame: bytes) -> bool:
    """EndTxn v0-3 ends with the committed flag (v3: then an empty tag buffer)."""
    version = int.from_bytes(frame[6:8], "big")
    return frame[-2] == 1 if version >= 3 else frame[-1] == 1

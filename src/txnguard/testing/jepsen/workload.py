"""The J1-lite clients: transactional writers and read_committed readers (confluent-kafka) that record a history.

Jepsen's queue workload, smaller: a writer runs transactions of 1 to 4 micro-ops, each a send of a value
unique in the run to a random partition, or a poll of its own read_committed consumer; about half the
transactions sleep between micro-ops (Jepsen's --intra-txn-delay) and 1 in 32 aborts on purpose.
Readers poll all partitions at read_committed and record every (partition, offset, value).

librdkafka speaks no KIP-890 part 2 (and Kafka 3.5.2 has neither part): a producer keeps its epoch from
one transaction to the next, the "old client" KAFKA-17754 is about. Error handling is the one
librdkafka documents, which is also Jepsen's classification:

    commit ok                                            ok
    abort ok (on purpose, or after an abortable error)   fail    (definitely not committed)
    commit raised retriable (a timeout)                  retry the commit, at most `commit_retries` times
    anything else (fatal, retries used up, abort failed) info    (may or may not have committed): the
                                                                 producer is replaced (same transactional id)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txnguard.testing.jepsen.history import History
from txnguard.testing.kafka import Cluster


@dataclass
class WorkloadConfig:
    writers: int = 3
    readers: int = 2
    partitions: int = 4
    max_txn_length: int = 4
    abort_p: float = 1 / 32
    poll_p: float = 0.25                 # a micro-op is a poll with this probability, else a send
    intra_txn_delay_s: float = 0.5       # at most, on about half of the transactions (J1: 0-500 ms)
    transaction_timeout_ms: int = 10_000
    socket_timeout_ms: int = 3_000       # < a held EndTxn: the client gives up on it and retries (J3)
    commit_timeout_s: float = 8.0
    commit_retries: int = 3


def producer_config(bootstrap: str, transactional_id: str, cfg: WorkloadConfig) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
            "transaction.timeout.ms": cfg.transaction_timeout_ms, "socket.timeout.ms": cfg.socket_timeout_ms,
            "message.timeout.ms": cfg.transaction_timeout_ms - 1000, "request.timeout.ms": 5000,
            "reconnect.backoff.max.ms": 1000, "log_level": 0}


def consumer_config(bootstrap: str, group: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "socket.timeout.ms": 5000, "reconnect.backoff.max.ms": 1000, "log_level": 0}


class _Process(threading.Thread):
    def __init__(self, name: str, history: History, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.process, self.history, self.stopping = name, history, stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as e:  # noqa: BLE001 - reported by the run, never swallowed
            self.error = e

    def loop(self) -> None:
        raise NotImplementedError


def _assign_all(consumer: Any, topic: str, partitions: int) -> None:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])


def _records(msgs: list[Any]) -> list[list[Any]]:
    return [[int(m.partition()), int(m.offset()), (m.value() or b"").decode()] for m in msgs if m.error() is None]


class Writer(_Process):
    def __init__(self, name: str, history: History, stop: threading.Event, bootstrap: str, topic: str,
                 transactional_id: str, cfg: WorkloadConfig, seed: int) -> None:
        super().__init__(name, history, stop)
        self.bootstrap, self.topic, self.transactional_id, self.cfg = bootstrap, topic, transactional_id, cfg
        self.rng = random.Random(seed)
        self.seq = 0
        self.producer: Any = None
        self.consumer: Any = None

    def _new_producer(self) -> None:
        from confluent_kafka import KafkaException, Producer

        self.producer = None
        while not self.stopping.is_set():
            producer = Producer(producer_config(self.bootstrap, self.transactional_id, self.cfg))
            try:
                producer.init_transactions(15)
                self.producer = producer
                return
            except KafkaException:
                time.sleep(0.5)  # the coordinator is down or paused: try again with a fresh producer

    def _ensure_consumer(self) -> None:
        from confluent_kafka import Consumer

        if self.consumer is None:
            self.consumer = Consumer(consumer_config(self.bootstrap, f"{self.transactional_id}-reader"))
            _assign_all(self.consumer, self.topic, self.cfg.partitions)
            self.history.record(self.process, "ok", "assign", None)

    def loop(self) -> None:
        self._ensure_consumer()
        self._new_producer()
        try:
            while not self.stopping.is_set() and self.producer is not None:
                self.transaction()
        finally:
            if self.consumer is not None:
                self.consumer.close()

    def transaction(self) -> None:
        """One transaction, recorded: invoke, then ok, fail or info (see the module's table)."""
        from confluent_kafka import KafkaException

        txn = _Txn(self, self._plan())
        delay = self.rng.uniform(0, self.cfg.intra_txn_delay_s) if self.rng.random() < 0.5 else 0.0
        abort = self.rng.random() < self.cfg.abort_p
        self.history.record(self.process, "invoke", "txn", [list(m) for m in txn.micro])
        p = self.producer
        try:
            p.begin_transaction()
            for m in txn.micro:
                if m[0] == "send":
                    p.produce(self.topic, value=m[2].encode(), partition=m[1], on_delivery=txn.delivered(m[2]))
                else:
                    m[1] = _records(self.consumer.consume(20, 0.05))
                if delay:
                    time.sleep(delay / len(txn.micro))
            if abort:
                p.flush(self.cfg.commit_timeout_s)  # an abort purges what is unsent: make the writes real
                p.abort_transaction(self.cfg.commit_timeout_s)
                txn.done("fail")
                return
        except (KafkaException, BufferError) as e:
            self._abort_after(e, txn)
            return
        self._commit(txn)

    def _plan(self) -> list[list[Any]]:
        micro: list[list[Any]] = []
        for _ in range(self.rng.randint(1, self.cfg.max_txn_length)):
            if self.rng.random() < self.cfg.poll_p:
                micro.append(["poll", []])
            else:
                self.seq += 1
                micro.append(["send", self.rng.randrange(self.cfg.partitions), f"{self.process}-{self.seq}", None])
        return micro

    def _commit(self, txn: _Txn) -> None:
        from confluent_kafka import KafkaException

        for attempt in range(self.cfg.commit_retries):
            try:
                self.producer.commit_transaction(self.cfg.commit_timeout_s)
                txn.done("ok")
                return
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is not None and err.txn_requires_abort():
                    self._abort_after(e, txn)
                    return
                if err is None or not err.retriable() or attempt == self.cfg.commit_retries - 1:
                    txn.done("info", f"commit: {err}")
                    self._new_producer()
                    return

    def _abort_after(self, e: Exception, txn: _Txn) -> None:
        from confluent_kafka import KafkaException

        try:
            self.producer.abort_transaction(self.cfg.commit_timeout_s)
            txn.done("fail", f"aborted after: {e}")
        except KafkaException as e2:
            txn.done("info", f"abort failed: {e2} (after {e})")
            self._new_producer()


class _Txn:
    """One transaction's micro-ops and what the delivery reports said about its sends."""

    def __init__(self, writer: Writer, micro: list[list[Any]]) -> None:
        self.writer, self.micro = writer, micro
        self.offsets: dict[str, int] = {}

    def delivered(self, value: str) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                self.offsets[value] = int(msg.offset())
        return on_delivery  # a failed delivery fails the commit (abortable): no need to track it here

    def done(self, outcome: str, why: str = "") -> None:
        for m in self.micro:
            if m[0] == "send":
                m[3] = self.offsets.get(m[2])
        self.writer.history.record(self.writer.process, outcome, "txn", self.micro, **({"error": why} if why else {}))


class Reader(_Process):
    def __init__(self, name: str, history: History, stop: threading.Event, bootstrap: str, topic: str,
                 group: str, cfg: WorkloadConfig) -> None:
        super().__init__(name, history, stop)
        self.bootstrap, self.topic, self.group, self.cfg = bootstrap, topic, group, cfg

    def loop(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(consumer_config(self.bootstrap, self.group))
        _assign_all(consumer, self.topic, self.cfg.partitions)
        self.history.record(self.process, "ok", "assign", None)
        try:
            while not self.stopping.is_set():
                records = _records(consumer.consume(100, 0.5))
                if records:
                    self.history.record(self.process, "ok", "poll", records)
        finally:
            consumer.close()


def final_read(history: History, process: str, cluster: Cluster, topic: str, partitions: int,
               *, settle_s: float = 15.0, timeout_s: float = 60.0) -> None:
    """Every partition from offset 0 to its last stable offset, straight from the brokers, after waiting up to
    `settle_s` for the last stable offset to reach the log end (open transactions time out and abort)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from txnguard.testing import raw

    def offsets() -> dict[int, tuple[int, int]]:
        out = {}
        for p in range(partitions):
            out[p] = marks_of(p)
        return out

    def marks_of(p: int) -> tuple[int, int]:
        # Just after a broker's restart leadership still moves (NOT_LEADER_OR_FOLLOWER): ask again.
        deadline = time.monotonic() + 60
        while True:
            try:
                _, host, port = raw.leader_of(cluster.live_bootstrap(), topic, p)
                with raw.RawClient(*cluster.real_address(host, port)) as c:
                    return c.list_offsets(topic, p, read_committed=True), c.list_offsets(topic, p, read_committed=False)
            except (OSError, raw.RawProtocolError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    deadline = time.monotonic() + settle_s
    marks = offsets()
    while any(s < e for s, e in marks.values()) and time.monotonic() < deadline:
        time.sleep(1)
        marks = offsets()
    # librdkafka signals end-of-partition at the last stable offset when read_committed.
    consumer = Consumer({**consumer_config(cluster.sidecar_bootstrap, f"{process}-{time.time_ns()}"),
                         "enable.partition.eof": True})
    got: dict[int, list[list[Any]]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        until = time.monotonic() + timeout_s
        pending = set(range(partitions))
        while pending and time.monotonic() < until:
            for m in consumer.consume(500, 0.5):
                err, p = m.error(), int(m.partition() or 0)
                if err is None:
                    got[p].append([int(m.offset() or 0), (m.value() or b"").decode()])
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(p)
    finally:
        consumer.close()
    history.record(process, "ok", "final-read", {"partitions": [
        {"partition": p, "records": got[p], "stable": marks[p][0], "end": marks[p][1]} for p in range(partitions)]})

"""Drive REAL Kafka clients through one small, uniform interface.

Every adapter takes a `bootstrap_servers` string and nothing else about the
cluster, so the same calls can later be pointed at the proxy instead of the
brokers. Three families:

* Python libraries, in process: kafka-python, confluent-kafka (librdkafka) and
  aiokafka, each as a `TransactionalClient`; confluent-kafka and kafka-python
  also as a `CommittedConsumer`.
* kcat, a librdkafka command-line tool: plain produce, metadata and a
  read_committed consumer. It cannot run transactions.
* The Java client, through the tools shipped in Kafka's own `kafka-tools` jar
  (TransactionalMessageCopier, VerifiableProducer, ProducerPerformance,
  TransactionsCommand), one JVM per call, with the client version chosen by
  which `kafka-tools` jar folder goes on the classpath.

Every subprocess runs with a timeout, is killed (its whole process group) when
the timeout passes, and a failure raises `ClientError` carrying the tail of
the tool's output.

For the suite every client runs through the proxy, each Python family is also a
`PythonClient` (`PYTHON_CLIENTS`): plain produce, a consume-transform-produce
copier with the offsets sent to the transaction, committed-offset lookups, a
consumer group member in its own thread (`GroupMember`), and admin create /
describe calls. confluent-kafka adds a `BackgroundProducer` for failover tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from txnguard.testing import jars, raw

DEFAULT_TIMEOUT_S = 60.0
TOOL_HEAP = "256m"
KCAT = os.environ.get("TXNGUARD_KCAT", "kcat")

T = TypeVar("T")


class ClientError(RuntimeError):
    """A client or tool failed or timed out; the message carries the tail of its output."""


# -- subprocesses -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _describe(args: Sequence[str], stdout: str, stderr: str) -> str:
    # The classpath alone is thousands of characters; show the class and its arguments.
    shown = list(args)
    if "-cp" in shown:
        i = shown.index("-cp")
        shown[i + 1] = "<classpath>"
    return (f"command: {' '.join(shown)}\n--- stdout (tail) ---\n{_tail(stdout)}\n"
            f"--- stderr (tail) ---\n{_tail(stderr)}")


def run_tool(
    args: Sequence[str], *, timeout_s: float, input_bytes: bytes | None = None, check: bool = True
) -> ToolRun:
    """Run a command to completion; kill its process group and raise if it outlives `timeout_s`."""
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own session, so a timeout kills it and anything it started, and nothing else.
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input_bytes, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise ClientError(
            f"timed out after {timeout_s:.0f}s and was killed\n"
            + _describe(args, out.decode(errors="replace"), err.decode(errors="replace"))
        ) from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    run = ToolRun(list(args), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and run.returncode != 0:
        raise ClientError(f"exited with {run.returncode}\n" + _describe(args, run.stdout, run.stderr))
    return run


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking call in a daemon thread and give up after `timeout_s`.

    kafka-python's commit/abort wait without a timeout; a test must fail, not hang.
    The abandoned thread is a daemon, so it cannot keep the interpreter alive.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(e)

    worker = threading.Thread(target=target, name=f"bounded-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ClientError(f"{what} did not finish within {timeout_s:.0f}s")
    if error:
        raise error[0]
    return result[0]


def _group_id() -> str:
    return f"txnguard-{uuid.uuid4().hex[:12]}"


def _partitions_of(bootstrap_servers: str, topic: str, partitions: Sequence[int] | None) -> list[int]:
    if partitions is not None:
        return list(partitions)
    return list(range(raw.partition_count(bootstrap_servers, topic)))


def stable_end_offsets(
    bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None, *, timeout_s: float = 30.0,
) -> dict[int, int]:
    """Wait until no transaction is open on any partition (LSO == high watermark); return the watermarks.

    A producer's commit returns once the coordinator has logged its decision, before
    the markers reach the partitions. A read_committed consumer started right then
    stops at the old LSO and misses the last transaction, so wait for this first.
    Asks each partition's leader, as ListOffsets must.
    """
    deadline = time.monotonic() + timeout_s
    result: dict[int, int] = {}
    for p in _partitions_of(bootstrap_servers, topic, partitions):
        _, host, port = raw.leader_of(bootstrap_servers, topic, p)
        with raw.RawClient(host, port) as c:
            while True:
                lso = c.list_offsets(topic, p, read_committed=True)
                hw = c.list_offsets(topic, p, read_committed=False)
                if lso == hw:
                    result[p] = hw
                    break
                if time.monotonic() > deadline:
                    raise ClientError(f"{topic}-{p}: last stable offset {lso} still below high watermark {hw} "
                                      f"after {timeout_s:.0f}s (an open or hanging transaction)")
                time.sleep(0.05)
    return result


# -- the uniform interfaces ----------------------------------------------------------------------


class TransactionalClient(Protocol):
    name: str

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """init, begin, send every value (and wait for its ack), commit or abort, close."""
        ...


class CommittedConsumer(Protocol):
    name: str

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        """Values from the beginning up to the last stable offset, with isolation.level=read_committed.

        Returns partition by partition, in offset order within each. Raises ClientError
        if the end is not reached within `timeout_s`.
        """
        ...


class PlainProducer(Protocol):
    name: str

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Plain (non-transactional) produce with acks=all; raises unless every value was acknowledged."""
        ...


def copy_of(value: bytes) -> bytes:
    """What a consume-transform-produce copier writes for each value it reads."""
    return b"copy-of-" + value


@dataclass(frozen=True)
class CopiedTransaction:
    committed: bool
    records: dict[int, int]  # output partition -> records this transaction wrote there


@dataclass(frozen=True)
class CopyResult:
    transactions: list[CopiedTransaction]

    @property
    def committed_records(self) -> int:
        return sum(sum(t.records.values()) for t in self.transactions if t.committed)

    @property
    def aborted_records(self) -> int:
        return sum(sum(t.records.values()) for t in self.transactions if not t.committed)

    @property
    def markers(self) -> int:
        """Control records in the output: one per partition a transaction wrote to, committed or aborted."""
        return sum(len(t.records) for t in self.transactions)


class TransactionalCopier(Protocol):
    name: str

    def copy_transactionally(
        self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int,
        *, batch_size: int = 50, abort_first: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CopyResult:
        """Consume-transform-produce, exactly once.

        Read `count` records of `source` as a member of `group_id` (subscribe,
        read_committed, no auto commit), and per polled batch: begin, write
        copy_of(value) to the same partition of `sink`, send the consumed offsets
        to the transaction (send_offsets_to_transaction), commit. With
        `abort_first`, the first batch's transaction is aborted after its records
        were acknowledged and its offsets sent, and the consumer seeks back to
        copy that batch again.
        """
        ...

    def committed_offsets(
        self, bootstrap_servers: str, group_id: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[int, int | None]:
        """The group's committed offset per partition (None: nothing committed), fetched by a fresh consumer."""
        ...


@dataclass(frozen=True)
class PartitionDescription:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: dict[int, PartitionDescription]

    @property
    def fully_led(self) -> bool:
        return bool(self.partitions) and all(p.leader >= 0 for p in self.partitions.values())


class AdminClient(Protocol):
    name: str

    def create_topic(
        self, bootstrap_servers: str, name: str, partitions: int, replication_factor: int,
        *, configs: dict[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """CreateTopics, then wait until this client's own metadata shows a leader for every partition."""
        ...

    def describe_topic(self, bootstrap_servers: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                       ) -> TopicDescription:
        """Partitions with leader, replicas and ISR; raises ClientError for an unknown topic."""
        ...

    def describe_cluster(self, bootstrap_servers: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         ) -> dict[int, tuple[str, int]]:
        """Broker id -> the (host, port) the cluster told this client to use for that broker."""
        ...


def _wait_led(describe: Callable[[], TopicDescription | None], name: str, partitions: int, timeout_s: float,
              who: str) -> None:
    """Poll `describe` (None: not visible yet) until every partition of a new topic has a leader."""
    deadline = time.monotonic() + timeout_s
    last: TopicDescription | None = None
    while True:
        last = describe()
        if last is not None and len(last.partitions) == partitions and last.fully_led:
            return
        if time.monotonic() > deadline:
            raise ClientError(f"{who}: topic {name} not led within {timeout_s:.0f}s: {last}")
        time.sleep(0.1)


@dataclass(frozen=True)
class ConsumedRecord:
    partition: int
    offset: int
    value: bytes


class GroupMember:
    """One member of a consumer group, polling in its own thread until stopped.

    It subscribes with the client's eager assignors, auto-commits every 500 ms
    and heartbeats every 500 ms (so a join by another member is noticed
    quickly). The test thread reads what the member is assigned now, every
    distinct assignment it has had, and every record it has read. Subclasses
    implement `_consume` for one client family; it must call `_seen` after every
    poll and return once `_stopping` is set.
    """

    name = "group-member"
    POLL_S = 0.2
    SESSION_TIMEOUT_MS = 10000
    HEARTBEAT_MS = 500
    AUTO_COMMIT_MS = 500

    def __init__(self, bootstrap_servers: str, topic: str, group_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group_id = group_id
        self._lock = threading.Lock()
        self._assigned: frozenset[int] = frozenset()
        self._history: list[frozenset[int]] = []
        self._records: list[ConsumedRecord] = []
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> GroupMember:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-member", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Leave the group (the client's close) and wait for the thread; raises if the member failed."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise ClientError(f"{self.name} group member did not stop within {timeout_s:.0f}s")
        self._check()

    def assignment(self) -> frozenset[int]:
        self._check()
        with self._lock:
            return self._assigned

    def assignments(self) -> list[frozenset[int]]:
        with self._lock:
            return list(self._history)

    def records(self) -> list[ConsumedRecord]:
        self._check()
        with self._lock:
            return list(self._records)

    def _run(self) -> None:
        try:
            self._consume()
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self._error = e

    def _consume(self) -> None:
        raise NotImplementedError

    def _seen(self, assigned: Iterable[int], records: Iterable[ConsumedRecord]) -> None:
        now = frozenset(assigned)
        with self._lock:
            if now != self._assigned or not self._history:
                self._history.append(now)
            self._assigned = now
            self._records.extend(records)

    def _check(self) -> None:
        if self._error is not None:
            raise ClientError(f"{self.name} group member failed: {self._error!r}") from self._error


class GroupClient(Protocol):
    name: str

    def group_member(self, bootstrap_servers: str, topic: str, group_id: str) -> GroupMember:
        """A member of `group_id` subscribed to `topic`, not started yet."""
        ...


# -- kafka-python ---------------------------------------------------------------------------------


class KafkaPythonClient:
    name = "kafka-python"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers, transactional_id=transactional_id,
            max_block_ms=int(timeout_s * 1000), request_timeout_ms=30000,
        )
        try:
            producer.init_transactions()  # bounded by max_block_ms
            producer.begin_transaction()
            futures = [producer.send(topic, value=v, partition=partition) for v in values]
            producer.flush(timeout=timeout_s)
            for f in futures:
                f.get(timeout=timeout_s)  # raises the send's error, if any
            end = producer.commit_transaction if commit else producer.abort_transaction
            _bounded(end, timeout_s, f"kafka-python {'commit' if commit else 'abort'}_transaction")
        finally:
            producer.close(timeout=10)

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        from kafka import KafkaConsumer, TopicPartition

        tps = [TopicPartition(topic, p) for p in _partitions_of(bootstrap_servers, topic, partitions)]
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
        )
        got: dict[int, list[tuple[int, bytes]]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        try:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            # Under read_committed the client's own end offsets are the last stable offsets.
            ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
            while behind := [tp for tp in tps if consumer.position(tp, timeout_ms=5000) < ends[tp]]:
                if time.monotonic() > deadline:
                    raise ClientError(f"kafka-python: {[str(tp) for tp in behind]} did not reach {ends} "
                                      f"within {timeout_s:.0f}s")
                for tp, records in consumer.poll(timeout_ms=200).items():
                    got[tp.partition].extend((r.offset, r.value) for r in records)
        finally:
            consumer.close(autocommit=False)
        return [v for p in sorted(got) for _, v in sorted(got[p])]

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5,
                                 max_block_ms=int(timeout_s * 1000))
        try:
            futures = [producer.send(topic, value=v, partition=partition) for v in values]
            producer.flush(timeout=timeout_s)
            for f in futures:
                f.get(timeout=timeout_s)
        finally:
            producer.close(timeout=10)

    def copy_transactionally(
        self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int,
        *, batch_size: int = 50, abort_first: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CopyResult:
        from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

        consumer = KafkaConsumer(
            source, bootstrap_servers=bootstrap_servers, group_id=group_id, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
        )
        producer = KafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id,
                                 max_block_ms=int(timeout_s * 1000))
        deadline = time.monotonic() + timeout_s
        transactions: list[CopiedTransaction] = []
        done, abort_next = 0, abort_first
        try:
            producer.init_transactions()
            while done < count:
                if time.monotonic() > deadline:
                    raise ClientError(f"kafka-python copier: {done}/{count} copied within {timeout_s:.0f}s")
                polled = consumer.poll(timeout_ms=500, max_records=min(batch_size, count - done))
                batch = [(tp.partition, r) for tp, records in polled.items() for r in records]
                if not batch:
                    continue
                first, after = _batch_bounds((p, r.offset) for p, r in batch)
                producer.begin_transaction()
                futures = [producer.send(sink, value=copy_of(r.value), partition=p) for p, r in batch]
                producer.flush(timeout=timeout_s)
                for f in futures:
                    f.get(timeout=timeout_s)
                offsets = {TopicPartition(source, p): OffsetAndMetadata(o, "", -1) for p, o in after.items()}
                group = consumer.group_metadata()
                _bounded(functools.partial(producer.send_offsets_to_transaction, offsets, group), timeout_s,
                         "kafka-python send_offsets_to_transaction")
                if abort_next:
                    _bounded(producer.abort_transaction, timeout_s, "kafka-python abort_transaction")
                    for p, o in first.items():
                        consumer.seek(TopicPartition(source, p), o)
                else:
                    _bounded(producer.commit_transaction, timeout_s, "kafka-python commit_transaction")
                    done += len(batch)
                transactions.append(CopiedTransaction(not abort_next, _per_partition(p for p, _ in batch)))
                abort_next = False
        finally:
            producer.close(timeout=10)
            consumer.close(autocommit=False)
        return CopyResult(transactions)

    def committed_offsets(
        self, bootstrap_servers: str, group_id: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[int, int | None]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=group_id, enable_auto_commit=False)
        try:
            return {p: consumer.committed(TopicPartition(topic, p), timeout_ms=int(timeout_s * 1000))
                    for p in _partitions_of(bootstrap_servers, topic, partitions)}
        finally:
            consumer.close(autocommit=False)

    def group_member(self, bootstrap_servers: str, topic: str, group_id: str) -> GroupMember:
        return KafkaPythonGroupMember(bootstrap_servers, topic, group_id)

    # -- admin (KafkaAdminClient) --

    def create_topic(
        self, bootstrap_servers: str, name: str, partitions: int, replication_factor: int,
        *, configs: dict[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000))
        try:
            admin.create_topics({name: {"num_partitions": partitions, "replication_factor": replication_factor,
                                        "configs": configs or {}}}, timeout_ms=int(timeout_s * 1000))
            admin.wait_for_topics([name], timeout_ms=int(timeout_s * 1000))
        finally:
            admin.close()

    def describe_topic(self, bootstrap_servers: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                       ) -> TopicDescription:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000))
        try:
            (topic,) = admin.describe_topics([name])
        finally:
            admin.close()
        if topic["error_code"] != 0:
            raise ClientError(f"kafka-python describe_topics {name}: error code {topic['error_code']}")
        return TopicDescription(name, {
            int(p["partition_index"]): PartitionDescription(
                int(p["leader_id"]), tuple(p["replica_nodes"]), tuple(p["isr_nodes"]))
            for p in topic["partitions"]
        })

    def describe_cluster(self, bootstrap_servers: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         ) -> dict[int, tuple[str, int]]:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000))
        try:
            brokers = admin.describe_cluster()["brokers"]
        finally:
            admin.close()
        return {int(b["broker_id"]): (str(b["host"]), int(b["port"])) for b in brokers}


class KafkaPythonGroupMember(GroupMember):
    name = "kafka-python"

    def _consume(self) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap_servers, group_id=self.group_id,
            auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=self.AUTO_COMMIT_MS,
            session_timeout_ms=self.SESSION_TIMEOUT_MS, heartbeat_interval_ms=self.HEARTBEAT_MS,
        )
        try:
            while not self._stopping.is_set():
                polled = consumer.poll(timeout_ms=int(self.POLL_S * 1000))
                self._seen((tp.partition for tp in consumer.assignment()),
                           [ConsumedRecord(tp.partition, r.offset, r.value)
                            for tp, records in polled.items() for r in records])
        finally:
            consumer.close()

# -- confluent-kafka (librdkafka) -----------------------------------------------------------------


def _rdkafka_partition(partition: int | None) -> int:
    return -1 if partition is None else partition  # -1 is RD_KAFKA_PARTITION_UA: let the partitioner pick


def _rdkafka_records(consumer: Any, n: int, timeout_s: float, who: str) -> list[ConsumedRecord]:
    """Up to `n` records from one Consumer.consume call; retriable errors are skipped, others raised."""
    out = []
    for msg in consumer.consume(num_messages=n, timeout=timeout_s):
        err = msg.error()
        if err is None:
            out.append(ConsumedRecord(int(msg.partition() or 0), int(msg.offset() or 0), msg.value() or b""))
        elif not err.retriable():
            raise ClientError(f"confluent-kafka {who}: {err}")
    return out


class ConfluentKafkaClient:
    name = "confluent-kafka"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id})
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, value=v, partition=_rdkafka_partition(partition), on_delivery=on_delivery)
        # Flush before an abort too: librdkafka purges unsent messages on abort, and an
        # abort test means nothing unless the aborted records really reached the log.
        if producer.flush(timeout_s) != 0:
            raise ClientError(f"confluent-kafka: {len(producer)} messages not delivered within {timeout_s:.0f}s")
        if failures:
            producer.abort_transaction(timeout_s)
            raise ClientError(f"confluent-kafka delivery failed: {failures[:3]}")
        if commit:
            producer.commit_transaction(timeout_s)
        else:
            producer.abort_transaction(timeout_s)

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Plain idempotent produce, acks=all; raises unless every value was acknowledged."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                             "linger.ms": 5})
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for v in values:
            while True:
                try:
                    producer.produce(topic, value=v, partition=_rdkafka_partition(partition),
                                     on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
        if producer.flush(timeout_s) != 0 or failures:
            raise ClientError(f"confluent-kafka produce: {len(producer)} undelivered, failures {failures[:3]}")

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        wanted = _partitions_of(bootstrap_servers, topic, partitions)
        consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": _group_id(), "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # librdkafka signals end-of-partition at the last stable offset when read_committed.
            "enable.partition.eof": True,
        })
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in wanted}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted])
            while at_end != set(wanted):
                if time.monotonic() > deadline:
                    raise ClientError(f"confluent-kafka: {topic} partitions {sorted(set(wanted) - at_end)} "
                                      f"did not reach their end within {timeout_s:.0f}s")
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                err, p = msg.error(), int(msg.partition() or 0)
                if err is None:
                    got[p].append((int(msg.offset() or 0), msg.value() or b""))
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(p)
                elif not err.retriable():
                    raise ClientError(f"confluent-kafka consumer error: {err}")
        finally:
            consumer.close()
        return [v for p in sorted(got) for _, v in sorted(got[p])]

    def copy_transactionally(
        self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int,
        *, batch_size: int = 50, abort_first: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CopyResult:
        from confluent_kafka import Consumer, Producer, TopicPartition

        consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
        })
        producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id})
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        deadline = time.monotonic() + timeout_s
        transactions: list[CopiedTransaction] = []
        done, abort_next = 0, abort_first
        try:
            producer.init_transactions(timeout_s)
            consumer.subscribe([source])
            while done < count:
                if time.monotonic() > deadline:
                    raise ClientError(f"confluent-kafka copier: {done}/{count} copied within {timeout_s:.0f}s")
                batch = _rdkafka_records(consumer, min(batch_size, count - done), 0.5, "copier")
                if not batch:
                    continue
                first, after = _batch_bounds((r.partition, r.offset) for r in batch)
                producer.begin_transaction()
                for r in batch:
                    producer.produce(sink, value=copy_of(r.value), partition=r.partition, on_delivery=on_delivery)
                if producer.flush(timeout_s) != 0 or failures:
                    raise ClientError(f"confluent-kafka copier: {len(producer)} undelivered, failures {failures[:3]}")
                producer.send_offsets_to_transaction(
                    [TopicPartition(source, p, o) for p, o in after.items()], consumer.consumer_group_metadata(),
                    timeout_s)
                if abort_next:
                    producer.abort_transaction(timeout_s)
                    for p, o in first.items():
                        consumer.seek(TopicPartition(source, p, o))
                else:
                    producer.commit_transaction(timeout_s)
                    done += len(batch)
                transactions.append(CopiedTransaction(not abort_next, _per_partition(r.partition for r in batch)))
                abort_next = False
        finally:
            consumer.close()
        return CopyResult(transactions)

    def committed_offsets(
        self, bootstrap_servers: str, group_id: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[int, int | None]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group_id,
                             "enable.auto.commit": False})
        try:
            found = consumer.committed(
                [TopicPartition(topic, p) for p in _partitions_of(bootstrap_servers, topic, partitions)], timeout_s)
        finally:
            consumer.close()
        # librdkafka reports "nothing committed" as a negative logical offset (OFFSET_INVALID).
        return {int(tp.partition): (int(tp.offset) if tp.offset >= 0 else None) for tp in found}

    def group_member(self, bootstrap_servers: str, topic: str, group_id: str) -> GroupMember:
        return ConfluentGroupMember(bootstrap_servers, topic, group_id)

    def background_producer(self, bootstrap_servers: str, topic: str, *, partition: int = 0,
                            prefix: str = "seq") -> BackgroundProducer:
        return BackgroundProducer(bootstrap_servers, topic, partition=partition, prefix=prefix)

    # -- admin (AdminClient) --

    def create_topic(
        self, bootstrap_servers: str, name: str, partitions: int, replication_factor: int,
        *, configs: dict[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=configs or {})],
                                      request_timeout=timeout_s, operation_timeout=timeout_s)
        futures[name].result(timeout_s)  # raises KafkaException on an error

        def led() -> TopicDescription | None:
            t = admin.list_topics(topic=name, timeout=timeout_s).topics.get(name)
            if t is None or t.error is not None:
                return None
            return TopicDescription(name, {
                int(p.id): PartitionDescription(int(p.leader), tuple(p.replicas), tuple(p.isrs))
                for p in t.partitions.values()
            })

        _wait_led(led, name, partitions, timeout_s, "confluent-kafka create_topics")

    def describe_topic(self, bootstrap_servers: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                       ) -> TopicDescription:
        from confluent_kafka import KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        try:
            topic = admin.describe_topics(TopicCollection([name]), request_timeout=timeout_s)[name].result(timeout_s)
        except KafkaException as e:
            raise ClientError(f"confluent-kafka describe_topics {name}: {e}") from e
        return TopicDescription(name, {
            int(p.id): PartitionDescription(-1 if p.leader is None else int(p.leader.id),
                                            tuple(int(n.id) for n in p.replicas), tuple(int(n.id) for n in p.isr))
            for p in topic.partitions
        })

    def describe_cluster(self, bootstrap_servers: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         ) -> dict[int, tuple[str, int]]:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        cluster = admin.describe_cluster(request_timeout=timeout_s).result(timeout_s)  # DescribeCluster, not Metadata
        return {int(n.id): (str(n.host), int(n.port)) for n in cluster.nodes}


class ConfluentGroupMember(GroupMember):
    name = "confluent-kafka"

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap_servers, "group.id": self.group_id,
            "auto.offset.reset": "earliest", "enable.auto.commit": True,
            "auto.commit.interval.ms": self.AUTO_COMMIT_MS, "session.timeout.ms": self.SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": self.HEARTBEAT_MS,
        })
        try:
            consumer.subscribe([self.topic])
            while not self._stopping.is_set():
                got = _rdkafka_records(consumer, 500, self.POLL_S, "group member")
                self._seen((tp.partition for tp in consumer.assignment()), got)
        finally:
            consumer.close()  # commits and leaves the group


class BackgroundProducer:
    """confluent-kafka producing "<prefix>-<n>" to one partition, in its own thread, until stopped.

    Idempotent, acks=all, a long delivery timeout and a short reconnect backoff: a
    leader change delays acknowledgements instead of failing them. The test
    thread reads what was acknowledged so far (in acknowledgement order).
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, partition: int = 0, prefix: str = "seq",
                 interval_s: float = 0.005) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partition = partition
        self.prefix = prefix
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._acked: list[bytes] = []
        self._errors: list[str] = []
        self._sent = 0
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._unflushed = 0

    def start(self) -> BackgroundProducer:
        self._thread = threading.Thread(target=self._run, name="background-producer", daemon=True)
        self._thread.start()
        return self

    def acked(self) -> list[bytes]:
        self._check()
        with self._lock:
            return list(self._acked)

    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    @property
    def sent(self) -> int:
        return self._sent

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop producing and flush: raises if anything is still unacknowledged afterwards."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s + 10)
            if self._thread.is_alive():
                raise ClientError(f"background producer did not stop within {timeout_s:.0f}s")
        self._check()
        if self._unflushed:
            raise ClientError(f"background producer: {self._unflushed} records unacknowledged after the flush")

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({
            "bootstrap.servers": self.bootstrap_servers, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 120000, "reconnect.backoff.max.ms": 1000,
        })

        def on_delivery(err: Any, msg: Any) -> None:
            with self._lock:
                if err is None:
                    self._acked.append(msg.value())
                else:
                    self._errors.append(f"{msg.value()!r}: {err}")

        try:
            while not self._stopping.is_set():
                try:
                    producer.produce(self.topic, value=f"{self.prefix}-{self._sent}".encode(),
                                     partition=self.partition, on_delivery=on_delivery)
                    self._sent += 1
                except BufferError:
                    pass  # local queue full: the poll below lets deliveries drain
                producer.poll(self.interval_s)
            self._unflushed = producer.flush(60.0)
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self._error = e

    def _check(self) -> None:
        if self._error is not None:
            raise ClientError(f"background producer failed: {self._error!r}") from self._error

# -- aiokafka -------------------------------------------------------------------------------------


class AioKafkaClient:
    name = "aiokafka"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        # The adapter owns its event loop so callers (and tests) stay synchronous.
        coro = self._transaction(bootstrap_servers, topic, transactional_id, values, commit, partition)
        try:
            asyncio.run(asyncio.wait_for(coro, timeout_s))
        except TimeoutError as e:
            raise ClientError(f"aiokafka transaction did not finish within {timeout_s:.0f}s") from e

    @staticmethod
    async def _transaction(
        bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        partition: int | None,
    ) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id)
        await producer.start()  # start() runs InitProducerId for a transactional producer
        try:
            await producer.begin_transaction()
            futures = [await producer.send(topic, value=v, partition=partition) for v in values]
            await asyncio.gather(*futures)  # every record acknowledged before the outcome is chosen
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
        finally:
            await producer.stop()

    @staticmethod
    def _run(coro: Any, timeout_s: float, what: str) -> Any:
        try:
            return asyncio.run(asyncio.wait_for(coro, timeout_s))
        except TimeoutError as e:
            raise ClientError(f"aiokafka {what} did not finish within {timeout_s:.0f}s") from e

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        async def run() -> None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5)
            await producer.start()
            try:
                futures = [await producer.send(topic, value=v, partition=partition) for v in values]
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        self._run(run(), timeout_s, "produce")

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        wanted = _partitions_of(bootstrap_servers, topic, partitions)

        async def run() -> list[bytes]:
            from aiokafka import AIOKafkaConsumer, TopicPartition

            tps = [TopicPartition(topic, p) for p in wanted]
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None,
                                        enable_auto_commit=False, isolation_level="read_committed",
                                        auto_offset_reset="earliest")
            got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in wanted}
            await consumer.start()
            try:
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                ends = await consumer.end_offsets(tps)  # last stable offsets under read_committed
                while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                    for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                        got[tp.partition].extend((r.offset, r.value) for r in records)
            finally:
                await consumer.stop()
            return [v for p in sorted(got) for _, v in sorted(got[p])]

        result: list[bytes] = self._run(run(), timeout_s, "consume_committed")
        return result

    def copy_transactionally(
        self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int,
        *, batch_size: int = 50, abort_first: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CopyResult:
        async def run() -> CopyResult:
            from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

            consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap_servers, group_id=group_id,
                                        enable_auto_commit=False, isolation_level="read_committed",
                                        auto_offset_reset="earliest")
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id)
            transactions: list[CopiedTransaction] = []
            done, abort_next = 0, abort_first
            await producer.start()
            await consumer.start()
            try:
                while done < count:
                    polled = await consumer.getmany(timeout_ms=500, max_records=min(batch_size, count - done))
                    batch = [(tp.partition, r) for tp, records in polled.items() for r in records]
                    if not batch:
                        continue
                    first, after = _batch_bounds((p, r.offset) for p, r in batch)
                    await producer.begin_transaction()
                    futures = [await producer.send(sink, value=copy_of(r.value), partition=p) for p, r in batch]
                    await asyncio.gather(*futures)
                    await producer.send_offsets_to_transaction(
                        {TopicPartition(source, p): o for p, o in after.items()}, group_id)
                    if abort_next:
                        await producer.abort_transaction()
                        for p, o in first.items():
                            consumer.seek(TopicPartition(source, p), o)
                    else:
                        await producer.commit_transaction()
                        done += len(batch)
                    transactions.append(CopiedTransaction(not abort_next, _per_partition(p for p, _ in batch)))
                    abort_next = False
            finally:
                await consumer.stop()
                await producer.stop()
            return CopyResult(transactions)

        result: CopyResult = self._run(run(), timeout_s, "copy_transactionally")
        return result

    def committed_offsets(
        self, bootstrap_servers: str, group_id: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[int, int | None]:
        wanted = _partitions_of(bootstrap_servers, topic, partitions)

        async def run() -> dict[int, int | None]:
            from aiokafka import AIOKafkaConsumer, TopicPartition

            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=group_id,
                                        enable_auto_commit=False)
            await consumer.start()
            try:
                return {p: await consumer.committed(TopicPartition(topic, p)) for p in wanted}
            finally:
                await consumer.stop()

        result: dict[int, int | None] = self._run(run(), timeout_s, "committed_offsets")
        return result

    def group_member(self, bootstrap_servers: str, topic: str, group_id: str) -> GroupMember:
        return AioKafkaGroupMember(bootstrap_servers, topic, group_id)

    # -- admin (AIOKafkaAdminClient) --

    def create_topic(
        self, bootstrap_servers: str, name: str, partitions: int, replication_factor: int,
        *, configs: dict[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        async def run() -> None:
            from aiokafka.admin import AIOKafkaAdminClient, NewTopic

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
            await admin.start()
            try:
                resp = await admin.create_topics([NewTopic(name, partitions, replication_factor,
                                                           topic_configs=configs or {})],
                                                 timeout_ms=int(timeout_s * 1000))
                errors = [e for _, code, *e in resp.topic_errors if code != 0]
                if errors:
                    raise ClientError(f"aiokafka create_topics {name}: {resp}")
                deadline = time.monotonic() + timeout_s
                while True:
                    (topic,) = await admin.describe_topics([name])
                    described = _aiokafka_topic(name, topic)
                    if described is not None and len(described.partitions) == partitions and described.fully_led:
                        return
                    if time.monotonic() > deadline:
                        raise ClientError(f"aiokafka: topic {name} not led within {timeout_s:.0f}s: {topic}")
                    await asyncio.sleep(0.1)
            finally:
                await admin.close()

        self._run(run(), timeout_s + 5, "create_topic")

    def describe_topic(self, bootstrap_servers: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                       ) -> TopicDescription:
        async def run() -> Any:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
            await admin.start()
            try:
                return await admin.describe_topics([name])
            finally:
                await admin.close()

        (topic,) = self._run(run(), timeout_s, "describe_topics")
        described = _aiokafka_topic(name, topic)
        if described is None:
            raise ClientError(f"aiokafka describe_topics {name}: {topic}")
        return described

    def describe_cluster(self, bootstrap_servers: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         ) -> dict[int, tuple[str, int]]:
        async def run() -> Any:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
            await admin.start()
            try:
                return await admin.describe_cluster()
            finally:
                await admin.close()

        cluster = self._run(run(), timeout_s, "describe_cluster")
        return {int(b["node_id"]): (str(b["host"]), int(b["port"])) for b in cluster["brokers"]}


def _aiokafka_topic(name: str, topic: dict[str, Any]) -> TopicDescription | None:
    """aiokafka's describe_topics entry (a Metadata response as dicts); None if it carries an error."""
    if topic["error_code"] != 0 or any(p["error_code"] != 0 for p in topic["partitions"]):
        return None
    return TopicDescription(name, {
        int(p["partition"]): PartitionDescription(int(p["leader"]), tuple(p["replicas"]), tuple(p["isr"]))
        for p in topic["partitions"]
    })


class AioKafkaGroupMember(GroupMember):
    name = "aiokafka"

    def _consume(self) -> None:
        asyncio.run(self._consume_async())

    async def _consume_async(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap_servers, group_id=self.group_id,
            auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=self.AUTO_COMMIT_MS,
            session_timeout_ms=self.SESSION_TIMEOUT_MS, heartbeat_interval_ms=self.HEARTBEAT_MS,
        )
        await consumer.start()
        try:
            while not self._stopping.is_set():
                polled = await consumer.getmany(timeout_ms=int(self.POLL_S * 1000))
                self._seen((tp.partition for tp in consumer.assignment()),
                           [ConsumedRecord(tp.partition, r.offset, r.value)
                            for tp, records in polled.items() for r in records])
        finally:
            await consumer.stop()  # commits and leaves the group

# -- kcat -------------------------------------------------------------------------------------------


class Kcat:
    """kcat (librdkafka). It has no transactional producer, so it only ever reads transactions."""

    name = "kcat"

    def __init__(self, executable: str = KCAT) -> None:
        self.executable = executable

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        got: list[tuple[int, int, bytes]] = []
        for p in _partitions_of(bootstrap_servers, topic, partitions):
            # -e: exit at end of partition, which read_committed puts at the last stable offset.
            # -J: one JSON envelope per message, so values may contain newlines.
            run = run_tool(
                [self.executable, "-C", "-b", bootstrap_servers, "-t", topic, "-p", str(p), "-o", "beginning",
                 "-e", "-q", "-J", "-X", "isolation.level=read_committed"],
                timeout_s=timeout_s,
            )
            for line in run.stdout.splitlines():
                if line.strip():
                    m = json.loads(line)
                    value = m["payload"]
                    got.append((int(m["partition"]), int(m["offset"]), b"" if value is None else value.encode()))
        return [v for _, _, v in sorted(got)]

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """One message per value (newline-delimited on kcat's stdin), acks=all."""
        if any(b"\n" in v for v in values):
            raise ValueError("kcat produce takes newline-delimited values; a value contains a newline")
        args = [self.executable, "-P", "-b", bootstrap_servers, "-t", topic, "-X", "acks=all"]
        if partition is not None:
            args += ["-p", str(partition)]
        run = run_tool(args, timeout_s=timeout_s, input_bytes=b"".join(v + b"\n" for v in values))
        # kcat reports delivery failures on stderr but may still exit 0.
        if "ERROR" in run.stderr:
            raise ClientError("kcat produce reported errors\n" + _describe(run.args, run.stdout, run.stderr))

    def metadata(self, bootstrap_servers: str, *, topic: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """kcat -L -J: {"brokers": [{"id", "name"}...], "topics": [{"topic", "partitions": [...]}...], ...}."""
        args = [self.executable, "-L", "-J", "-b", bootstrap_servers]
        if topic is not None:
            args += ["-t", topic]
        result: dict[str, Any] = json.loads(run_tool(args, timeout_s=timeout_s).stdout)
        return result


PYTHON_TRANSACTIONAL_CLIENTS: dict[str, TransactionalClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient())
}
COMMITTED_CONSUMERS: dict[str, CommittedConsumer] = {
    c.name: c for c in (ConfluentKafkaClient(), KafkaPythonClient(), Kcat())
}


class PythonClient(TransactionalClient, CommittedConsumer, PlainProducer, TransactionalCopier, GroupClient, AdminClient,
                   Protocol):
    """A Python client family with every part of the proxied suite (see tests/integration)."""


PYTHON_CLIENTS: dict[str, PythonClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient())
}


# -- Java tools -------------------------------------------------------------------------------------

TOOLS_PACKAGE = "org.apache.kafka.tools"

# The first kafka-tools release that ships each tool under org.apache.kafka.tools.
_TOOL_SINCE: dict[str, tuple[int, int]] = {
    "TransactionalMessageCopier": (2, 0),
    "VerifiableProducer": (2, 0),
    "VerifiableConsumer": (2, 0),
    "ProducerPerformance": (2, 0),
    "TransactionsCommand": (3, 0),
    "EndToEndLatency": (3, 5),
}


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


def tools_log_config() -> Path:
    """A folder with log4j 1 and log4j2 configs: WARN and above, to stderr.

    Kafka 2.x/3.x tools log through log4j 1 (or reload4j), 4.x through log4j2. Without
    a config, log4j 1 prints warnings about missing appenders and the client logs
    every config dump at INFO. stderr is captured, so real warnings still reach
    the failure message of a tool that failed.
    """
    folder = jars.cache_root() / "tools-logging"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "log4j.properties": (
            "log4j.rootLogger=WARN, stderr\n"
            "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\n"
            "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        ),
        "log4j2.properties": (
            "appender.stderr.type=Console\n"
            "appender.stderr.name=STDERR\n"
            "appender.stderr.target=SYSTEM_ERR\n"
            "appender.stderr.layout.type=PatternLayout\n"
            "appender.stderr.layout.pattern=[%d] %p %m (%c)%n\n"
            "rootLogger.level=WARN\n"
            "rootLogger.appenderRef.stderr.ref=STDERR\n"
        ),
    }
    for name, text in files.items():
        target = folder / name
        if not target.exists() or target.read_text() != text:
            # Write-then-rename, so a concurrent JVM never reads half a file.
            tmp = folder / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            tmp.replace(target)
    return folder


def java_command(tool: str, java_version: str, args: Sequence[str]) -> list[str]:
    """`java ... org.apache.kafka.tools.<tool> args` with the kafka-tools jars of `java_version`.

    The kafka-tools folder carries kafka-clients of the same version, so the tool
    runs that Java client version.
    """
    since = _TOOL_SINCE.get(tool)
    if since is None:
        raise ClientError(f"unknown tool {tool}")
    if _version_tuple(java_version) < since:
        raise ClientError(f"{tool} is not in kafka-tools {java_version} (first in {since[0]}.{since[1]})")
    folder = jars.resolve("kafka-tools", java_version)
    logs = tools_log_config()
    return [
        "java", f"-Xmx{TOOL_HEAP}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
        # ProducerPerformance formats numbers with the default locale; pin it so "1,5" never appears.
        "-Duser.language=en", "-Duser.country=US",
        f"-Dlog4j.configuration=file:{logs / 'log4j.properties'}",
        f"-Dlog4j2.configurationFile={logs / 'log4j2.properties'}",
        "-cp", jars.classpath(folder), f"{TOOLS_PACKAGE}.{tool}", *args,
    ]


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a log line that happens to start with a brace
    return out


@dataclass(frozen=True)
class CopierResult:
    total_processed: int
    consumed: int
    remaining: int
    shutdown_complete: bool
    status_lines: int


def _is_copier_shutdown(status: dict[str, Any]) -> bool:
    # 2.8 prints {"shutdown_complete": <txn id>, ...}; 3.x prints {"stage": "ShutdownComplete", ...}.
    return "shutdown_complete" in status or status.get("stage") == "ShutdownComplete"


def java_transactional_copier(
    bootstrap_servers: str, input_topic: str, output_topic: str, transactional_id: str, group_id: str,
    max_messages: int, java_version: str, *, input_partition: int = 0, transaction_size: int = 200,
    transaction_timeout_ms: int = 60000, enable_random_aborts: bool = False, use_group_metadata: bool = False,
    timeout_s: float = 180.0,
) -> CopierResult:
    """Run TransactionalMessageCopier (consume a partition, produce + commit offsets in transactions).

    It prints one JSON status line per loop and a final one from its shutdown hook;
    the result is the final line's counts. `max_messages` is capped by the tool to
    what the input partition holds (read_committed) when it starts.
    """
    args = [
        "--broker-list", bootstrap_servers, "--input-topic", input_topic, "--input-partition", str(input_partition),
        "--output-topic", output_topic, "--transactional-id", transactional_id, "--consumer-group", group_id,
        "--max-messages", str(max_messages), "--transaction-size", str(transaction_size),
        "--transaction-timeout", str(transaction_timeout_ms),
    ]
    if enable_random_aborts:
        args.append("--enable-random-aborts")
    if use_group_metadata:
        args.append("--use-group-metadata")
    run = run_tool(java_command("TransactionalMessageCopier", java_version, args), timeout_s=timeout_s)
    statuses = [s for s in _json_lines(run.stdout) if "totalProcessed" in s]
    if not statuses:
        raise ClientError("TransactionalMessageCopier printed no status\n"
                          + _describe(run.args, run.stdout, run.stderr))
    last = statuses[-1]
    return CopierResult(
        total_processed=int(last["totalProcessed"]), consumed=int(last["consumed"]),
        remaining=int(last["remaining"]), shutdown_complete=_is_copier_shutdown(last),
        status_lines=len(statuses),
    )


@dataclass(frozen=True)
class VerifiableProducerResult:
    acked_values: list[str]
    errors: list[str]
    sent: int
    acked: int


def java_verifiable_producer(
    bootstrap_servers: str, topic: str, max_messages: int, java_version: str, *, throughput: int = -1,
    acks: int = -1, value_prefix: int | None = None, producer_config: dict[str, str] | None = None,
    config_dir: Path | None = None, timeout_s: float = 120.0,
) -> VerifiableProducerResult:
    """Run VerifiableProducer: values "0".."N-1" (or "<prefix>.<i>"), one JSON line per ack or error.

    It sets retries=0, so a send can fail on a leadership change; callers check `errors`.
    `producer_config` is written to a properties file in `config_dir` (default: a temp file).
    """
    args = ["--bootstrap-server", bootstrap_servers, "--topic", topic, "--max-messages", str(max_messages),
            "--throughput", str(throughput), "--acks", str(acks)]
    if value_prefix is not None:
        args += ["--value-prefix", str(value_prefix)]
    with _properties_file(producer_config, config_dir) as props:
        if props is not None:
            args += ["--producer.config", str(props)]
        run = run_tool(java_command("VerifiableProducer", java_version, args), timeout_s=timeout_s)
    acked: list[str] = []
    errors: list[str] = []
    sent = acked_count = -1
    for event in _json_lines(run.stdout):
        name = event.get("name")
        if name == "producer_send_success":
            acked.append(str(event["value"]))
        elif name == "producer_send_error":
            errors.append(f"{event.get('value')}: {event.get('exception')} {event.get('message')}")
        elif name == "tool_data":
            sent, acked_count = int(event["sent"]), int(event["acked"])
    return VerifiableProducerResult(acked_values=acked, errors=errors, sent=sent, acked=acked_count)


@dataclass(frozen=True)
class PerfResult:
    records: int
    records_per_sec: float
    mb_per_sec: float
    avg_latency_ms: float
    max_latency_ms: float
    p50_ms: int
    p95_ms: int
    p99_ms: int
    p999_ms: int


# The summary line ProducerPerformance prints last (same shape in 2.8 to 4.x).
_PERF_TOTAL = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th"
)


def parse_producer_performance(stdout: str) -> PerfResult | None:
    matches = list(_PERF_TOTAL.finditer(stdout))
    if not matches:
        return None
    m = matches[-1]
    return PerfResult(
        records=int(m["records"]), records_per_sec=float(m["rps"]), mb_per_sec=float(m["mbps"]),
        avg_latency_ms=float(m["avg"]), max_latency_ms=float(m["max"]), p50_ms=int(m["p50"]),
        p95_ms=int(m["p95"]), p99_ms=int(m["p99"]), p999_ms=int(m["p999"]),
    )


def java_producer_performance(
    bootstrap_servers: str, topic: str, num_records: int, java_version: str, *, record_size: int = 100,
    throughput: int = -1, transactional_id: str | None = None, transaction_duration_ms: int | None = None,
    producer_props: dict[str, str] | None = None, timeout_s: float = 180.0,
) -> PerfResult:
    """Run ProducerPerformance and parse its summary line.

    Transactions are on when `transaction_duration_ms` > 0 (the tool commits after each
    such interval). --transactional-id and --transaction-duration-ms exist in every
    kafka-tools version we use (2.8.2 up to 4.3.1).
    """
    # A properties file rather than --producer-props, which rejects any value containing "=".
    props = {"bootstrap.servers": bootstrap_servers, "acks": "all", **(producer_props or {})}
    args = ["--topic", topic, "--num-records", str(num_records), "--record-size", str(record_size),
            "--throughput", str(throughput)]
    if transactional_id is not None:
        args += ["--transactional-id", transactional_id]
    if transaction_duration_ms is not None:
        args += ["--transaction-duration-ms", str(transaction_duration_ms)]
    with _properties_file(props, None) as config:
        args += ["--producer.config", str(config)]
        run = run_tool(java_command("ProducerPerformance", java_version, args), timeout_s=timeout_s)
    result = parse_producer_performance(run.stdout)
    if result is None:
        raise ClientError("ProducerPerformance printed no summary\n" + _describe(run.args, run.stdout, run.stderr))
    return result


@dataclass(frozen=True)
class HangingTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp_ms: int
    duration_min: int


_HANGING_HEADER = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                   "LastTimestamp", "Duration(min)"]


def parse_find_hanging(stdout: str) -> list[HangingTransaction]:
    """Parse the table find-hanging prints: a header row, then one whitespace-separated row per hit."""
    lines = [line.split() for line in stdout.splitlines() if line.strip()]
    try:
        start = lines.index(_HANGING_HEADER) + 1
    except ValueError:
        raise ClientError(f"find-hanging printed no table:\n{_tail(stdout)}") from None
    rows = []
    for cells in lines[start:]:
        if len(cells) != len(_HANGING_HEADER):
            raise ClientError(f"unexpected find-hanging row {cells!r}:\n{_tail(stdout)}")
        topic, *numbers = cells
        p, pid, epoch, coord, offset, ts, dur = (int(x) for x in numbers)
        rows.append(HangingTransaction(topic, p, pid, epoch, coord, offset, ts, dur))
    return rows


def transactions_find_hanging(
    bootstrap_servers: str, *, broker_id: int | None = None, topic: str | None = None,
    partition: int | None = None, java_version: str = "3.5.2", max_transaction_timeout_minutes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[HangingTransaction]:
    """`TransactionsCommand find-hanging`: open transactions the coordinator does not know about.

    Candidates are open transactions on a partition whose producer's last batch
    timestamp (the batch's max timestamp) is older than --max-transaction-timeout
    minutes (tool default 15). The tool does not validate that value: 0 (and even
    negative numbers) are accepted, and 0 makes every open transaction a candidate.
    A candidate is reported if the coordinator does not list its partition in that
    transaction. Needs --broker-id or --topic (tool rule); --partition needs --topic.
    """
    if broker_id is None and topic is None:
        raise ValueError("find-hanging needs broker_id or topic")
    if partition is not None and topic is None:
        raise ValueError("find-hanging --partition needs topic")
    args = ["--bootstrap-server", bootstrap_servers, "find-hanging"]
    if broker_id is not None:
        args += ["--broker-id", str(broker_id)]
    if topic is not None:
        args += ["--topic", topic]
    if partition is not None:
        args += ["--partition", str(partition)]
    if max_transaction_timeout_minutes is not None:
        args += ["--max-transaction-timeout", str(max_transaction_timeout_minutes)]
    run = run_tool(java_command("TransactionsCommand", java_version, args), timeout_s=timeout_s)
    return parse_find_hanging(run.stdout)


# -- helpers ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _properties_file(values: dict[str, str] | None, folder: Path | None) -> Iterator[Path | None]:
    """A temporary Java properties file, removed afterwards (None when there is nothing to write)."""
    if not values:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="txnguard-", suffix=".properties", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in values.items()))
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _batch_bounds(offsets: Iterable[tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition: the first offset of a polled batch, and the offset after its last record."""
    first: dict[int, int] = {}
    after: dict[int, int] = {}
    for p, o in offsets:
        first[p] = min(first.get(p, o), o)
        after[p] = max(after.get(p, o + 1), o + 1)
    return first, after


def _per_partition(partitions: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for p in partitions:
        counts[p] = counts.get(p, 0) + 1
    return counts


# -- paced transactions and an exactly-once copy loop (S4 / S6) ---------------------------------------


AckHook = Callable[[int, int], None]


@dataclass(frozen=True)
class PacedResult:
    committed: list[bytes]  # every value of every committed transaction, in send order
    aborted: int  # transactions aborted after an abortable error, then redone with the same values
    errors: list[str]  # the abortable errors, for the failure message and the report


def paced_values(transactional_id: str, transaction: int, per_transaction: int) -> list[bytes]:
    return [f"{transactional_id}-t{transaction}-r{i}".encode() for i in range(per_transaction)]


def paced_transactions(
    client_name: str, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int,
    per_transaction: int, partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None,
    timeout_s: float = 120.0, settings: dict[str, Any] | None = None,
) -> PacedResult:
    """`transactions` transactions of `per_transaction` records each, one Produce request per record.

    `settings` are the client library's own producer settings on top of the defaults (kafka-python
    keyword arguments, librdkafka properties, sarama.Config names), e.g. a small retry budget; not
    aiokafka.

    Each record is sent alone and its acknowledgement awaited before the next (linger 0), so a
    transaction is a long row of small Produce requests to one partition, all after the single
    AddPartitionsToTxn of that transaction. `on_ack(transaction, record)` runs in the producing
    thread after each acknowledgement, before the next send: a test can freeze a broker there and
    know the very next request is a Produce. An abortable error aborts the transaction and redoes
    it with the same values, as an application does; a fatal one raises ClientError.
    """
    run: Callable[..., PacedResult] | None = {
        "kafka-python": _paced_kafka_python, "confluent-kafka": _paced_confluent, "aiokafka": _paced_aiokafka,
        "sarama": _paced_sarama}.get(client_name)
    if run is None:
        raise ValueError(f"no paced transactions for {client_name}")
    if settings:
        if client_name == "aiokafka":
            raise ValueError(f"no producer settings for {client_name}'s paced transactions")
        run = functools.partial(run, settings=settings)
    return run(bootstrap_servers, topic, transactional_id, transactions, per_transaction, partition, gap_s,
               on_ack or (lambda t, i: None), timeout_s)


def _paced_kafka_python(bootstrap_servers: str, topic: str, transactional_id: str, transactions: int,
                        per_transaction: int, partition: int, gap_s: float, on_ack: AckHook,
                        timeout_s: float, settings: dict[str, Any] | None = None) -> PacedResult:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id, linger_ms=0,
                             max_block_ms=int(timeout_s * 1000), **(settings or {}))
    committed: list[bytes] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    t = 0
    try:
        producer.init_transactions()
        while t < transactions:
            if time.monotonic() > deadline:
                raise ClientError(f"kafka-python: {t}/{transactions} transactions within {timeout_s:.0f}s; {errors}")
            values = paced_values(transactional_id, t, per_transaction)
            try:
                producer.begin_transaction()
                for i, v in enumerate(values):
                    producer.send(topic, value=v, partition=partition).get(timeout=timeout_s)
                    on_ack(t, i)
                    time.sleep(gap_s)
                _bounded(producer.commit_transaction, timeout_s, "kafka-python commit_transaction")
            except KafkaError as e:
                manager = getattr(producer, "_transaction_manager", None)
                if manager is not None and manager.has_fatal_error():
                    raise ClientError(f"kafka-python fatal error in transaction {t}: {e!r}") from e
                errors.append(repr(e))
                _bounded(producer.abort_transaction, timeout_s, "kafka-python abort_transaction")
                continue
            committed.extend(values)
            t += 1
    finally:
        producer.close(timeout=10)
    return PacedResult(committed, len(errors), errors)


def _paced_confluent(bootstrap_servers: str, topic: str, transactional_id: str, transactions: int,
                     per_transaction: int, partition: int, gap_s: float, on_ack: AckHook,
                     timeout_s: float, settings: dict[str, Any] | None = None) -> PacedResult:
    from confluent_kafka import KafkaError, KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id,
                         "linger.ms": 0, **(settings or {})})
    committed: list[bytes] = []
    errors: list[str] = []
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    deadline = time.monotonic() + timeout_s
    producer.init_transactions(timeout_s)
    t = 0
    while t < transactions:
        if time.monotonic() > deadline:
            raise ClientError(f"confluent-kafka: {t}/{transactions} transactions within {timeout_s:.0f}s; {errors}")
        values = paced_values(transactional_id, t, per_transaction)
        failed.clear()
        try:
            producer.begin_transaction()
            for i, v in enumerate(values):
                producer.produce(topic, value=v, partition=partition, on_delivery=on_delivery)
                if producer.flush(timeout_s) != 0:
                    raise ClientError(f"confluent-kafka: record {i} of transaction {t} not delivered in {timeout_s}s")
                if failed:
                    raise KafkaException(failed[0])
                on_ack(t, i)
                time.sleep(gap_s)
            _confluent_commit(producer, timeout_s)
        except KafkaException as e:
            err = e.args[0]
            if err.fatal() or not (err.txn_requires_abort() or failed):
                raise ClientError(f"confluent-kafka error in transaction {t}: {err}") from e
            errors.append(str(err))
            producer.abort_transaction(timeout_s)
            continue
        committed.extend(values)
        t += 1
    return PacedResult(committed, len(errors), errors)


def _confluent_commit(producer: Any, timeout_s: float, on_retry: Callable[[str], None] | None = None) -> None:
    """commit_transaction, retried while librdkafka calls the error retriable (its documented contract);
    `on_retry(error)` hears of each retry."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.commit_transaction(timeout_s)
            return
        except KafkaException as e:
            if not e.args[0].retriable() or time.monotonic() > deadline:
                raise
            if on_retry is not None:
                on_retry(str(e.args[0]))
            time.sleep(0.1)


def _paced_aiokafka(bootstrap_servers: str, topic: str, transactional_id: str, transactions: int,
                    per_transaction: int, partition: int, gap_s: float, on_ack: AckHook,
                    timeout_s: float) -> PacedResult:
    async def run() -> PacedResult:
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import (
            KafkaError,
            OutOfOrderSequenceNumber,
            ProducerFenced,
            TransactionalIdAuthorizationFailed,
            UnsupportedVersionError,
        )

        fatal = (ProducerFenced, OutOfOrderSequenceNumber, TransactionalIdAuthorizationFailed,
                 UnsupportedVersionError)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id,
                                    linger_ms=0)
        committed: list[bytes] = []
        errors: list[str] = []
        await producer.start()
        t = 0
        try:
            while t < transactions:
                values = paced_values(transactional_id, t, per_transaction)
                try:
                    await producer.begin_transaction()
                    for i, v in enumerate(values):
                        await (await producer.send(topic, value=v, partition=partition))
                        # The hook may block (it freezes a broker); the loop has nothing else to do meanwhile.
                        on_ack(t, i)
                        await asyncio.sleep(gap_s)
                    await producer.commit_transaction()
                except fatal as e:
                    raise ClientError(f"aiokafka fatal error in transaction {t}: {e!r}") from e
                except KafkaError as e:
                    errors.append(repr(e))
                    await producer.abort_transaction()
                    continue
                committed.extend(values)
                t += 1
        finally:
            await producer.stop()
        return PacedResult(committed, len(errors), errors)

    try:
        return asyncio.run(asyncio.wait_for(run(), timeout_s))
    except TimeoutError as e:
        raise ClientError(f"aiokafka paced transactions did not finish within {timeout_s:.0f}s") from e


# IBM/sarama (Go), built by `make sarama` from tools/sarama-paced.
SARAMA_PACED = os.environ.get("TXNGUARD_SARAMA_PACED", str(Path.home() / ".cache/txnguard/bin/sarama-paced"))
# The Sarama settings sarama-paced takes, by their names in sarama.Config, and its flag for each.
SARAMA_SETTINGS = {"Producer.Retry.Max": "--retries", "Producer.Retry.Backoff": "--backoff-ms",
                   "Version": "--kafka-version"}


def sarama_paced_transactions(
    bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
    partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
    settings: dict[str, Any] | None = None,
) -> PacedResult:
    """paced_transactions("sarama", ...), with `settings` on top of Sarama's defaults: Producer.Retry.Max
    (default 3), Producer.Retry.Backoff (in milliseconds here; default 100) and Version ("2.8.0").

    The Go program prints `ACK t i` after each acknowledgement and waits for a line on stdin; `on_ack(t, i)`
    runs here, in the calling thread, before that line is written, so the next Produce leaves only after
    the hook returned. Killed (with anything it started) after `timeout_s`.
    """
    args = [SARAMA_PACED, "--bootstrap", bootstrap_servers, "--topic", topic, "--transactional-id",
            transactional_id, "--partition", str(partition), "--transactions", str(transactions),
            "--per-transaction", str(per_transaction), "--gap-ms", str(round(gap_s * 1000)), "--ack-handshake",
            "--timeout-s", str(timeout_s)]
    for name, value in (settings or {}).items():
        if name not in SARAMA_SETTINGS:
            raise ValueError(f"sarama-paced takes {', '.join(SARAMA_SETTINGS)}, not {name}")
        args += [SARAMA_SETTINGS[name], str(value)]
    if not os.access(SARAMA_PACED, os.X_OK):
        raise ClientError(f"{SARAMA_PACED} is missing: run `make sarama`")
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr or ()), name="sarama-stderr", daemon=True)
    drain.start()
    try:
        out = _sarama_handshake(proc, on_ack or (lambda t, i: None), time.monotonic() + timeout_s, timeout_s)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        drain.join(5)
    result = json.loads(out[-1]) if out and out[-1].startswith("{") else None
    if proc.returncode != 0 or result is None or result.get("fatal") is not None:
        raise ClientError(f"sarama-paced exited with {proc.returncode}: "
                          f"{result.get('fatal') if result else None}\n"
                          + _describe(args, "\n".join(out), b"".join(stderr).decode(errors="replace")))
    return PacedResult([v.encode() for v in result["committed"]], result["aborted"], result["errors"])


def _sarama_handshake(proc: subprocess.Popen[bytes], on_ack: AckHook, deadline: float, timeout_s: float) -> list[str]:
    """Read the program's stdout to its end: run on_ack for each ACK line and answer it; the other lines."""
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="sarama-stdout", daemon=True).start()
    out: list[str] = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ClientError(f"sarama-paced did not finish within {timeout_s:.0f}s and was killed; "
                              f"last output {out[-3:]}") from None
        if line is None:
            return out
        text = line.decode(errors="replace").strip()
        if not text.startswith("ACK "):
            out.append(text)
            continue
        _, t, i = text.split()
        on_ack(int(t), int(i))
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # it exited: its last line says why
                proc.stdin.write(b"\n")
                proc.stdin.flush()


def _paced_sarama(bootstrap_servers: str, topic: str, transactional_id: str, transactions: int,
                  per_transaction: int, partition: int, gap_s: float, on_ack: AckHook,
                  timeout_s: float, settings: dict[str, Any] | None = None) -> PacedResult:
    return sarama_paced_transactions(bootstrap_servers, topic, transactional_id, transactions=transactions,
                                     per_transaction=per_transaction, partition=partition, gap_s=gap_s,
                                     on_ack=on_ack, timeout_s=timeout_s, settings=settings)


@dataclass(frozen=True)
class ExactlyOnceCopy:
    copied: int  # input records whose copies were committed together with their offsets
    transactions: int  # committed transactions
    aborted: int  # transactions aborted after an abortable error or a rebalance, then redone
    errors: list[str]  # every error the loop handled (retried or aborted), for the report
    producers: int = 1  # producer instances used: a fatal error (e.g. fenced) replaces the producer
    # What the application saw, when: (wall clock s, kind, text). Errors: "retriable" (a commit retried),
    # "abortable" (the transaction aborted and redone), "fatal" (the producer replaced), "delivery"; and
    # "committed" after each commit, its text the input records copied so far.
    timeline: list[tuple[float, str, str]] = field(default_factory=list)


def confluent_exactly_once_copy(
    bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int, *,
    commit_every: int = 500, timeout_s: float = 240.0, progress: Callable[[int], None] | None = None,
    producer_config: dict[str, Any] | None = None,
) -> ExactlyOnceCopy:
    """A confluent-kafka consume-transform-produce loop written as an application would write it.

    The consumer subscribes to `source` in `group_id` with read_committed and no auto commit; each
    record's copy_of(value) goes to the same partition of `sink` inside a transaction; every
    `commit_every` records (or when the input runs dry) the consumed positions go into the
    transaction (send_offsets_to_transaction with the consumer's group metadata) and it commits.
    Retriable errors on commit are retried; an abortable error (or a rebalance during a
    transaction) aborts the transaction and rewinds the consumer to the group's committed offsets,
    so those records are copied again in a later transaction; a fatal error (the producer fenced,
    for instance because its transaction outlived transaction.timeout.ms and the coordinator
    aborted it) replaces the producer, as librdkafka documents: a new instance with the same
    transactional id fences the old one, and the consumer rewinds. At most `max_producers`.
    Stops once `count` input records were committed; `progress(copied)` runs after each commit.
    `producer_config` adds to the producer's settings (e.g. {"debug": "eos,broker"} to see librdkafka's side).
    """
    loop = _ExactlyOnceLoop(bootstrap_servers, source, sink, transactional_id, group_id, timeout_s,
                            producer_config or {})
    return loop.run(count, commit_every, time.monotonic() + timeout_s, progress or (lambda _n: None))


MAX_PRODUCERS = 3


class _ExactlyOnceLoop:
    def __init__(self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str,
                 timeout_s: float, producer_config: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Consumer, Producer

        self.source, self.sink, self.timeout_s = source, sink, timeout_s
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest", "session.timeout.ms": 30000,
        })
        self.producer_config = {"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id,
                                "linger.ms": 5, "transaction.timeout.ms": 60000, **(producer_config or {})}
        self.producer = Producer(self.producer_config)
        self.producers = 1
        self.rebalanced = threading.Event()
        self.errors: list[str] = []
        self.timeline: list[tuple[float, str, str]] = []
        self.aborted = 0
        self.in_txn = False
        self.pending = 0
        self.positions: dict[int, int] = {}

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._note("delivery", f"delivery: {err}")

    def run(self, count: int, commit_every: int, deadline: float, progress: Callable[[int], None]) -> ExactlyOnceCopy:
        copied = transactions = 0
        try:
            self.producer.init_transactions(self.timeout_s)
            self.consumer.subscribe([self.source], on_revoke=lambda _c, _ps: self.rebalanced.set(),
                                    on_assign=lambda _c, _ps: self.rebalanced.set())
            while copied < count:
                if time.monotonic() > deadline:
                    raise ClientError(f"confluent-kafka exactly-once copy: {copied}/{count} copied in time; "
                                      f"last errors {self.errors[-5:]}")
                batch = _rdkafka_records(self.consumer, min(commit_every - self.pending, 500), 0.2,
                                         "exactly-once copy")
                if self.rebalanced.is_set():
                    self.rebalanced.clear()
                    if self.in_txn:  # offsets of partitions this member may no longer own: start over
                        self._abort("rebalance during a transaction")
                        continue
                self._transform(batch)
                dry = not batch
                if self.in_txn and (dry or self.pending >= commit_every or copied + self.pending >= count):
                    done = self._commit()
                    if done:
                        copied += done
                        transactions += 1
                        self.timeline.append((time.time(), "committed", str(copied)))
                        progress(copied)
        finally:
            self.consumer.close()
        return ExactlyOnceCopy(copied, transactions, self.aborted, self.errors, self.producers, self.timeline)

    def _note(self, kind: str, text: str) -> None:
        self.errors.append(text)
        self.timeline.append((time.time(), kind, text))

    def _transform(self, batch: list[ConsumedRecord]) -> None:
        if batch and not self.in_txn:
            self.producer.begin_transaction()
            self.in_txn = True
        for r in batch:
            while True:
                try:
                    self.producer.produce(self.sink, value=copy_of(r.value), partition=r.partition,
                                          on_delivery=self._on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    self.producer.poll(0.05)
            self.positions[r.partition] = r.offset + 1
        self.pending += len(batch)
        self.producer.poll(0)

    def _commit(self) -> int:
        """Offsets into the transaction, then commit; the number of input records committed (0: aborted)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.producer.send_offsets_to_transaction(
                [TopicPartition(self.source, p, o) for p, o in self.positions.items()],
                self.consumer.consumer_group_metadata(), self.timeout_s)
            _confluent_commit(self.producer, self.timeout_s,
                              on_retry=lambda why: self._note("retriable", f"commit retried: {why}"))
        except KafkaException as e:
            err = e.args[0]
            if err.fatal():
                self._replace_producer(str(err))
            else:
                self._abort(str(err))
            return 0
        done = self.pending
        self.in_txn, self.pending, self.positions = False, 0, {}
        return done

    def _abort(self, why: str) -> None:
        """Abort the transaction and rewind every assigned partition to the group's committed offset."""
        from confluent_kafka import KafkaException

        self._note("abortable", why)
        self.aborted += 1
        try:
            self.producer.abort_transaction(self.timeout_s)
        except KafkaException as e:
            if not e.args[0].fatal():
                raise
            self._replace_producer(str(e.args[0]))
            return
        self._rewind()

    def _replace_producer(self, why: str) -> None:
        """A fatal error: this producer is done. A new one with the same transactional id fences it
        (init_transactions aborts whatever it left open) and the consumer rewinds."""
        from confluent_kafka import Producer

        self._note("fatal", f"fatal, producer replaced: {why}")
        if self.producers >= MAX_PRODUCERS:
            raise ClientError(f"confluent-kafka exactly-once copy: {self.producers} producers failed; last: {why}")
        self.producer.purge()
        self.producer = Producer(self.producer_config)
        self.producers += 1
        self.producer.init_transactions(self.timeout_s)
        self._rewind()

    def _rewind(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.in_txn, self.pending, self.positions = False, 0, {}
        assigned = self.consumer.assignment()
        for tp in self.consumer.committed(assigned, self.timeout_s) if assigned else []:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

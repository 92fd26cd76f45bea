"""confluent-kafka (librdkafka), in process: transactions, plain produce, a read_committed consumer, a copier,
committed offsets, a group member, admin, paced transactions, a background producer for failover tests, and an
exactly-once consume-transform-produce loop written as an application would write it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txnguard.testing.clients.base import (
    DEFAULT_TIMEOUT_S,
    AckHook,
    ClientError,
    ConsumedRecord,
    CopiedTransaction,
    CopyResult,
    GroupMember,
    PacedResult,
    PartitionDescription,
    TopicDescription,
    batch_bounds,
    copy_of,
    fresh_group_id,
    no_ack,
    paced_values,
    partitions_of,
    per_partition,
    wait_led,
)


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

        wanted = partitions_of(bootstrap_servers, topic, partitions)
        consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": fresh_group_id(), "enable.auto.commit": False,
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
                first, after = batch_bounds((r.partition, r.offset) for r in batch)
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
                transactions.append(CopiedTransaction(not abort_next, per_partition(r.partition for r in batch)))
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
                [TopicPartition(topic, p) for p in partitions_of(bootstrap_servers, topic, partitions)], timeout_s)
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

        wait_led(led, name, partitions, timeout_s, "confluent-kafka create_topics")

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

    def paced_transactions(
        self, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
        partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
        settings: dict[str, Any] | None = None,
    ) -> PacedResult:
        """PacedClient.paced_transactions; `settings` are librdkafka properties."""
        from confluent_kafka import KafkaError, KafkaException, Producer

        ack = on_ack or no_ack
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
                        raise ClientError(f"confluent-kafka: record {i} of transaction {t} not delivered in "
                                          f"{timeout_s}s")
                    if failed:
                        raise KafkaException(failed[0])
                    ack(t, i)
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


class ConfluentGroupMember(GroupMember):
    name = "confluent-kafka"

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap_servers, "group.id": self.group_id,
            "auto.offset.reset": "earliest", "enable.auto.commit": True,
            "auto.commit.interval.ms": self.AUTO_COMMIT_MS, "session.timeout.ms": self.SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": self.HEARTBEAT_MS, "max.poll.interval.ms": self.MAX_POLL_INTERVAL_MS,
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


@dataclass(frozen=True)
class ExactlyOnceCopy:
    copied: int  # input records whose copies were committed together with their offsets
    transactions: int  # committed transactions
    aborted: int  # transactions aborted after an abortable error or a rebalance, then redone
    errors: list[str]  # every error the loop handled (retried or aborted), for the report
    producers: int = 1  # producer instances used: a fatal error (e.g. fenced) replaces the producer
    # What the application saw, when: (wall clock s, kind, text). Errors: "retriable" (a commit retried),
    # "abortable" (the transaction aborted and redone), "fatal" (the producer replaced), "delivery",
    # "hung" (send_offsets_to_transaction blocked past the watch: the producer abandoned and replaced); and
    # "committed" after each commit, its text the input records copied so far.
    timeline: list[tuple[float, str, str]] = field(default_factory=list)


def confluent_exactly_once_copy(
    bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int, *,
    commit_every: int = 500, timeout_s: float = 240.0, progress: Callable[[int], None] | None = None,
    producer_config: dict[str, Any] | None = None, watch_send_offsets_s: float | None = None,
    deadline_s: float | None = None, trace: str | None = None,
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
    Stops once `count` input records were committed; `progress(copied)` runs after each commit. `timeout_s`
    bounds each call to the client and, unless `deadline_s` is given, the whole copy (math.inf: no bound, for a
    caller that feeds the input itself and watches the progress).
    `producer_config` adds to the producer's settings (e.g. {"debug": "eos,broker"} to see librdkafka's side).

    `watch_send_offsets_s` routes around librdkafka #5511/#5456 (open in 2.16.0): once the broker cached as
    the group's coordinator leaves the Metadata (a broker restarted in ZooKeeper mode, a fenced KRaft broker),
    send_offsets_to_transaction can block forever, past its own timeout. Set, the call runs in a thread with
    that timeout; if it has not returned `watch_send_offsets_s` later, the loop notes "hung", abandons the
    producer (kept referenced: destroying a stuck handle blocks too) and carries on with a new one, which fences
    it, as after a fatal error. None: the call blocks as an application's would.

    `trace`: a file the loop appends a line to before each call that may block and at each timeline event, as
    it happens, so that a caller can say where a loop that stopped moving is (its result never comes then).
    """
    loop = _ExactlyOnceLoop(bootstrap_servers, source, sink, transactional_id, group_id, timeout_s,
                            producer_config or {}, watch_send_offsets_s, trace)
    return loop.run(count, commit_every, time.monotonic() + (timeout_s if deadline_s is None else deadline_s),
                    progress or (lambda _n: None))


MAX_PRODUCERS = 3
MAX_ABANDONED = 6  # producers abandoned in send_offsets_to_transaction (librdkafka #5511): one per broker restart
SEND_OFFSETS_TIMEOUT_S = 30.0  # the call's own timeout when watched (a coordinator move takes seconds)


class _ExactlyOnceLoop:
    def __init__(self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str,
                 timeout_s: float, producer_config: dict[str, Any] | None = None,
                 watch_send_offsets_s: float | None = None, trace: str | None = None) -> None:
        from confluent_kafka import Consumer, Producer

        self.source, self.sink, self.timeout_s = source, sink, timeout_s
        self.watch_send_offsets_s = watch_send_offsets_s
        self.abandoned: list[Any] = []  # stuck producers: never destroyed (rd_kafka_destroy would block)
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
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115 - the loop's lifetime

    def _trace(self, kind: str, text: str) -> None:
        if self.trace is not None:
            self.trace.write(f"{time.strftime('%H:%M:%S')} {kind}: {text}\n")

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._note("delivery", f"delivery: {err}")

    def run(self, count: int, commit_every: int, deadline: float, progress: Callable[[int], None]) -> ExactlyOnceCopy:
        copied = transactions = 0
        try:
            self._trace("calling", "init_transactions")
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
                        self._trace("committed", str(copied))
                        progress(copied)
        finally:
            self.consumer.close()
            if self.trace is not None:
                self.trace.close()
        return ExactlyOnceCopy(copied, transactions, self.aborted, self.errors, self.producers, self.timeline)

    def _note(self, kind: str, text: str) -> None:
        self.errors.append(text)
        self.timeline.append((time.time(), kind, text))
        self._trace(kind, text)

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
            offsets = [TopicPartition(self.source, p, o) for p, o in self.positions.items()]
            if not self._send_offsets(offsets, self.consumer.consumer_group_metadata()):
                self._abandon_producer()
                return 0
            self._trace("calling", "commit_transaction")
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

    def _send_offsets(self, offsets: list[Any], group_metadata: Any) -> bool:
        """send_offsets_to_transaction; False if it is watched and did not return in time (librdkafka #5511).
        Its errors are raised here, as an unwatched call's."""
        self._trace("calling", "send_offsets_to_transaction")
        if self.watch_send_offsets_s is None:
            self.producer.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s)
            return True
        producer, timeout = self.producer, min(self.timeout_s, SEND_OFFSETS_TIMEOUT_S)
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, group_metadata, timeout)
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - handed to the loop's thread
                outcome.append(e)

        worker = threading.Thread(target=call, name="send-offsets", daemon=True)
        worker.start()
        worker.join(timeout + self.watch_send_offsets_s)
        if not outcome:
            self._note("hung", f"send_offsets_to_transaction did not return within "
                               f"{timeout + self.watch_send_offsets_s:.0f} s (its timeout {timeout:.0f} s): "
                               f"librdkafka #5511/#5456")
            return False
        if outcome[0] is not None:
            raise outcome[0]
        return True

    def _abandon_producer(self) -> None:
        """A producer stuck in librdkafka: leave it (referenced, never destroyed) and go on with a new one."""
        if len(self.abandoned) >= MAX_ABANDONED:
            raise ClientError(f"confluent-kafka exactly-once copy: {len(self.abandoned)} producers abandoned, "
                              f"each stuck in send_offsets_to_transaction")
        self.abandoned.append(self.producer)
        self._fresh_producer()

    def _abort(self, why: str) -> None:
        """Abort the transaction and rewind every assigned partition to the group's committed offset."""
        from confluent_kafka import KafkaException

        self._note("abortable", why)
        self.aborted += 1
        try:
            self._trace("calling", "abort_transaction")
            self.producer.abort_transaction(self.timeout_s)
        except KafkaException as e:
            if not e.args[0].fatal():
                raise
            self._replace_producer(str(e.args[0]))
            return
        self._rewind()

    def _replace_producer(self, why: str) -> None:
        """A fatal error: this producer is done; a new one takes over."""
        self._note("fatal", f"fatal, producer replaced: {why}")
        if self.producers - len(self.abandoned) >= MAX_PRODUCERS:
            raise ClientError(f"confluent-kafka exactly-once copy: {self.producers} producers failed; last: {why}")
        self.producer.purge()
        self._fresh_producer()

    def _fresh_producer(self) -> None:
        """A new producer with the same transactional id: it fences the old one (init_transactions aborts
        whatever that left open), and the consumer rewinds to the group's committed offsets."""
        from confluent_kafka import Producer

        self.producer = Producer(self.producer_config)
        self.producers += 1
        self._trace("calling", f"init_transactions (producer {self.producers})")
        self.producer.init_transactions(self.timeout_s)
        self._rewind()

    def _rewind(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.in_txn, self.pending, self.positions = False, 0, {}
        assigned = self.consumer.assignment()
        self._trace("calling", "consumer.committed (rewind)")
        for tp in self.consumer.committed(assigned, self.timeout_s) if assigned else []:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

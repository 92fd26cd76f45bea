"""kafka-python, in process: transactions, plain produce, a copier, committed offsets, a group member, admin,
and paced transactions."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
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
    bounded,
    copy_of,
    no_ack,
    paced_values,
    partitions_of,
    per_partition,
)


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
            bounded(end, timeout_s, f"kafka-python {'commit' if commit else 'abort'}_transaction")
        finally:
            producer.close(timeout=10)

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        from kafka import KafkaConsumer, TopicPartition

        tps = [TopicPartition(topic, p) for p in partitions_of(bootstrap_servers, topic, partitions)]
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
                first, after = batch_bounds((p, r.offset) for p, r in batch)
                producer.begin_transaction()
                futures = [producer.send(sink, value=copy_of(r.value), partition=p) for p, r in batch]
                producer.flush(timeout=timeout_s)
                for f in futures:
                    f.get(timeout=timeout_s)
                offsets = {TopicPartition(source, p): OffsetAndMetadata(o, "", -1) for p, o in after.items()}
                group = consumer.group_metadata()
                bounded(functools.partial(producer.send_offsets_to_transaction, offsets, group), timeout_s,
                         "kafka-python send_offsets_to_transaction")
                if abort_next:
                    bounded(producer.abort_transaction, timeout_s, "kafka-python abort_transaction")
                    for p, o in first.items():
                        consumer.seek(TopicPartition(source, p), o)
                else:
                    bounded(producer.commit_transaction, timeout_s, "kafka-python commit_transaction")
                    done += len(batch)
                transactions.append(CopiedTransaction(not abort_next, per_partition(p for p, _ in batch)))
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
                    for p in partitions_of(bootstrap_servers, topic, partitions)}
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

    def paced_transactions(
        self, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
        partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
        settings: dict[str, Any] | None = None,
    ) -> PacedResult:
        """PacedClient.paced_transactions; `settings` are KafkaProducer keyword arguments."""
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        ack = on_ack or no_ack
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
                    raise ClientError(f"kafka-python: {t}/{transactions} transactions within {timeout_s:.0f}s; "
                                      f"{errors}")
                values = paced_values(transactional_id, t, per_transaction)
                try:
                    producer.begin_transaction()
                    for i, v in enumerate(values):
                        producer.send(topic, value=v, partition=partition).get(timeout=timeout_s)
                        ack(t, i)
                        time.sleep(gap_s)
                    bounded(producer.commit_transaction, timeout_s, "kafka-python commit_transaction")
                except KafkaError as e:
                    manager = getattr(producer, "_transaction_manager", None)
                    if manager is not None and manager.has_fatal_error():
                        raise ClientError(f"kafka-python fatal error in transaction {t}: {e!r}") from e
                    errors.append(repr(e))
                    bounded(producer.abort_transaction, timeout_s, "kafka-python abort_transaction")
                    continue
                committed.extend(values)
                t += 1
        finally:
            producer.close(timeout=10)
        return PacedResult(committed, len(errors), errors)


class KafkaPythonGroupMember(GroupMember):
    name = "kafka-python"
    JOIN_METADATA_S = 30.0
    # Polls of 1 s, not 0.2: each poll bounds kafka-python's join_group, and a join that times out while its
    # JoinGroup/SyncGroup are in flight can leave the member stable but without heartbeats (kafka-python PR
    # #2617's race), so the coordinator drops it and it never learns: in a gate run under load the first member
    # kept all four partitions while the second was given them too.
    POLL_S = 1.0

    def _consume(self) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, group_id=self.group_id,
            auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=self.AUTO_COMMIT_MS,
            session_timeout_ms=self.SESSION_TIMEOUT_MS, heartbeat_interval_ms=self.HEARTBEAT_MS,
            max_poll_interval_ms=self.MAX_POLL_INTERVAL_MS,
        )
        try:
            # The topic's partitions known before joining: a kafka-python 3.0.12 leader whose own metadata does
            # not list them yet when the group forms assigns nothing ("No partition metadata for topic") and, in
            # a gate run, did not rejoin within 45 s (a client race; the topic was already known to every broker).
            deadline = time.monotonic() + self.JOIN_METADATA_S
            while not consumer.partitions_for_topic(self.topic) and time.monotonic() < deadline:
                time.sleep(0.1)
            consumer.subscribe([self.topic])
            while not self._stopping.is_set():
                polled = consumer.poll(timeout_ms=int(self.POLL_S * 1000))
                self._seen((tp.partition for tp in consumer.assignment()),
                           [ConsumedRecord(tp.partition, r.offset, r.value)
                            for tp, records in polled.items() for r in records])
        finally:
            consumer.close()

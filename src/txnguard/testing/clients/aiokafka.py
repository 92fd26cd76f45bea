"""aiokafka, in process (each call runs its own event loop, so callers stay synchronous): transactions, plain
produce, a read_committed consumer, a copier, committed offsets, a group member, admin, paced transactions."""

from __future__ import annotations

import asyncio
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
    copy_of,
    no_ack,
    paced_values,
    partitions_of,
    per_partition,
)


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
        wanted = partitions_of(bootstrap_servers, topic, partitions)

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
                    first, after = batch_bounds((p, r.offset) for p, r in batch)
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
                    transactions.append(CopiedTransaction(not abort_next, per_partition(p for p, _ in batch)))
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
        wanted = partitions_of(bootstrap_servers, topic, partitions)

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

    def paced_transactions(
        self, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
        partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
        settings: dict[str, Any] | None = None,
    ) -> PacedResult:
        """PacedClient.paced_transactions; aiokafka takes no `settings`."""
        if settings:
            raise ValueError(f"no producer settings for {self.name}'s paced transactions")
        ack = on_ack or no_ack

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
                            ack(t, i)
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
            max_poll_interval_ms=self.MAX_POLL_INTERVAL_MS,
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

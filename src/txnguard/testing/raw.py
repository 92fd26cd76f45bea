"""Speak the Kafka protocol directly, one request at a time, over a blocking socket.

Tests use this to create exactly the request sequences that real clients only
produce by accident (a transactional write to a partition never added, a late
write after EndTxn, two producer ids in one Produce). It has no retries and no
cleverness: what you ask for is what goes on the wire, and what comes back is
kio's decoded response.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import itertools
import socket
import struct
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i64

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.schemas import encode_request

# Attribute bits of a v2 record batch (DefaultRecordBatch.java).
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20


class RawProtocolError(RuntimeError):
    """The peer closed the connection, answered something we could not decode, or answered an error (its
    `error_code`, when the answer named one)."""

    def __init__(self, message: str, error_code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


def build_batch(
    values: Sequence[bytes],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    keys: Sequence[bytes | None] | None = None,
    timestamp: datetime.datetime | None = None,
) -> bytes:
    """Encode one uncompressed v2 record batch with kio's own batch writer.

    `timestamp` (default now) is what the broker keeps as the producer's last
    timestamp; find-hanging compares it with its --max-transaction-timeout.
    """
    now = timestamp or datetime.datetime.now(datetime.UTC)
    keys = keys if keys is not None else [None] * len(values)
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=now,  # type: ignore[arg-type]  # kio's phantom type of a tz-aware datetime
            offset=i64(i),
            key=k,
            value=v,
            headers=(),
        )
        for i, (k, v) in enumerate(zip(keys, values, strict=True))
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch),
            base_sequence=i32(base_sequence),
            records=records,
            attributes=i16(TRANSACTIONAL_BIT if transactional else 0),
        ),
    )
    return buf.getvalue()


def _schema_module(api_key: int, version: int) -> ModuleType:
    return sys.modules[load_request_schema(api_key, version).__module__]


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


@dataclass
class ProducerIdentity:
    producer_id: int
    producer_epoch: int


class RawClient:
    """One blocking connection to one broker."""

    def __init__(self, host: str, port: int, *, client_id: str = "txnguard-raw", timeout: float = 15.0,
                 sasl: tuple[str, str] | None = None):
        self.host, self.port = host, port
        self.client_id = client_id
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._correlation = itertools.count(1)
        if sasl is not None:
            try:
                self.authenticate(*sasl)
            except BaseException:
                self.close()
                raise

    def authenticate(self, username: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
        """SaslHandshake v1 + SaslAuthenticate v2 (SCRAM through scramp, as the proxy's own client does)."""
        import scramp

        hs = self.request(_schema_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest(mechanism=mechanism))
        if hs.error_code != ErrorCode.none:
            raise RawProtocolError(f"SaslHandshake {mechanism}: {hs.error_code.name}")

        def step(data: bytes) -> bytes:
            r = self.request(_schema_module(ApiKey.SASL_AUTHENTICATE, 2).SaslAuthenticateRequest(auth_bytes=data))
            if r.error_code != ErrorCode.none:
                raise RawProtocolError(f"SaslAuthenticate as {username}: {r.error_code.name} {r.error_message}")
            return bytes(r.auth_bytes)

        scram = scramp.ScramClient([mechanism], username, password)
        scram.set_server_first(step(scram.get_client_first().encode()).decode())
        scram.set_server_final(step(scram.get_client_final().encode()).decode())

    @classmethod
    def connect(cls, address: str, **kw: Any) -> RawClient:
        host, _, port = address.rpartition(":")
        return cls(host, int(port), **kw)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- framing ---------------------------------------------------------------

    def encode(self, payload: Any, correlation_id: int) -> bytes:
        return encode_request(payload, correlation_id, self.client_id)

    def send_raw(self, frame: bytes) -> None:
        self._sock.sendall(frame)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._recv_exact(4))
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise RawProtocolError(f"{self.host}:{self.port} closed the connection")
            chunks += chunk
        return bytes(chunks)

    def request(self, payload: Any, *, expect_response: bool = True) -> Any:
        """Send one request and return kio's decoded response body."""
        correlation_id = next(self._correlation)
        self.send_raw(self.encode(payload, correlation_id))
        if not expect_response:
            return None
        frame = self.read_frame()
        response_cls = load_response_schema(payload.__api_key__, payload.__version__)
        header, used = entity_reader(response_cls.__header_schema__)(frame, 0)
        if header.correlation_id != correlation_id:
            raise RawProtocolError(f"correlation id {header.correlation_id} != {correlation_id}")
        body, _ = entity_reader(response_cls)(frame, used)
        return body

    # -- typed helpers -----------------------------------------------------------

    def api_versions(self, version: int = 3) -> Any:
        m = _schema_module(ApiKey.API_VERSIONS, version)
        kw = {"client_software_name": "txnguard-raw", "client_software_version": "0"} if version >= 3 else {}
        return self.request(m.ApiVersionsRequest(**kw))

    def metadata(self, topics: Iterable[str] | None = None, version: int = 9) -> Any:
        m = _schema_module(ApiKey.METADATA, version)
        topic_list = None if topics is None else tuple(m.MetadataRequestTopic(name=t) for t in topics)
        return self.request(
            m.MetadataRequest(
                topics=topic_list,
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )

    def find_coordinator(self, key: str, key_type: int = 1, version: int = 3) -> Any:
        """key_type 0 = group, 1 = transaction."""
        m = _schema_module(ApiKey.FIND_COORDINATOR, version)
        return self.request(m.FindCoordinatorRequest(key=key, key_type=i8(key_type)))

    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int = 60000, version: int = 3
    ) -> Any:
        m = _schema_module(ApiKey.INIT_PRODUCER_ID, version)
        return self.request(
            m.InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout=_ms(transaction_timeout_ms)
            )
        )

    def add_partitions_to_txn(
        self, transactional_id: str, producer: ProducerIdentity, partitions: dict[str, Sequence[int]],
        version: int = 3,
    ) -> Any:
        m = _schema_module(ApiKey.ADD_PARTITIONS_TO_TXN, version)
        topics = tuple(
            m.AddPartitionsToTxnTopic(name=t, partitions=tuple(i32(p) for p in ps)) for t, ps in partitions.items()
        )
        return self.request(
            m.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=transactional_id,
                v3_and_below_producer_id=i64(producer.producer_id),
                v3_and_below_producer_epoch=i16(producer.producer_epoch),
                v3_and_below_topics=topics,
            )
        )

    def verify_partitions_in_txn(
        self, transactional_id: str, producer: ProducerIdentity, partitions: dict[str, Sequence[int]],
        version: int = 4,
    ) -> Any:
        """AddPartitionsToTxn v4+ with VerifyOnly: the broker-to-coordinator shape (KIP-890)."""
        m = _schema_module(ApiKey.ADD_PARTITIONS_TO_TXN, version)
        topics = tuple(
            m.AddPartitionsToTxnTopic(name=t, partitions=tuple(i32(p) for p in ps)) for t, ps in partitions.items()
        )
        txn = m.AddPartitionsToTxnTransaction(
            transactional_id=transactional_id,
            producer_id=i64(producer.producer_id),
            producer_epoch=i16(producer.producer_epoch),
            verify_only=True,
            topics=topics,
        )
        return self.request(
            m.AddPartitionsToTxnRequest(
                transactions=(txn,),
                v3_and_below_transactional_id="",
                v3_and_below_producer_id=i64(0),
                v3_and_below_producer_epoch=i16(0),
                v3_and_below_topics=(),
            )
        )

    def add_offsets_to_txn(
        self, transactional_id: str, producer: ProducerIdentity, group_id: str, version: int = 3
    ) -> Any:
        m = _schema_module(ApiKey.ADD_OFFSETS_TO_TXN, version)
        return self.request(
            m.AddOffsetsToTxnRequest(
                transactional_id=transactional_id,
                producer_id=i64(producer.producer_id),
                producer_epoch=i16(producer.producer_epoch),
                group_id=group_id,
            )
        )

    def txn_offset_commit(
        self, transactional_id: str, producer: ProducerIdentity, group_id: str,
        offsets: dict[str, dict[int, int]], version: int = 3,
    ) -> Any:
        m = _schema_module(ApiKey.TXN_OFFSET_COMMIT, version)
        topics = tuple(
            m.TxnOffsetCommitRequestTopic(
                name=t,
                partitions=tuple(
                    m.TxnOffsetCommitRequestPartition(
                        partition_index=i32(p), committed_offset=i64(o), committed_leader_epoch=i32(-1),
                        committed_metadata=None,
                    )
                    for p, o in ps.items()
                ),
            )
            for t, ps in offsets.items()
        )
        kw: dict[str, Any] = {}
        if version >= 3:
            kw = {"generation_id": i32(-1), "member_id": "", "group_instance_id": None}
        return self.request(
            m.TxnOffsetCommitRequest(
                transactional_id=transactional_id, group_id=group_id,
                producer_id=i64(producer.producer_id), producer_epoch=i16(producer.producer_epoch),
                topics=topics, **kw,
            )
        )

    def end_txn(self, transactional_id: str, producer: ProducerIdentity, committed: bool, version: int = 3) -> Any:
        m = _schema_module(ApiKey.END_TXN, version)
        return self.request(
            m.EndTxnRequest(
                transactional_id=transactional_id,
                producer_id=i64(producer.producer_id),
                producer_epoch=i16(producer.producer_epoch),
                committed=committed,
            )
        )

    def produce(
        self, batches: dict[tuple[str, int], bytes], *, transactional_id: str | None = None,
        acks: int = -1, timeout_ms: int = 30000, version: int = 9,
    ) -> Any:
        m = _schema_module(ApiKey.PRODUCE, version)
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), records in batches.items():
            by_topic.setdefault(topic, []).append(m.PartitionProduceData(index=i32(partition), records=records))
        topic_data = tuple(m.TopicProduceData(name=t, partition_data=tuple(ps)) for t, ps in by_topic.items())
        return self.request(
            m.ProduceRequest(
                transactional_id=transactional_id, acks=i16(acks), timeout=_ms(timeout_ms), topic_data=topic_data
            ),
            expect_response=acks != 0,
        )

    def list_offsets(self, topic: str, partition: int, *, read_committed: bool, version: int = 4) -> int:
        """The end offset: the high watermark, or the last stable offset when read_committed."""
        m = _schema_module(2, version)
        resp = self.request(
            m.ListOffsetsRequest(
                replica_id=i32(-1),
                isolation_level=i8(1 if read_committed else 0),
                topics=(
                    m.ListOffsetsTopic(
                        name=topic,
                        partitions=(
                            m.ListOffsetsPartition(partition_index=i32(partition), current_leader_epoch=i32(-1),
                                                   timestamp=i64(-1)),
                        ),
                    ),
                ),
            )
        )
        part = resp.topics[0].partitions[0]
        if part.error_code != ErrorCode.none:
            raise RawProtocolError(f"ListOffsets {topic}-{partition}: {part.error_code.name}", part.error_code)
        return int(part.offset)

    def create_topic(
        self, name: str, partitions: int = 1, replication_factor: int = -1, configs: dict[str, str] | None = None
    ) -> Any:
        """CreateTopics v4; replication factor -1 means the broker's default."""
        m = _schema_module(19, 4)
        topic = m.CreatableTopic(
            name=name, num_partitions=i32(partitions), replication_factor=i16(replication_factor), assignments=(),
            configs=tuple(m.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()),
        )
        resp = self.request(m.CreateTopicsRequest(topics=(topic,), timeout=_ms(30000), validate_only=False))
        err = resp.topics[0].error_code
        if err not in (ErrorCode.none, ErrorCode.topic_already_exists):
            raise RawProtocolError(f"CreateTopics {name}: {err.name}")
        return resp

    def describe_transactions(self, *transactional_ids: str) -> Any:
        m = _schema_module(ApiKey.DESCRIBE_TRANSACTIONS, 0)
        return self.request(m.DescribeTransactionsRequest(transactional_ids=tuple(transactional_ids)))

    def describe_producers(self, topic: str, partitions: Sequence[int]) -> Any:
        m = _schema_module(ApiKey.DESCRIBE_PRODUCERS, 0)
        return self.request(
            m.DescribeProducersRequest(
                topics=(m.TopicRequest(name=topic, partition_indexes=tuple(i32(p) for p in partitions)),)
            )
        )


# -- cluster-level conveniences ------------------------------------------------------------


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def any_broker(bootstrap_servers: str) -> tuple[str, int]:
    return _split(bootstrap_servers.split(",")[0])


def coordinator_for(
    bootstrap_servers: str, key: str, key_type: int = 1, deadline_s: float = 30.0,
    sasl: tuple[str, str] | None = None,
) -> tuple[int, str, int]:
    """(node id, host, port) of the coordinator of a transactional id (key_type 1) or group (0).

    Retries while the coordinator is loading or its internal topic is being created.
    """
    host, port = any_broker(bootstrap_servers)
    end = time.monotonic() + deadline_s
    last: Any = None
    with RawClient(host, port, sasl=sasl) as c:
        while time.monotonic() < end:
            last = c.find_coordinator(key, key_type)
            if last.error_code == ErrorCode.none:
                return int(last.node_id), str(last.host), int(last.port)
            time.sleep(0.2)
    raise RawProtocolError(f"no coordinator for {key!r}: {last.error_code.name if last else 'no answer'}")


def leader_of(bootstrap_servers: str, topic: str, partition: int, deadline_s: float = 10.0) -> tuple[int, str, int]:
    """(node id, host, port) of the partition's leader.

    A Metadata answer can name as leader a broker it does not list: a broker just killed is fenced (left out of
    the brokers) before the controller moves its partitions' leadership. Such an answer is asked again, until
    the leader is a listed broker or `deadline_s` passes.
    """
    host, port = any_broker(bootstrap_servers)
    end = time.monotonic() + deadline_s
    why = f"no leader for {topic}-{partition}"
    with RawClient(host, port) as c:
        while True:
            md = c.metadata([topic])
            brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in md.brokers}
            leaders = [int(p.leader_id) for t in md.topics for p in t.partitions
                       if int(p.partition_index) == partition and int(p.leader_id) >= 0]
            if leaders and leaders[0] in brokers:
                h, pt = brokers[leaders[0]]
                return leaders[0], h, pt
            if leaders:
                why = f"{topic}-{partition}'s leader {leaders[0]} is not among the listed brokers {sorted(brokers)}"
            if time.monotonic() >= end:
                raise RawProtocolError(why)
            time.sleep(0.2)


def partition_count(bootstrap_servers: str, topic: str) -> int:
    host, port = any_broker(bootstrap_servers)
    with RawClient(host, port) as c:
        md = c.metadata([topic])
    return len(md.topics[0].partitions)


def _create_at_controller(addresses: list[str], name: str, partitions: int, replication_factor: int,
                          configs: dict[str, str] | None) -> None:
    for i, address in enumerate(addresses):
        with RawClient(*_split(address)) as c:
            try:
                c.create_topic(name, partitions, replication_factor, configs)
                return
            except RawProtocolError as e:
                if "not_controller" not in str(e) or i == len(addresses) - 1:
                    raise


def create_topic(
    bootstrap_servers: str, name: str, partitions: int = 1, replication_factor: int = -1,
    configs: dict[str, str] | None = None, deadline_s: float = 30.0,
) -> None:
    """Create a topic and wait until every partition has a leader that every broker knows.

    Asked of the controller: a KRaft broker forwards CreateTopics to it, a ZooKeeper-mode broker answers
    NOT_CONTROLLER unless it is the controller itself: each address is tried until one is (the addresses
    given are where brokers really listen, which is not what a sidecar layout's Metadata advertises)."""
    _create_at_controller(bootstrap_servers.split(","), name, partitions, replication_factor, configs)
    end = time.monotonic() + deadline_s
    for address in bootstrap_servers.split(","):
        h, p = _split(address)
        with RawClient(h, p) as c:
            while True:
                md = c.metadata([name])
                t = md.topics[0]
                if t.error_code == ErrorCode.none and len(t.partitions) == partitions and all(
                    int(x.leader_id) >= 0 for x in t.partitions
                ):
                    break
                if time.monotonic() > end:
                    raise RawProtocolError(f"topic {name} has no leaders on {address} after {deadline_s}s")
                time.sleep(0.1)
    # Metadata names a leader before that broker's replica manager leads the partition (KRaft publishes the
    # metadata cache first): until then a Produce gets NOT_LEADER_OR_FOLLOWER, which real clients retry and
    # the raw scenario actors do not. ListOffsets on the leader answers without error once it leads.
    # Asked through the bootstrap addresses (brokers may advertise a sidecar not running yet): the leader's
    # answer is the one without an error.
    waiting = {int(x.partition_index) for x in md.topics[0].partitions}
    while waiting:
        for address in bootstrap_servers.split(","):
            with RawClient(*_split(address)) as c:
                for partition in list(waiting):
                    with contextlib.suppress(RawProtocolError):
                        c.list_offsets(name, partition, read_committed=False)
                        waiting.discard(partition)
        if waiting and time.monotonic() > end:
            raise RawProtocolError(f"topic {name}: no leader answers for partitions {sorted(waiting)}")
        if waiting:
            time.sleep(0.05)


def move_leader(bootstrap_servers: str, topic: str, partition: int, to: int, deadline_s: float = 30.0) -> int:
    """Move the partition's leadership to replica `to`, the brokers staying up: AlterPartitionReassignments
    puts `to` first in the same replica set (its preferred replica; no data moves), then ElectLeaders
    (PREFERRED) elects it, as kafka-reassign-partitions.sh and kafka-leader-election.sh do. Returns the
    leader it had. Waits until Metadata names `to` as the leader (`bootstrap_servers`: where the brokers
    really listen; a ZooKeeper-mode broker answers NOT_CONTROLLER unless it is the controller, so each is
    tried in turn)."""
    host, port = any_broker(bootstrap_servers)
    with RawClient(host, port) as c:
        md = c.metadata([topic])
    [part] = [p for t in md.topics for p in t.partitions if int(p.partition_index) == partition]
    before, replicas = int(part.leader_id), [int(r) for r in part.replica_nodes]
    if to not in replicas:
        raise RawProtocolError(f"{topic}-{partition}: broker {to} is not among its replicas {replicas}")
    order = (to, *(r for r in replicas if r != to))
    ar, el = _schema_module(45, 0), _schema_module(43, 1)
    reassign = ar.AlterPartitionReassignmentsRequest(timeout=_ms(30000), topics=(ar.ReassignableTopic(
        name=topic, partitions=(ar.ReassignablePartition(partition_index=i32(partition),
                                                         replicas=tuple(i32(r) for r in order)),)),))
    elect = el.ElectLeadersRequest(election_type=i8(0), timeout=_ms(30000), topic_partitions=(
        el.TopicPartitions(topic=topic, partitions=(i32(partition),)),))
    end = time.monotonic() + deadline_s
    addresses = bootstrap_servers.split(",")
    why = "no broker answered"
    while time.monotonic() < end:
        for address in addresses:
            with RawClient(*_split(address)) as c:
                r = c.request(reassign)
                codes = [r.error_code] + [p.error_code for t in r.responses for p in t.partitions]
                if ErrorCode.not_controller in codes:
                    continue
                if any(code != ErrorCode.none for code in codes):
                    raise RawProtocolError(f"AlterPartitionReassignments {topic}-{partition}: "
                                           f"{[code.name for code in codes]}")
                # The order is the controller's once the reassignment is recorded; then the election.
                e = c.request(elect)
                codes = [e.error_code] + [p.error_code for t in e.replica_election_results
                                          for p in t.partition_result]
                if ErrorCode.not_controller in codes:
                    continue
                bad = [code for code in codes if code not in (ErrorCode.none, ErrorCode.election_not_needed)]
                if bad:
                    why = f"ElectLeaders {topic}-{partition}: {[code.name for code in bad]}"
                    break  # e.g. PREFERRED_LEADER_NOT_AVAILABLE while `to` catches up: asked again
                if leader_of(bootstrap_servers, topic, partition)[0] == to:
                    return before
                why = f"{topic}-{partition}'s leader is not {to} yet"
        time.sleep(0.1)
    raise RawProtocolError(f"leadership of {topic}-{partition} did not move to {to} within {deadline_s:.0f}s: {why}")

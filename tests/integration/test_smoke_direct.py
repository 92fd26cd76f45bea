"""Smoke tests of real clients straight against real brokers: no proxy anywhere.

They show the harness and the client adapters work, and fix what "correct" and
"broken" look like before the proxy sits in between.

Coverage:
* Python transactional clients: the full 3x3 cross product of broker version
  (3.5.2, 3.9.2, 4.4.0) and client (kafka-python, confluent-kafka, aiokafka); in
  every cell all three read_committed consumers (confluent-kafka, kafka-python,
  kcat) read the result.
* kcat plain produce and metadata: broker 4.4.0.
* Java clients, broker 3.5.2: the 3.5.2 TransactionalMessageCopier (5,000 records),
  the 2.8.2 copier (1,000 records, seeded by the 2.8.2 VerifiableProducer), the
  3.5.2 transactional ProducerPerformance, and TransactionsCommand find-hanging.
* Negative control, broker 3.5.2: a transactional write to a partition never added
  to the transaction hangs the partition, and find-hanging reports it.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
from collections.abc import Callable, Sequence

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

BROKER_VERSIONS = ("3.5.2", "3.9.2", "4.4.0")
NameFactory = Callable[[str], str]


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


# -- Python clients: commit, abort, commit; read_committed sees only the commits ------------------


@pytest.mark.parametrize("client_name", list(clients.PYTHON_TRANSACTIONAL_CLIENTS))
@pytest.mark.parametrize("version", BROKER_VERSIONS)
def test_python_client_commit_and_abort(
    kafka_pool: ClusterPool, unique_name: NameFactory, version: str, client_name: str
) -> None:
    cluster = kafka_pool.get(version, 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("txn"))
    client = clients.PYTHON_TRANSACTIONAL_CLIENTS[client_name]
    txn_id = unique_name("tid")
    first, aborted, last = _values("commit1", 3), _values("abort", 4), _values("commit2", 2)

    # The aborted transaction sits between two committed ones, so a consumer has to
    # skip it mid-log rather than just stop early.
    client.run_transaction(bootstrap, topic, txn_id, first, commit=True)
    client.run_transaction(bootstrap, topic, txn_id, aborted, commit=False)
    client.run_transaction(bootstrap, topic, txn_id, last, commit=True)

    # Every record reached the log, aborted ones included, plus one marker per transaction:
    # the read_committed result below is the broker's filtering, not records never sent.
    high_watermark = clients.stable_end_offsets(bootstrap, topic)[0]
    assert high_watermark == len(first) + len(aborted) + len(last) + 3

    for consumer_name, consumer in clients.COMMITTED_CONSUMERS.items():
        got = consumer.consume_committed(bootstrap, topic)
        assert got == first + last, f"{consumer_name} read {got}"


# -- kcat: plain produce and metadata (it has no transactional producer) ------------------------


def test_kcat_produce_and_metadata(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("4.4.0", 1)
    topic = fresh_topic(cluster, unique_name("kcat"), partitions=2)
    kcat = clients.Kcat()
    values = _values("plain", 10)

    kcat.produce(cluster.bootstrap_servers, topic, values[:5], partition=0)
    kcat.produce(cluster.bootstrap_servers, topic, values[5:], partition=1)

    md = kcat.metadata(cluster.bootstrap_servers, topic=topic)
    assert [b["id"] for b in md["brokers"]] == [n.id for n in cluster.nodes]
    (listed,) = md["topics"]
    assert listed["topic"] == topic
    assert sorted(p["partition"] for p in listed["partitions"]) == [0, 1]
    assert clients.stable_end_offsets(cluster.bootstrap_servers, topic) == {0: 5, 1: 5}
    assert kcat.consume_committed(cluster.bootstrap_servers, topic) == values


# -- Java clients through Kafka's own tools --------------------------------------------------------


def _assert_copied_exactly_once(bootstrap: str, output_topic: str, expected: Sequence[bytes]) -> None:
    clients.stable_end_offsets(bootstrap, output_topic)
    out = clients.ConfluentKafkaClient().consume_committed(bootstrap, output_topic)
    assert len(out) == len(expected)
    assert len(set(out)) == len(out), "duplicates in the output"
    assert set(out) == set(expected)


@pytest.mark.java
def test_java_352_copier_exactly_once(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    source = fresh_topic(cluster, unique_name("in"))
    sink = fresh_topic(cluster, unique_name("out"))
    values = _values("record", 5000)
    clients.ConfluentKafkaClient().produce(bootstrap, source, values)
    assert clients.stable_end_offsets(bootstrap, source) == {0: 5000}

    result = clients.java_transactional_copier(
        bootstrap, source, sink, unique_name("tid"), unique_name("group"), max_messages=5000,
        java_version="3.5.2", transaction_size=500,
    )

    assert result.shutdown_complete
    assert result.total_processed == 5000
    assert result.remaining == 0
    _assert_copied_exactly_once(bootstrap, sink, values)
    # Every copier transaction was completed, so nothing it wrote to is hanging (its output
    # and, through TxnOffsetCommit, the offsets topic), even with --max-transaction-timeout 0,
    # which makes every open transaction a candidate. Scoped by topic, not broker: the
    # negative control below leaves a hanging transaction on this shared broker.
    for topic in (sink, "__consumer_offsets"):
        assert clients.transactions_find_hanging(bootstrap, topic=topic, max_transaction_timeout_minutes=0) == []


@pytest.mark.java
def test_java_282_copier(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    source = fresh_topic(cluster, unique_name("in"))
    sink = fresh_topic(cluster, unique_name("out"))
    seeded = clients.java_verifiable_producer(bootstrap, source, 1000, java_version="2.8.2")
    assert seeded.errors == []
    assert sorted(seeded.acked_values, key=int) == [str(i) for i in range(1000)]

    result = clients.java_transactional_copier(
        bootstrap, source, sink, unique_name("tid"), unique_name("group"), max_messages=1000,
        java_version="2.8.2", transaction_size=100,
    )

    assert result.shutdown_complete
    assert result.total_processed == 1000
    _assert_copied_exactly_once(bootstrap, sink, [v.encode() for v in seeded.acked_values])
    assert clients.transactions_find_hanging(bootstrap, topic=sink, max_transaction_timeout_minutes=0) == []


@pytest.mark.java
def test_java_352_transactional_producer_performance(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    topic = fresh_topic(cluster, unique_name("perf"))

    perf = clients.java_producer_performance(
        cluster.bootstrap_servers, topic, 2000, java_version="3.5.2", record_size=50,
        transactional_id=unique_name("tid"), transaction_duration_ms=100,
    )

    assert perf.records == 2000
    assert perf.records_per_sec > 0
    assert 0 <= perf.p50_ms <= perf.p99_ms <= perf.max_latency_ms
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert len(clients.Kcat().consume_committed(cluster.bootstrap_servers, topic)) == 2000


# -- negative control: a transactional write the coordinator never heard of -----------------------

# How far back the hanging batch's timestamps are set. find-hanging measures a
# transaction's age from the producer's last timestamp, which the broker takes from
# the batch's max timestamp (ProducerAppendInfo.append -> batch.maxTimestamp() in
# 3.5), i.e. from the client. Backdating by more than the tool's 15-minute default
# makes the transaction look old at once, so the test needs no waiting.
BACKDATE = datetime.timedelta(minutes=30)


def _transactional_batch(values: Sequence[bytes], producer_id: int, epoch: int,
                         timestamp: datetime.datetime) -> bytes:
    """raw.build_batch, but with a chosen record timestamp (build_batch always uses now)."""
    records = tuple(
        Record(attributes=i8(0), timestamp=TZAwareMicros.parse(timestamp), offset=i64(i), key=None, value=v, headers=())
        for i, v in enumerate(values)
    )
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(
        producer_id=i64(producer_id), producer_epoch=i16(epoch), base_sequence=i32(0), records=records,
        attributes=i16(raw.TRANSACTIONAL_BIT),
    ))
    return buf.getvalue()


@pytest.mark.java
def test_negative_control_write_to_unadded_partition_hangs(
    kafka_pool: ClusterPool, unique_name: NameFactory
) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    # A private topic: the hanging transaction blocks read_committed readers of this topic only.
    # It stays for the rest of the session, so other tests scope find-hanging by topic.
    topic = fresh_topic(cluster, unique_name("hang"))
    txn_id = unique_name("tid")
    before, hanging, after = _values("before", 3), _values("hanging", 2), _values("after", 2)

    _, coord_host, coord_port = raw.coordinator_for(bootstrap, txn_id)
    with raw.RawClient(coord_host, coord_port) as coordinator:
        init = coordinator.init_producer_id(txn_id, 60000)
        assert init.error_code == ErrorCode.none
        producer_id, epoch = int(init.producer_id), int(init.producer_epoch)

    _, leader_host, leader_port = raw.leader_of(bootstrap, topic, 0)
    stamp = datetime.datetime.now(datetime.UTC) - BACKDATE
    with raw.RawClient(leader_host, leader_port) as leader:
        _produce_ok(leader, topic, raw.build_batch(before))
        # No AddPartitionsToTxn first: the coordinator never learns of this partition,
        # and a 3.5 broker (no KIP-890 verification) appends the batch anyway.
        _produce_ok(leader, topic, _transactional_batch(hanging, producer_id, epoch, stamp), transactional_id=txn_id)
        _produce_ok(leader, topic, raw.build_batch(after))
        lso = leader.list_offsets(topic, 0, read_committed=True)
        high_watermark = leader.list_offsets(topic, 0, read_committed=False)

    # The LSO is stuck at the start of the hanging batch, below the high watermark.
    assert (lso, high_watermark) == (len(before), len(before) + len(hanging) + len(after))
    # So read_committed consumers stop there: nothing from or after the hanging batch.
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, topic) == before
    assert clients.Kcat().consume_committed(bootstrap, topic) == before
    with pytest.raises(clients.ClientError, match="still below high watermark"):
        clients.stable_end_offsets(bootstrap, topic, timeout_s=1)

    expected = clients.HangingTransaction(
        topic=topic, partition=0, producer_id=producer_id, producer_epoch=epoch, coordinator_epoch=-1,
        start_offset=len(before), last_timestamp_ms=int(stamp.timestamp() * 1000),
        duration_min=int(BACKDATE.total_seconds() // 60),
    )
    # With the tool's default 15-minute threshold, scoped to the topic: exactly this one.
    # (Its age column is whole minutes measured when it runs, so it may read one more.)
    (found,) = clients.transactions_find_hanging(bootstrap, topic=topic)
    assert dataclasses.replace(found, duration_min=0) == dataclasses.replace(expected, duration_min=0)
    assert expected.duration_min <= found.duration_min <= expected.duration_min + 1
    # Scoped to the broker with threshold 0 (the tool accepts it): it is among the hits.
    by_broker = clients.transactions_find_hanging(bootstrap, broker_id=cluster.nodes[0].id,
                                                  max_transaction_timeout_minutes=0)
    assert [h.producer_id for h in by_broker if h.topic == topic] == [producer_id]


def _produce_ok(client: raw.RawClient, topic: str, batch: bytes, transactional_id: str | None = None) -> None:
    resp = client.produce({(topic, 0): batch}, transactional_id=transactional_id)
    (part,) = resp.responses[0].partition_responses
    assert part.error_code == ErrorCode.none, part

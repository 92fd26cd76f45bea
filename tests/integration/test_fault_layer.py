"""The fault layer (txnguard.testing.faults) against a real Kafka 3.5.2 broker: each fault does what it says.

    client ──▶ FaultRelay ──▶ broker

These are the fault layer's own tests (issue 10, deliverable 1); the scenarios that use it build on
them. The held EndTxn is KAFKA-17754's ingredient: a commit that reaches the coordinator after its
client gave up on it and left.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import clients, raw
from txnguard.testing.faults import Action, Direction, Fault, FaultRelay
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.scenarios import TxnActor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2")


@pytest.fixture
def relay(cluster: Cluster) -> Iterator[FaultRelay]:
    node = cluster.nodes[0]
    with FaultRelay((node.host, node.port)) as r:
        yield r


def _client(relay: FaultRelay, timeout: float = 15.0) -> raw.RawClient:
    return raw.RawClient(relay.host, relay.port, timeout=timeout)


def _log_end(cluster: Cluster, topic: str) -> int:
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:
        return c.list_offsets(topic, 0, read_committed=False)


def test_a_delayed_request_arrives_late_and_the_next_one_waits_behind_it(relay: FaultRelay) -> None:
    relay.add(Fault(Action.DELAY, api_key=ApiKey.METADATA, delay_s=0.6))
    with _client(relay) as c:
        # Both requests on the wire at once: the second must not overtake the delayed first.
        started = time.monotonic()
        c.send_raw(c.encode(raw._schema_module(ApiKey.METADATA, 9).MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False), 1))
        c.send_raw(c.encode(raw._schema_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest(
            client_software_name="t", client_software_version="0"), 2))
        first, second = c.read_frame(), c.read_frame()
        elapsed = time.monotonic() - started
    assert [int.from_bytes(f[:4], "big") for f in (first, second)] == [1, 2]
    assert elapsed >= 0.6
    assert relay.seen.count(ApiKey.METADATA, action=Action.DELAY) == 1


def test_a_held_end_txn_reaches_the_coordinator_after_its_client_gave_up_and_left(
    cluster: Cluster, relay: FaultRelay,
) -> None:
    topic = fresh_topic(cluster, f"held-{uuid.uuid4().hex[:8]}")
    actor = TxnActor(cluster.bootstrap_servers, f"held-tid-{uuid.uuid4().hex[:8]}")
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
    assert actor.produce(topic, 0, [b"t1"]).error_code == ErrorCode.none
    assert actor.producer is not None
    hold = relay.add(Fault(Action.HOLD, api_key=ApiKey.END_TXN))
    with _client(relay, timeout=2.0) as c, pytest.raises(socket.timeout):
        c.end_txn(actor.transactional_id, actor.producer, committed=True)  # the client's request timeout
    # The client left; the commit is still in the network: the transaction is open, nothing readable.
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:
        (before,) = c.describe_transactions(actor.transactional_id).transaction_states
    assert str(before.transaction_state) == "Ongoing"
    relay.release(hold)
    deadline = time.monotonic() + 20
    while True:
        with raw.RawClient.connect(cluster.bootstrap_servers) as c:
            (after,) = c.describe_transactions(actor.transactional_id).transaction_states
        if str(after.transaction_state) == "CompleteCommit" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert str(after.transaction_state) == "CompleteCommit"
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"t1"]
    assert relay.seen.count(ApiKey.END_TXN, action=Action.HOLD) == 1


def test_a_dropped_request_never_reaches_the_broker(cluster: Cluster, relay: FaultRelay) -> None:
    topic = fresh_topic(cluster, f"drop-{uuid.uuid4().hex[:8]}")
    relay.add(Fault(Action.DROP, api_key=ApiKey.PRODUCE))
    with _client(relay, timeout=2.0) as c, pytest.raises(socket.timeout):
        c.produce({(topic, 0): raw.build_batch([b"lost"])})
    assert _log_end(cluster, topic) == 0


def test_a_duplicated_request_is_processed_twice_and_answered_once(cluster: Cluster, relay: FaultRelay) -> None:
    topic = fresh_topic(cluster, f"dup-{uuid.uuid4().hex[:8]}")
    relay.add(Fault(Action.DUPLICATE, api_key=ApiKey.PRODUCE))
    with _client(relay) as c:
        first = c.produce({(topic, 0): raw.build_batch([b"twice"])})
        second = c.produce({(topic, 0): raw.build_batch([b"once"])})  # answered as itself, not as the copy
    offsets = [int(r.partition_responses[0].base_offset) for r in (first.responses[0], second.responses[0])]
    assert offsets == [0, 2]  # the broker appended the duplicate at 1
    assert _log_end(cluster, topic) == 3


def test_a_reset_aborts_the_connection(relay: FaultRelay) -> None:
    relay.add(Fault(Action.RESET, api_key=ApiKey.METADATA))
    with _client(relay, timeout=5.0) as c, pytest.raises((ConnectionError, raw.RawProtocolError)):
        c.metadata()


def test_bandwidth_is_cut_in_the_chosen_direction(cluster: Cluster, relay: FaultRelay) -> None:
    topic = fresh_topic(cluster, f"slow-{uuid.uuid4().hex[:8]}")
    relay.add(Fault(Action.BANDWIDTH, api_key=ApiKey.PRODUCE, bytes_per_s=256 * 1024, times=None))
    batch = raw.build_batch([bytes(64 * 1024)] * 8)  # 512 KiB at 256 KiB/s
    with _client(relay) as c:
        started = time.monotonic()
        c.produce({(topic, 0): batch})
        elapsed = time.monotonic() - started
    assert elapsed >= 1.5
    assert relay.seen.count(ApiKey.PRODUCE, action=Action.BANDWIDTH) == 1


def test_a_probabilistic_fault_is_the_same_for_the_same_seed(relay: FaultRelay) -> None:
    def run(seed: int) -> list[Action | None]:
        relay.clear()
        relay.seen.frames.clear()
        relay.add(Fault(Action.DELAY, api_key=ApiKey.API_VERSIONS, delay_s=0.0, times=None, probability=0.5, seed=seed))
        with _client(relay) as c:
            for _ in range(12):
                c.api_versions()
        return [a for d, k, _, a in relay.seen.frames if k == ApiKey.API_VERSIONS and d is Direction.REQUEST]

    first, again = run(7), run(7)
    assert first == again and Action.DELAY in first and None in first

"""J3, KAFKA-17754 reproduced directly against Kafka (the control that shows the anomaly is real).

An old client (no epoch bump per transaction: transaction version 1) keeps one producer id and epoch
for all its transactions. A commit that arrives late therefore lands in whichever transaction is
open then:

    client ─EndTxn(COMMIT) T1─▶ FaultRelay (held) ···················┐
    client … request timeout, leaves; retries EndTxn(COMMIT) T1 ─▶ C  ✓ T1 committed
    client ─AddPartitionsToTxn P0, P1 (T2)─▶ C ✓   ─Produce t2-a─▶ P0 ✓
                                         the held EndTxn(COMMIT) ◀──┘ released: C commits T2, with t2-a only
    client ─Produce t2-b─▶ P1          3.5.2: appended, outside any transaction the coordinator knows
                                        3.9.2: refused by its own verification (the transaction ended)
    client ─EndTxn(COMMIT) T2─▶ C       answered as a retry of the commit that already happened

Oracle (Jepsen's): the client saw T2 committed, so t2-a and t2-b are both visible at read_committed,
or (had it been told so) neither. 3.5.2: t2-b is never visible (a lost write) and P1's last stable
offset hangs on it. 3.9.2: the client's t2-b was refused, so it aborts T2, yet t2-a is visible (an
aborted read). The raw actors make each run deterministic; the anomaly is asserted in every run.

No step waits on a clock: the raw actor takes each step after the previous one was answered, the held
EndTxn is released once T2 is open at the coordinator (asserted), and the state is read until the
released commit has taken effect. So the direct control reproduces in every run, on either version.

Through the proxy, with real clients (the Java client 3.5.2 in a driver of ours, confluent-kafka):
client -> gateway -> FaultRelay -> broker, the same hold and release (txnguard.testing.kafka_17754).
The defence (verification/in_doubt.py) holds T2's AddPartitionsToTxn while T1's EndTxn is unanswered,
keeps the broker connection the client left until that EndTxn's answer, and lets T2 start only then:
the late commit lands in T1 (a retry of a finished commit) and T2 is whole. The same run with the
defence off is the control: the late commit ends T2 early and T2's last write is lost (hanging).
The release is ordered by events, not by a timer (run_once): with the defence on, once the proxy holds
T2's first request; with it off, once the client was told both of T2's first writes were acknowledged,
so the late commit always meets T2 open at the coordinator. bench/kafka_17754.py runs both 20 times per
client with a timed release (1 s after T2 began) and reports either outcome.
"""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass, field

import pytest
from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import raw
from txnguard.testing.faults import Action, Fault, FaultRelay
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.kafka_17754 import J3ClientRun, run_once
from txnguard.testing.scenarios import TxnActor, error_name

pytestmark = pytest.mark.integration


@dataclass
class J3Run:
    t1_retry: str = ""
    t2_a: str = ""
    t2_b: str = ""
    t2_end: str = ""
    client_believes_t2: str = ""              # "committed" or "aborted"
    states: list[str] = field(default_factory=list)
    visible: dict[int, list[bytes]] = field(default_factory=dict)   # read_committed, per partition
    last_stable: dict[int, int] = field(default_factory=dict)
    log_end: dict[int, int] = field(default_factory=dict)


def _state(cluster: Cluster, txn_id: str) -> str:
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:
        (s,) = c.describe_transactions(txn_id).transaction_states
    return str(s.transaction_state)


def _read_committed(cluster: Cluster, topic: str, partition: int) -> tuple[list[bytes], int, int]:
    """What a read_committed consumer can see now (without waiting for a last stable offset that may hang)."""
    from confluent_kafka import Consumer, TopicPartition

    with raw.RawClient.connect(cluster.bootstrap_servers) as c:
        stable = c.list_offsets(topic, partition, read_committed=True)
        end = c.list_offsets(topic, partition, read_committed=False)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"j3-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                if not stable or (values and time.monotonic() > deadline - 8):
                    break
                continue
            if msg.error() is None:
                values.append(bytes(msg.value()))
                if msg.offset() + 1 >= stable:
                    break
    finally:
        consumer.close()
    return values, stable, end


def _produce_when_led(actor: TxnActor, topic: str, partition: int, value: bytes) -> int:
    """The first write to a just-created topic on a just-started broker may find no leader yet (6): retry it."""
    deadline = time.monotonic() + 15
    while True:
        code = actor.produce(topic, partition, [value]).error_code
        if code not in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition) \
                or time.monotonic() > deadline:
            return code
        time.sleep(0.2)


def j3_sequence(cluster: Cluster) -> J3Run:
    u = uuid.uuid4().hex[:8]
    topic = fresh_topic(cluster, f"j3-{u}", partitions=2)
    actor = TxnActor(cluster.bootstrap_servers, f"j3-tid-{u}")
    node = cluster.nodes[0]
    run = J3Run()
    with FaultRelay((node.host, node.port)) as relay:
        actor.init()
        assert actor.producer is not None
        # T1
        assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
        assert _produce_when_led(actor, topic, 0, b"t1") == ErrorCode.none
        held = relay.add(Fault(Action.HOLD, api_key=ApiKey.END_TXN))
        with raw.RawClient(relay.host, relay.port, timeout=2.0) as c, pytest.raises(socket.timeout):
            c.end_txn(actor.transactional_id, actor.producer, committed=True)
        run.t1_retry = error_name(actor.end(commit=True))          # the client retries: T1 commits
        run.states.append(_state(cluster, actor.transactional_id))
        # T2, same producer id and epoch (transaction version 1)
        assert actor.add_partitions(topic, 0, 1) == {0: ErrorCode.none, 1: ErrorCode.none}
        run.t2_a = error_name(actor.produce(topic, 0, [b"t2-a"]).error_code)
        run.states.append(_state(cluster, actor.transactional_id))  # T2 open: where the late commit lands
        relay.release(held)                                        # the late commit arrives
        deadline = time.monotonic() + 20
        # Until the late commit has taken effect and its markers are written (PrepareCommit passes).
        while _state(cluster, actor.transactional_id) in ("Ongoing", "PrepareCommit"):
            assert time.monotonic() < deadline, "the released EndTxn never took effect"
            time.sleep(0.2)
        run.states.append(_state(cluster, actor.transactional_id))
        run.t2_b = error_name(actor.produce(topic, 1, [b"t2-b"]).error_code)
        if run.t2_b == "NONE":
            run.t2_end = error_name(actor.end(commit=True))
            run.client_believes_t2 = "committed" if run.t2_end == "NONE" else "aborted"
        else:
            run.t2_end = error_name(actor.end(commit=False))       # an error in T2: the client aborts it
            run.client_believes_t2 = "aborted"
        run.states.append(_state(cluster, actor.transactional_id))
    for p in (0, 1):
        run.visible[p], run.last_stable[p], run.log_end[p] = _read_committed(cluster, topic, p)
    return run


@pytest.mark.parametrize("version", ["3.5.2", "3.9.2"])
def test_j3_a_late_commit_of_one_transaction_lands_in_the_next_directly_against_kafka(
    kafka_pool: ClusterPool, version: str,
) -> None:
    cluster = kafka_pool.get(version)
    run = j3_sequence(cluster)
    print(f"\nKafka {version}, direct: {run}")
    assert run.t1_retry == "NONE"
    assert run.states[0] in ("PrepareCommit", "CompleteCommit")  # T1, committed by the client's retry
    assert run.states[1] == "Ongoing"                            # T2, open when the late commit is released
    assert run.states[2] == "CompleteCommit"                     # T2, ended early by T1's late commit
    assert run.t2_a == "NONE"
    t2_values = {b"t2-a", b"t2-b"}
    visible_t2 = set(run.visible[0] + run.visible[1]) & t2_values
    # The anomaly: T2 is not all-or-nothing at read_committed, in the way the client was told.
    if run.client_believes_t2 == "committed":
        assert visible_t2 != t2_values, run                     # an acknowledged write is missing (lost)
        # ... and it hangs: written after the early commit, in a transaction no coordinator will end.
        assert run.last_stable[1] < run.log_end[1], run
    else:
        assert visible_t2, run                                  # a value of an aborted transaction shows
    assert b"t1" in run.visible[0]


# -- through the proxy, real clients --------------------------------------------------------------------------------

CLIENTS = [pytest.param("java", marks=pytest.mark.java, id="java-3.5.2"), pytest.param("confluent-kafka")]


def _summary(run: J3ClientRun) -> str:
    return (f"{run.client} ({run.mode}): {run.seconds:.1f} s, steps {run.steps}, state at release "
            f"{run.state_at_release}, late EndTxn landed {run.held_answered}, holds {run.holds:.0f} "
            f"({run.hold_timeouts:.0f} at the bound), visible {run.visible}, anomalies {run.anomalies}")


@pytest.mark.parametrize("client", CLIENTS)
def test_j3_through_the_proxy_the_late_commit_cannot_end_the_next_transaction(
    kafka_pool: ClusterPool, client: str,
) -> None:
    cluster = kafka_pool.get("3.5.2")
    for _ in range(2):
        run = run_once(cluster, client, mode="on")
        print(f"\n{_summary(run)}")
        assert run.steps["t1_end"] == "committed" and run.held_answered, _summary(run)
        assert run.holds >= 1, _summary(run)           # T2 waited for the late EndTxn: the defence acted
        assert run.anomalies == [], _summary(run)
        assert run.steps["t2_end"] == "committed"
        assert set(run.visible[0] + run.visible[1]) == {b"t1", b"t2-a", b"t2-b", b"t2-c"}


@pytest.mark.parametrize("client", CLIENTS)
def test_j3_control_through_the_proxy_with_the_defence_off_the_late_commit_tears_the_next_transaction(
    kafka_pool: ClusterPool, client: str,
) -> None:
    cluster = kafka_pool.get("3.5.2")
    run = run_once(cluster, client, mode="off")
    print(f"\n{_summary(run)}")
    assert run.state_at_release == "Ongoing" and run.held_answered, _summary(run)   # it landed in T2
    assert run.holds == 0
    assert run.anomalies, _summary(run)

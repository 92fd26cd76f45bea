"""Coordinator freezes for clients with a small retry budget: the proxy waits like the broker (issue 13).

    client (3 retries, 100 ms apart) ─Produce─▶ proxy ─DescribeTransactions─▶ coordinator C
                                     ══ C frozen (SIGSTOP) for 2, 6 or 12 s ══
                                     proxy … holds the Produce, asks again 0.1-1 s apart
                                     ══ C resumed, or failed over to C' (12 s > the 9 s session timeout) ══
                                     proxy ─▶ C / C' ✓ Ongoing ─▶ leader: the write, acknowledged late
    client: no error, no retry spent, no aborted transaction

Before the hold the proxy answered NOT_ENOUGH_REPLICAS after each bounded question (~1.1 s apart with
`timeout_s: 1`): Sarama spent its 3 retries in ~4.5 s and aborted at a 6 s freeze, where Kafka 3.9.2's
own verification held the Produce and the same client went through. The control turns the hold off
(`hold_share: 0`) and shows that this test can fail: a raw actor writes while the coordinator is frozen,
and the test resumes the coordinator only after the answers (so no timer decides the outcome); with the
hold on, the same write is held until then.

The proxy checks every write with the coordinator (no leader evidence, evidence TTL 0, each question
bounded by 1 s: the project's S4 setting, and the worst case). Cells run here, one per value of each
axis (client x freeze x target); `bench/coordinator_freeze.py` runs the whole matrix and the README
lists its table.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from txnguard.testing.fixtures import ClusterPool
from txnguard.testing.freezes import CellResult, run_cell
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

StartProxy = Callable[..., ProxyThread]
# The coordinator's log (which would answer first) is not followed: these tests are about its questions.
VERIFY_WITH_COORDINATOR = {"leader_evidence": False, "evidence_ttl_ms": 0, "timeout_s": 1.0,
                           "transaction_log": False}


class ProxyFront:
    """Where a cell's client connects: a gateway started in front of the cell's cluster."""

    def __init__(self, start_proxy: StartProxy, **verification: object) -> None:
        self.start_proxy, self.verification = start_proxy, {**VERIFY_WITH_COORDINATOR, **verification}
        self.proxy: ProxyThread | None = None

    def __call__(self, cluster: Cluster) -> str:
        self.proxy = self.start_proxy(upstream=cluster.bootstrap_servers, mode="gateway", admin="127.0.0.1:0",
                                      verification=self.verification)
        return str(self.proxy.bootstrap)

    def metric(self, name: str, labels: dict[str, str]) -> float:
        assert self.proxy is not None
        return float(self.proxy.metric(name, labels))


def _report(cell: CellResult) -> None:
    print(f"\n{cell.row()}  errors={cell.errors[:2]}")


# Each client and each freeze once (the control, without the hold, is the raw actor below);
# bench/coordinator_freeze.py runs the whole matrix, reporting each cell's outcome.
@pytest.mark.parametrize(("client", "freeze_s"), [
    # kafka-python at 12 s is not a cell of make test: its outcome is decided by kafka-python and the broker,
    # not the proxy. One clean-clone run failed after the hold had done its part (its Produce held, then
    # decided by the new coordinator): kafka-python's next transactional request, its EndTxn, went to the
    # coordinator it knew, the frozen node, which lost the transaction log's leadership at its 9 s session
    # timeout and, once resumed, did not answer it within kafka-python's 30 s request timeout. kafka-python
    # 3.0.12 ends a transactional request that timed out as fatal (TxnRequestHandler.on_complete retries a
    # KafkaConnectionError only; a RequestTimedOutError takes its "unknown reasons" branch), where the Java
    # client retries it. Whether that EndTxn meets the old coordinator before it steps down is a race between
    # the client and the broker's failover; bench/coordinator_freeze.py runs the cell and reports either outcome.
    ("kafka-python", 6.0),
    ("confluent-kafka", 2.0),
    ("sarama", 12.0),           # a failover that outlasts Sarama's 10 s Produce timeout: one hold runs out
])
def test_a_small_retry_budget_client_rides_out_a_frozen_coordinator_through_the_proxy(
    kafka_pool: ClusterPool, start_proxy: StartProxy, client: str, freeze_s: float,
) -> None:
    cluster = kafka_pool.get("3.5.2", 3)
    front = ProxyFront(start_proxy)
    cell = run_cell(cluster, front, client, freeze_s, "proxy 3.5.2")
    _report(cell)
    decided = front.metric("txnguard_verification_hold_endings_total", {"ending": "decided"})
    timed_out = front.metric("txnguard_verification_hold_endings_total", {"ending": "timeout"})
    failures = front.metric("txnguard_verification_failures_total", {"reason": "coordinator_unavailable"})
    print(f"holds decided by the coordinator: {decided:.0f}, run out: {timed_out:.0f}; "
          f"verification failures: {failures:.0f}")
    assert cell.passed, cell
    # The freeze landed on a checked Produce (see txnguard.testing.freezes): it was held. A retriable
    # answer is only ever the end of a hold that ran out at 0.8 of the request's own timeout (Sarama
    # sends Producer.Timeout, 10 s: a 12 s freeze outlasts one hold, and its retry is held again).
    assert decided + timed_out >= 1
    assert failures == timed_out


def test_native_3_9_2_holds_the_write_for_a_small_retry_budget_client(kafka_pool: ClusterPool) -> None:
    cluster = kafka_pool.get("3.9.2", 3)
    cell = run_cell(cluster, lambda c: c.bootstrap_servers, "confluent-kafka", 12.0, "native 3.9.2")
    _report(cell)
    assert cell.passed, cell


@pytest.mark.parametrize(("hold_share", "held"), [(0.0, False), (0.8, True)])
def test_control_without_the_hold_each_attempt_inside_a_freeze_is_refused_and_with_it_the_first_is_held(
    kafka_pool: ClusterPool, start_proxy: StartProxy, hold_share: float, held: bool,
) -> None:
    """What issue 13 found, kept as proof that the cells above can fail, with a raw actor that orders each
    step itself (no timer decides what the freeze overlaps):

        actor ─InitProducerId, AddPartitionsToTxn─▶ Kafka (the proxy has no evidence of the transaction)
        ══ coordinator C frozen (SIGSTOP) ══
        actor ─Produce─▶ proxy ─DescribeTransactions─▶ C … no answer within the 1 s bound
          hold off: ◀── NOT_ENOUGH_REPLICAS; the actor retries (a budget of 1 retry: Sarama's, librdkafka's
                    `retries: 1`) ◀── NOT_ENOUGH_REPLICAS: both attempts spent while C is still frozen,
                    nothing appended; a real client with that budget must abort here
          hold on:  the Produce is held (txnguard_verification_holds 1) ...
        ══ C resumed (only now) ══
          hold on:  ... decided by C ◀── NONE: one attempt, nothing spent
        actor ─Produce─▶ (the write redone once C is back), EndTxn(COMMIT): exactly one copy visible

    (bench/coordinator_freeze.py, `proxy-hold-off`: with 3 retries and the hold off, Sarama, kafka-python and
    confluent-kafka each failed at a 6 s freeze; refusals come 1.1-2 s apart.)"""
    import concurrent.futures
    import time
    import uuid

    from kio.schema.errors import ErrorCode

    from txnguard.testing import clients
    from txnguard.testing.fixtures import fresh_topic
    from txnguard.testing.freezes import txn_id_coordinated_by
    from txnguard.testing.raw import RawClient
    from txnguard.testing.scenarios import TxnActor, error_name

    cluster = kafka_pool.get("3.5.2", 3)
    u = uuid.uuid4().hex[:8]
    # One replica: with three, acks=all writes wait for the frozen follower (Kafka's own wait, for seconds).
    topic = fresh_topic(cluster, f"control-{u}", replication_factor=1)
    leader = cluster.leader(topic, 0)
    txn_id, frozen = txn_id_coordinated_by(cluster, f"control-{u}", lambda c: c != leader)
    front = ProxyFront(start_proxy, hold_share=hold_share)
    front(cluster)
    assert front.proxy is not None and front.proxy.proxy is not None
    listeners = front.proxy.proxy.listeners
    front.proxy.wait_for(lambda: leader in listeners, 30, "the leader's listener")
    actor = TxnActor(cluster.bootstrap_servers, txn_id)     # the transaction begins directly on Kafka ...
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: ErrorCode.none}
    actor.bootstrap = f"127.0.0.1:{listeners[leader].address.port}"   # ... and writes through the proxy
    answers: list[str] = []
    cluster.pause_node(frozen)
    try:
        started = time.monotonic()
        if held:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                attempt = pool.submit(actor.produce, topic, 0, [b"v"])
                front.proxy.wait_for(lambda: front.metric("txnguard_verification_holds", {}) == 1, 15,
                                     "the write held")
                assert not attempt.done()
                cluster.resume_node(frozen)                 # the coordinator answers only now
                answers.append(error_name(attempt.result(60).error_code))
        else:
            for _ in range(2):                              # the first attempt and its one retry
                answers.append(error_name(actor.produce(topic, 0, [b"v"]).error_code))
            node = cluster.node(leader)
            with RawClient(node.host, node.port) as c:      # still frozen: the refused writes left nothing
                appended = c.list_offsets(topic, 0, read_committed=False)
            cluster.resume_node(frozen)
            assert appended == 0
        seconds = time.monotonic() - started
    finally:
        cluster.resume_node(frozen)
        cluster.wait_ready()
    failures = front.metric("txnguard_verification_failures_total", {"reason": "coordinator_unavailable"})
    decided = front.metric("txnguard_verification_hold_endings_total", {"ending": "decided"})
    print(f"\nhold_share {hold_share:g}: answers {answers} in {seconds:.1f} s while the coordinator was frozen; "
          f"verification failures {failures:.0f}, holds decided {decided:.0f}")
    if held:
        assert answers == ["NONE"] and failures == 0 and decided == 1
    else:
        assert answers == ["NOT_ENOUGH_REPLICAS"] * 2 and failures == 2 and decided == 0
        assert error_name(actor.produce(topic, 0, [b"v"]).error_code) == "NONE"   # redone once C is back
    assert actor.end(commit=True) == ErrorCode.none
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"v"]


def test_a_held_check_holds_its_own_request_only(kafka_pool: ClusterPool, start_proxy: StartProxy) -> None:
    """    client A ─Produce─▶ proxy (no evidence of A's transaction: added elsewhere) ─▶ frozen C … held
           client B ─Produce─▶ proxy (B's AddPartitionsToTxn came through it: local evidence) ✓ at once
           client N ─Produce (not transactional)─▶ proxy ✓ at once
           C resumed ─▶ A's write is decided by C's answer ✓

    (B is not a transaction whose coordinator the proxy must ask: while one of three KRaft nodes was
    stopped, another node asked DescribeTransactions directly did not answer within 15 s once here; and
    the topic has one replica, as acks=all writes wait seconds for a frozen follower, Kafka's own wait.)"""
    import concurrent.futures
    import time
    import uuid

    from kio.schema.errors import ErrorCode

    from txnguard.testing.fixtures import fresh_topic
    from txnguard.testing.freezes import txn_id_coordinated_by
    from txnguard.testing.raw import RawClient, build_batch
    from txnguard.testing.scenarios import TxnActor

    cluster = kafka_pool.get("3.5.2", 3)
    u = uuid.uuid4().hex[:8]
    # One replica: with three, acks=all writes wait for the frozen follower (Kafka's own, for seconds).
    topic = fresh_topic(cluster, f"only-{u}", replication_factor=1)
    leader = cluster.leader(topic, 0)
    held_id, frozen = txn_id_coordinated_by(cluster, f"only-a-{u}", lambda c: c != leader)
    front = ProxyFront(start_proxy, evidence_ttl_ms=None)   # gateway default: local evidence is used
    front(cluster)
    assert front.proxy is not None and front.proxy.proxy is not None
    listeners = front.proxy.proxy.listeners
    front.proxy.wait_for(lambda: leader in listeners, 30, "the leader's listener")
    # The clients bootstrap through the leader's listener: a client whose only bootstrap address is the
    # frozen node waits for its Metadata, through a proxy or not (real clients list several).
    bootstrap = f"127.0.0.1:{listeners[leader].address.port}"
    a = TxnActor(cluster.bootstrap_servers, held_id)        # A's transaction begins directly on Kafka ...
    a.init()
    assert a.add_partitions(topic, 0) == {0: ErrorCode.none}
    a.bootstrap = bootstrap                                  # ... and writes through the proxy
    b = TxnActor(bootstrap, f"only-b-{u}")
    b.init()
    assert b.add_partitions(topic, 0) == {0: ErrorCode.none}
    cluster.pause_node(frozen)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(a.produce, topic, 0, [b"held"])
            front.proxy.wait_for(lambda: front.metric("txnguard_verification_holds", {}) == 1, 15, "A's check held")
            started = time.monotonic()
            assert b.produce(topic, 0, [b"free"]).error_code == ErrorCode.none
            with RawClient.connect(bootstrap) as c:
                plain = c.produce({(topic, 0): build_batch([b"plain"])})
            others_s = time.monotonic() - started
            assert plain.responses[0].partition_responses[0].error_code == ErrorCode.none
            assert not held.done() and front.metric("txnguard_verification_holds", {}) == 1
            cluster.resume_node(frozen)
            assert held.result(30).error_code == ErrorCode.none
    finally:
        cluster.resume_node(frozen)
        cluster.wait_ready()
    print(f"\nwhile A was held: B's transactional write and a plain write answered in {others_s:.2f} s")
    assert front.metric("txnguard_verification_hold_endings_total", {"ending": "decided"}) == 1

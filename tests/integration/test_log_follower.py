"""The follower of the coordinator's log on real brokers: what it reads is what the coordinator wrote.

    client ─InitProducerId, AddPartitionsToTxn, Produce, EndTxn─▶ broker (directly)
    proxy's follower ─Metadata, Fetch __transaction_state─▶ the id's latest state: Ongoing {p0}, then
                                                            CompleteCommit (value v0 on 2.8 and 3.5, v1 on 4.4),
                                                            read in an incremental fetch session
    faults (3 brokers): the coordinator killed and restarted, its __transaction_state partition's leader moves;
                        the follower reads on from the new leader: a later transaction is seen
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard.codecs.groups import coordinator_partition_for
from txnguard.testing import clients
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.proxy import ProxyThread, gateway_for
from txnguard.testing.scenarios import TxnActor

pytestmark = pytest.mark.integration


def logged_state(proxy: ProxyThread, txn_id: str) -> Callable[[], Any]:
    def state() -> Any:
        assert proxy.proxy is not None and proxy.proxy.guard.follower is not None
        return proxy.proxy.guard.follower.view.describe(txn_id)
    return state


def wait_for_state(proxy: ProxyThread, txn_id: str, wanted: str, timeout: float = 30.0) -> Any:
    state = logged_state(proxy, txn_id)
    proxy.wait_for(lambda: state() is not None and state().state == wanted, timeout, f"{txn_id} {wanted} in the log")
    return state()


@pytest.mark.parametrize(("version", "zookeeper", "value_version"), [
    ("2.8.2", True, 0), ("3.5.2", False, 0), ("4.4.0", False, 1)])
def test_the_follower_reads_what_the_coordinator_wrote(kafka_pool: ClusterPool, start_proxy: Any,
                                                       unique_name: Any, version: str, zookeeper: bool,
                                                       value_version: int) -> None:
    cluster = kafka_pool.get(version, 1, zookeeper=zookeeper)
    topic = fresh_topic(cluster, unique_name("t"), partitions=2)
    proxy = gateway_for(cluster, start_proxy)
    proxy.wait_for(lambda: proxy.metric("txnguard_ready") == 1, 30, "ready")
    actor = TxnActor(cluster.bootstrap_servers, unique_name("tid"), timeout_ms=45_000)
    pid = actor.init()
    assert actor.add_partitions(topic, 0, 1) == {0: 0, 1: 0}
    ongoing = wait_for_state(proxy, actor.transactional_id, "Ongoing")
    assert (ongoing.producer_id, ongoing.producer_epoch) == (pid.producer_id, pid.producer_epoch)
    assert ongoing.partitions == {(topic, 0), (topic, 1)} and ongoing.timeout_ms == 45_000
    assert actor.produce(topic, 0, [b"x"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    ended = wait_for_state(proxy, actor.transactional_id, "CompleteCommit")
    assert ended.partitions == frozenset()
    assert proxy.metric("txnguard_transaction_log_records_total", {"outcome": "unknown_version"}) == 0
    assert proxy.metric("txnguard_transaction_log_records_total", {"outcome": "malformed"}) == 0
    # The long poll runs in an incremental fetch session the broker keeps (KIP-227): after the full Fetch that
    # opened it, rounds list only what moved (a broker refusing the session would leave the id 0 or the epoch 1).
    assert proxy.proxy is not None and proxy.proxy.guard.follower is not None
    sessions = proxy.proxy.guard.follower._sessions
    assert sessions and all(s.id != 0 and s.epoch > 1 for s in sessions.values()), sessions
    assert proxy.metric("txnguard_transaction_log_lag_seconds") >= 0
    print(f"\n{version}: value v{value_version}, {proxy.metric('txnguard_transaction_log_transactional_ids'):.0f} ids, "
          f"{proxy.metric('txnguard_transaction_log_records_total', {'outcome': 'state'}):.0f} records read")


def test_the_follower_reads_on_after_the_coordinator_is_killed_and_its_partition_moves(
        kafka_pool: ClusterPool, start_proxy: Any, unique_name: Any) -> None:
    """    follower ─Fetch─▶ broker C (leader of the id's __transaction_state partition) ✗ SIGKILL
           the partition's leadership moves to another broker; C restarts later
           client ─a new transaction─▶ the new coordinator: the follower reads it from the new leader, and a
           write through the gateway without local evidence passes on the log"""
    cluster = kafka_pool.get("3.5.2", 3)
    topic = fresh_topic(cluster, unique_name("t"), replication_factor=3)
    proxy = gateway_for(cluster, start_proxy)
    proxy.wait_for(lambda: proxy.metric("txnguard_ready") == 1, 30, "ready")
    txn_id = unique_name("tid")
    first = TxnActor(cluster.bootstrap_servers, txn_id)
    first.init()
    wait_for_state(proxy, txn_id, "Empty")
    coordinator = cluster.transaction_coordinator(txn_id)
    cluster.kill_node(coordinator)
    try:
        survivors = ",".join(n.address for n in cluster.nodes if n.id != coordinator)
        second = TxnActor(survivors, txn_id)
        deadline = time.monotonic() + 60
        while True:  # the coordinator moves once the partition's new leader has loaded it
            try:
                second.init()
                break
            except RuntimeError:
                assert time.monotonic() < deadline, "no new coordinator within 60 s"
                time.sleep(0.5)
        assert second.add_partitions(topic, 0) == {0: 0}
        ongoing = wait_for_state(proxy, txn_id, "Ongoing", timeout=60)
        assert second.producer is not None and ongoing.producer_epoch == second.producer.producer_epoch
        second.bootstrap = proxy.bootstrap  # the write goes through the gateway, which saw no add
        assert second.produce(topic, 0, [b"after the move"]).error_code == ErrorCode.none
        assert proxy.metric("txnguard_verifications_total",
                            {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) >= 1
        second.bootstrap = survivors
        assert second.end(commit=True) == ErrorCode.none
        wait_for_state(proxy, txn_id, "CompleteCommit", timeout=60)
    finally:
        cluster.start_node(coordinator)
        cluster.wait_ready()
    partitions = proxy.proxy.guard.follower.view.partition_count if proxy.proxy and proxy.proxy.guard.follower else 0
    print(f"\ncoordinator {coordinator} killed; {txn_id} in __transaction_state-"
          f"{coordinator_partition_for(txn_id, partitions or 1)} read on from the new leader")


IDLE = {"transaction_log_idle_after_s": 1.0, "transaction_log_idle_read_s": 120.0}
PASSED_ON_THE_LOG = {"evidence": "log", "outcome": "pass", "decision": "forwarded"}


def settled(read: Callable[[], float], still_s: float, timeout_s: float) -> float:
    """`read()` once it has not moved for `still_s`; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while time.monotonic() < deadline:
        time.sleep(still_s)
        now = read()
        if now == value:
            return value
        value = now
    raise AssertionError(f"still moving after {timeout_s} s: {value}")


def test_an_idle_follower_reads_the_log_to_its_end_before_a_write_passes_on_it(
        kafka_pool: ClusterPool, start_proxy: Any, unique_name: Any) -> None:
    """    gateway: idle 1 s after the last write that asked the log, then a read to the end every 120 s
           client ─Init, AddPartitions {p0}─▶ broker (directly): the gateway never sees them
           the long poll reads Ongoing {p0}; no write asks the log: the follower idles (its view stops there)
           client ─EndTxn(commit)─▶ broker (directly): the view still says Ongoing {p0}, for 120 s
           client ─a late Produce to p0 (the committed transaction's producer)─▶ gateway
                  refused: the log read to its end first (never passed at once on an idle view), nothing appended
           client ─Init, AddPartitions {p0}─▶ broker; ─Produce p0─▶ gateway: passes on the log, and the write wakes
                  the follower: it long-polls again"""
    cluster = kafka_pool.get("3.5.2", 1)
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy, verification=IDLE)
    proxy.wait_for(lambda: proxy.metric("txnguard_ready") == 1, 30, "ready")
    direct = TxnActor(cluster.bootstrap_servers, unique_name("tid"))
    through = TxnActor(proxy.bootstrap, direct.transactional_id)
    direct.init()
    assert direct.add_partitions(topic, 0) == {0: 0}
    wait_for_state(proxy, direct.transactional_id, "Ongoing")
    proxy.wait_for(lambda: proxy.metric("txnguard_transaction_log_idle") == 1, 30, "the follower idle")
    # The long poll on its way when it idled answers (max wait 500 ms), then one read to the end: the count then
    # holds still for longer than a long poll waits, which a long-polling follower never does.
    fetches = settled(lambda: proxy.metric("txnguard_transaction_log_fetches_total"), 0.7, 10)
    time.sleep(1.0)  # idle: no Fetch sent (the next read in 120 s)
    assert proxy.metric("txnguard_transaction_log_fetches_total") == fetches
    assert direct.end(commit=True) == ErrorCode.none
    assert logged_state(proxy, direct.transactional_id)().state == "Ongoing"  # what the view says: stale

    through.producer = direct.producer  # the committed transaction's producer id and epoch: a late write
    late = through.produce(topic, 0, [b"late"])
    assert late.error_code != ErrorCode.none, "a late write passed on an idle follower's view"
    assert logged_state(proxy, direct.transactional_id)().state in ("PrepareCommit", "CompleteCommit")  # read first
    # The commit marker alone: a late batch that passed would sit after it, in a transaction left open (hanging).
    assert clients.stable_end_offsets(cluster.bootstrap_servers, topic, [0], timeout_s=10) == {0: 1}

    direct.init()
    through.producer = direct.producer
    assert direct.add_partitions(topic, 0) == {0: 0}
    assert through.produce(topic, 0, [b"in time"]).error_code == ErrorCode.none
    assert proxy.metric("txnguard_verifications_total", PASSED_ON_THE_LOG) == 1
    proxy.wait_for(lambda: proxy.metric("txnguard_transaction_log_idle") == 0
                   and proxy.metric("txnguard_transaction_log_fetches_total") > fetches + 1, 10, "long-polling again")
    assert direct.end(commit=True) == ErrorCode.none

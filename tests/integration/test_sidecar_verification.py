"""S3: S1 and S2 in sidecar mode on three nodes, with the transaction coordinator and the partition
leader on different brokers. The leader's sidecar never sees AddPartitionsToTxn or EndTxn (they go
to the coordinator's sidecar), so it must decide from the leader's and the coordinator's answers.

    client ─Init/AddPartitions/EndTxn─▶ sidecar(C) ─▶ broker C (coordinator)
    client ─Produce──────────────────▶ sidecar(L) ─▶ broker L (leader)
                                         └─DescribeProducers▶ L, DescribeTransactions▶ C
"""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyThread, broker_addresses
from txnguard.testing.scenarios import TxnActor, error_name, offsets, wait_stable

pytestmark = pytest.mark.integration


@pytest.fixture(params=[("3.5.2", {}), ("3.9.2", {"transaction.partition.verification.enable": "false"})],
                ids=["kafka-3.5.2", "kafka-3.9.2-verification-off"])
def sidecars(request, kafka_pool):
    version, config = request.param
    cluster = kafka_pool.get(version, 3, config, sidecars=True)
    # The leader's and the coordinator's answers, as these tests pin them: the coordinator's log, which would
    # answer first, is not followed here (test_kafka_28.py and the ZooKeeper matrix carry sidecars with it).
    proxies = [ProxyThread.from_settings(mode="sidecar", upstream=f"{n.host}:{n.port}",
                                         listen=f"{n.host}:{n.sidecar_port}",
                                         verification={"transaction_log": False}).start() for n in cluster.nodes]
    yield cluster, proxies
    for p in proxies:
        p.stop()


def _txn_id_away_from(cluster, leader: int, prefix: str) -> str:
    for i in range(200):
        txn_id = f"{prefix}-{i}"
        if cluster.transaction_coordinator(txn_id) != leader:
            return txn_id
    raise AssertionError("every transactional id landed on the leader")




def test_s3_never_added_and_late_write_are_rejected_by_the_leaders_sidecar(sidecars, unique_name):
    cluster, proxies = sidecars
    bootstrap = cluster.sidecar_bootstrap
    topic = fresh_topic(cluster, unique_name("s3"), replication_factor=3)
    leader = cluster.leader(topic, 0)
    leader_sidecar = proxies[leader - 1]

    # S1: the partition was never added.
    never = TxnActor(bootstrap, _txn_id_away_from(cluster, leader, unique_name("never")))
    never.init()
    r = never.produce(topic, 0, [b"x"])
    assert (error_name(r.error_code), r.error_message) == ("INVALID_TXN_STATE",
                                                            "Partition was not added to the transaction")

    # S2: a write after the abort, before the next AddPartitionsToTxn.
    late = TxnActor(bootstrap, _txn_id_away_from(cluster, leader, unique_name("late")))
    late.init()
    assert late.add_partitions(topic, 0) == {0: 0}
    assert late.produce(topic, 0, [b"in-txn"]).error_code == ErrorCode.none
    assert late.end(commit=False) == ErrorCode.none
    wait_stable(bootstrap, topic)
    # Markers may be on the partition while the coordinator is still in PrepareAbort: that answer is
    # CONCURRENT_TRANSACTIONS -> NOT_ENOUGH_REPLICAS, which a client retries, as with the broker.
    codes = []
    for _ in range(50):
        codes.append(error_name(late.produce(topic, 0, [b"late"], sequence=1).error_code))
        if codes[-1] != "NOT_ENOUGH_REPLICAS":
            break
        time.sleep(0.1)
    assert codes[-1] == "INVALID_TXN_STATE", codes

    hw, lso = offsets(bootstrap, topic, 0)
    assert hw == lso == 2  # one aborted record and its marker; nothing hangs
    # S1 is outside any transaction; S2 comes after its transaction ended (CompleteAbort): a late write.
    assert leader_sidecar.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 1
    assert leader_sidecar.metric("txnguard_verification_failures_total", {"reason": "late_write"}) == 1
    assert leader_sidecar.metric("txnguard_verification_failures_total",
                                 {"reason": "coordinator_unavailable"}) == len(codes) - 1
    # The first write was checked with the coordinator, later ones with the leader's open transaction.
    assert leader_sidecar.metric("txnguard_verifications_total",
                                 {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}) >= 1
    for p in proxies:
        assert p.wire.leaks(broker_addresses(cluster)) == []


def test_s3_a_valid_transaction_across_sidecars_commits(sidecars, unique_name):
    cluster, proxies = sidecars
    bootstrap = cluster.sidecar_bootstrap
    topic = fresh_topic(cluster, unique_name("ok"), replication_factor=3)
    leader = cluster.leader(topic, 0)
    actor = TxnActor(bootstrap, _txn_id_away_from(cluster, leader, unique_name("ok")))
    actor.init()
    for _transaction in range(3):  # three transactions with the same epoch, as old clients do
        assert actor.add_partitions(topic, 0) == {0: 0}
        for _ in range(3):
            assert actor.produce(topic, 0, [b"v"]).error_code == ErrorCode.none
        assert actor.end(commit=True) == ErrorCode.none
        wait_stable(bootstrap, topic)
    assert offsets(bootstrap, topic, 0) == (12, 12)
    m = proxies[leader - 1].metric
    # Per transaction: the first write asks the coordinator, the next two are vouched for by the leader.
    assert m("txnguard_verifications_total", {"evidence": "coordinator", "outcome": "pass",
                                              "decision": "forwarded"}) == 3
    assert m("txnguard_verifications_total", {"evidence": "leader", "outcome": "pass",
                                              "decision": "forwarded"}) == 6


def test_the_next_transaction_after_a_quiet_spell_is_not_taken_for_a_late_write(sidecars, unique_name):
    """The leader's sidecar sees the writes, never the coordinator's requests (another broker's sidecar).

        client ─AddPartitionsToTxn(p)──▶ coordinator's sidecar ─▶ C
        client ─Produce(p)─▶ leader's sidecar ─DescribeTransactions─▶ C: Ongoing {p}   ✓ (cached, 0 ms)
        client ─EndTxn(commit)─▶ coordinator's sidecar                                 (unseen by the leader's)
               … longer than the transaction timeout (2 s): the leader's sidecar ends its view by the clock
        client ─AddPartitionsToTxn(p)─▶ coordinator's sidecar;  ─Produce(p)─▶ leader's sidecar  ✓ written
    (It was refused as a late write: INVALID_TXN_STATE to a client that did nothing wrong.)
    """
    cluster, proxies = sidecars
    bootstrap = cluster.sidecar_bootstrap
    topic = fresh_topic(cluster, unique_name("quiet"), replication_factor=3)
    leader = cluster.leader(topic, 0)
    actor = TxnActor(bootstrap, _txn_id_away_from(cluster, leader, unique_name("quiet")), timeout_ms=2000)
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"first"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    time.sleep(3.5)  # past the timeout, and the sidecars' once-a-second housekeeping
    assert actor.add_partitions(topic, 0) == {0: 0}
    r = actor.produce(topic, 0, [b"second"], sequence=1)
    assert (error_name(r.error_code), r.error_message) == ("NONE", None), r
    assert actor.end(commit=True) == ErrorCode.none
    wait_stable(bootstrap, topic)
    assert offsets(bootstrap, topic, 0) == (4, 4)  # two records, two commit markers
    assert proxies[leader - 1].metric("txnguard_verification_failures_total", {"reason": "late_write"}) == 0

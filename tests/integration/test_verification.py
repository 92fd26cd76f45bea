"""KIP-890 part 1 outside the broker: each scenario shows the failure direct to the brokers, then its
prevention through the proxy, on Kafka 3.5.2 (no native verification), on 3.9.2 with
transaction.partition.verification.enable=false, and on 3.0.2 and 3.4.1 in ZooKeeper mode.

    client ──InitProducerId──▶ coordinator
    client ──Produce(txn batch, partition never added)──▶ leader
      direct:  written; LSO stuck below the high watermark (a hanging transaction)
      proxied: INVALID_TXN_STATE "Partition was not added to the transaction"; nothing written
    client ──AddPartitionsToTxn(p0), TxnOffsetCommit(group never added), EndTxn(commit)──▶ coordinators
      direct:  offsets accepted into the transaction, but no marker reaches the group's __consumer_offsets
               partition: its LSO stops below the high watermark (ended afterwards by an abort that adds the group)
      proxied: INVALID_TXN_STATE; nothing pending

S1, S2 and S5 each print one line per broker: the direct outcome, the proxy's answer and how long the
client waited for it (Kafka 2.8.2: test_kafka_28.py prints the same lines).
"""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import broker_addresses, gateway_for
from txnguard.testing.scenarios import (
    TxnActor,
    commit_offsets_retrying,
    error_name,
    offsets,
    release_pending_offsets,
    s5_offsets_never_ended,
    wait_stable,
)

pytestmark = pytest.mark.integration

UNVERIFIED_BROKERS = [
    pytest.param(("3.5.2", {}, False), id="kafka-3.5.2"),
    pytest.param(("3.9.2", {"transaction.partition.verification.enable": "false"}, False),
                 id="kafka-3.9.2-verification-off"),
    # ZooKeeper mode, the clusters most users of pre-3.6 brokers run (Kafka 2.8.2: test_kafka_28.py).
    pytest.param(("3.0.2", {}, True), id="kafka-3.0.2-zookeeper"),
    pytest.param(("3.4.1", {}, True), id="kafka-3.4.1-zookeeper"),
]


# Module-scoped: pytest then runs every test on one broker before the next broker (a function-scoped parameter
# runs each test on all four in turn, and four clusters through a pool of three start one for every test).
@pytest.fixture(scope="module", params=UNVERIFIED_BROKERS)
def cluster(request, kafka_pool):
    version, config, zookeeper = request.param
    return kafka_pool.get(version, 1, config, zookeeper=zookeeper)


def _label(cluster) -> str:
    return f"{cluster.version} {'zookeeper' if cluster.zookeeper else 'kraft'}"


def _timed(call):
    """(what `call()` returned, how long the client waited for it in ms)."""
    started = time.monotonic()
    result = call()
    return result, (time.monotonic() - started) * 1000


def test_s1_partition_never_added_hangs_direct_and_is_rejected_through_the_proxy(cluster, start_proxy,
                                                                                  unique_name):
    topic = fresh_topic(cluster, unique_name("s1"))
    # Direct: the broker writes the batch and the transaction hangs.
    direct = TxnActor(cluster.bootstrap_servers, unique_name("txn"))
    direct.init()
    appended = direct.produce(topic, 0, [b"never-added"])
    assert appended.error_code == ErrorCode.none
    hw, lso = offsets(cluster.bootstrap_servers, topic, 0)
    assert (hw, lso) == (1, 0), "direct: the unadded write should leave the last stable offset stuck"

    # Through the proxy: rejected, nothing written.
    topic2 = fresh_topic(cluster, unique_name("s1p"))
    proxy = gateway_for(cluster, start_proxy)
    actor = TxnActor(proxy.bootstrap, unique_name("txn"))
    actor.init()
    r, waited_ms = _timed(lambda: actor.produce(topic2, 0, [b"never-added"]))
    assert error_name(r.error_code) == "INVALID_TXN_STATE"
    assert r.error_message == "Partition was not added to the transaction"
    assert offsets(cluster.bootstrap_servers, topic2, 0) == (0, 0)
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 1
    assert proxy.wire.leaks(broker_addresses(cluster)) == []
    print(f"\nS1 {_label(cluster)}: direct appended at offset {appended.base_offset}, hangs (HW {hw}, LSO {lso}); "
          f"gateway refused INVALID_TXN_STATE after {waited_ms:.0f} ms, nothing written")


def test_s2_late_write_after_abort_hangs_direct_and_is_rejected_through_the_proxy(cluster, start_proxy,
                                                                                   unique_name):
    def late_write(bootstrap: str, topic: str) -> tuple[TxnActor, int, float]:
        actor = TxnActor(bootstrap, unique_name("txn"))
        actor.init()
        assert actor.add_partitions(topic, 0) == {0: 0}
        assert actor.produce(topic, 0, [b"in-txn"]).error_code == ErrorCode.none
        assert actor.end(commit=False) == ErrorCode.none
        wait_stable(cluster.bootstrap_servers, topic)
        # A retry of the first batch arrives after the abort, before any new AddPartitionsToTxn.
        r, waited_ms = _timed(lambda: actor.produce(topic, 0, [b"late"], sequence=1))
        return actor, r.error_code, waited_ms

    topic = fresh_topic(cluster, unique_name("s2"))
    _, code, _ = late_write(cluster.bootstrap_servers, topic)
    assert code == ErrorCode.none
    direct_hw, direct_lso = offsets(cluster.bootstrap_servers, topic, 0)
    assert direct_lso < direct_hw, "direct: the late write should open a transaction nobody will end"

    topic2 = fresh_topic(cluster, unique_name("s2p"))
    proxy = gateway_for(cluster, start_proxy)
    actor, code, waited_ms = late_write(proxy.bootstrap, topic2)
    assert error_name(code) == "INVALID_TXN_STATE"
    hw, lso = offsets(cluster.bootstrap_servers, topic2, 0)
    assert lso == hw == 2  # the aborted record and its abort marker, nothing after
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "late_write"}) == 1
    # The next transaction of the same producer (same epoch: an old client) works normally.
    assert actor.add_partitions(topic2, 0) == {0: 0}
    assert actor.produce(topic2, 0, [b"next"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    print(f"\nS2 {_label(cluster)}: direct late write appended, hangs (HW {direct_hw}, LSO {direct_lso}); "
          f"gateway refused INVALID_TXN_STATE after {waited_ms:.0f} ms, nothing written")


def test_s5_txn_offset_commit_for_a_group_never_added_hangs_direct_and_is_rejected(cluster, start_proxy,
                                                                                    unique_name):
    # Direct: the offsets join the transaction on the group's __consumer_offsets partition, and no marker ends them.
    topic = fresh_topic(cluster, unique_name("s5"))
    direct = TxnActor(cluster.bootstrap_servers, unique_name("txn"))
    direct.init()
    assert direct.add_partitions(topic, 0) == {0: 0}
    pending = s5_offsets_never_ended(direct, topic, lambda: unique_name("group"))
    try:
        assert (pending.commit_error, pending.end_error) == (ErrorCode.none, ErrorCode.none)
        assert pending.hangs, pending
    finally:
        release_pending_offsets(direct, pending)  # the shared cluster's offsets partition, stable again

    proxy = gateway_for(cluster, start_proxy)
    actor = TxnActor(proxy.bootstrap, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    codes, waited_ms = _timed(lambda: actor.commit_offsets(unique_name("group"), {topic: {0: 1}}))
    assert [error_name(c) for c in codes] == ["INVALID_TXN_STATE"]
    # With AddOffsetsToTxn first it passes.
    group = unique_name("group")
    assert actor.add_offsets(group) == ErrorCode.none
    assert commit_offsets_retrying(actor, group, {topic: {0: 1}}) == [ErrorCode.none]
    assert actor.end(commit=True) == ErrorCode.none
    print(f"\nS5 {_label(cluster)}: direct offsets accepted, hang on __consumer_offsets-{pending.partition} "
          f"(HW {pending.high_watermark}, LSO {pending.last_stable}); gateway refused INVALID_TXN_STATE after "
          f"{waited_ms:.0f} ms")


def test_valid_transactions_pass_with_local_evidence(cluster, start_proxy, unique_name):
    topic = fresh_topic(cluster, unique_name("ok"), partitions=2)
    proxy = gateway_for(cluster, start_proxy)
    actor = TxnActor(proxy.bootstrap, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0, 1) == {0: 0, 1: 0}
    assert actor.produce(topic, 0, [b"a"]).error_code == ErrorCode.none
    assert actor.produce(topic, 1, [b"b"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "local", "outcome": "pass", "decision": "forwarded"}) == 2
    # EndTxn answers before the commit marker lands: wait for it, then both partitions hold record + marker.
    for partition in (0, 1):
        wait_stable(cluster.bootstrap_servers, topic, partition)
        assert offsets(cluster.bootstrap_servers, topic, partition) == (2, 2)


def test_verify_only_asks_the_coordinator_the_brokers_own_question(cluster, start_proxy, unique_name):
    """The VerifyOnly option, with nothing the proxy saw to go on (nor the coordinator's log, not followed here):
    every write is the coordinator's call.
    (Kafka 3.5.2 offers v4 to brokers only, so there the proxy asks DescribeTransactions, with the same answers.)

        client ─Init/AddPartitions(p0)/AddOffsets(g)─▶ coordinator           (direct: the proxy never sees them)
        client ─Produce p0, p1 / TxnOffsetCommit g─▶ proxy
            proxy ─AddPartitionsToTxn v4 VerifyOnly─▶ coordinator: p0 NONE, p1 not in the transaction
            p0 forwarded; p1 INVALID_TXN_STATE; the offsets of g forwarded
    """
    topic = fresh_topic(cluster, unique_name("vo"), partitions=2)
    proxy = gateway_for(cluster, start_proxy, verification={"coordinator_evidence": "verify_only",
                                                           "leader_evidence": False, "transaction_log": False})
    actor = TxnActor(cluster.bootstrap_servers, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    group = unique_name("group")
    assert actor.add_offsets(group) == ErrorCode.none

    actor.bootstrap = proxy.bootstrap  # from here on, through the proxy
    assert actor.produce(topic, 0, [b"added"]).error_code == ErrorCode.none
    refused = actor.produce(topic, 1, [b"never-added"])
    assert error_name(refused.error_code) == "INVALID_TXN_STATE"
    assert commit_offsets_retrying(actor, group, {topic: {0: 1}}) == [ErrorCode.none]
    assert actor.end(commit=True) == ErrorCode.none

    # Kafka 3.5 offers AddPartitionsToTxn v4 only between brokers: the proxy falls back to DescribeTransactions.
    before_3_6 = tuple(int(x) for x in cluster.version.split(".")[:2]) < (3, 6)  # no v4 for clients before 3.6
    asked, not_asked = (("describe_transactions", "add_partitions_to_txn_verify_only") if before_3_6
                        else ("add_partitions_to_txn_verify_only", "describe_transactions"))
    assert proxy.metric("txnguard_coordinator_requests_total", {"api": asked}) >= 2
    assert proxy.metric("txnguard_coordinator_requests_total", {"api": not_asked}) == 0
    # DescribeTransactions' "Ongoing" is kept for the rest of the transaction (evidence "cache"); VerifyOnly
    # answers only for the partitions asked, so each check goes to the coordinator.
    passes = {"outcome": "pass", "decision": "forwarded"}
    assert sum(proxy.metric("txnguard_verifications_total", {"evidence": e, **passes})
               for e in ("coordinator", "cache")) == 2
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 1
    wait_stable(cluster.bootstrap_servers, topic, 0)
    assert offsets(cluster.bootstrap_servers, topic, 0) == (2, 2)  # the record and its commit marker
    assert offsets(cluster.bootstrap_servers, topic, 1) == (0, 0)  # nothing written

"""Kafka 2.8.2 in ZooKeeper mode: brokers without DescribeTransactions or ListTransactions (KIP-664 came in 3.0).

The proxy reads each broker's ApiVersions on every connection it opens and never sends an API the broker
does not list (2.8 closes the connection on one: `Unexpected api key: 65` in its log). Evidence comes from
what the proxy saw (a gateway sees every AddPartitionsToTxn of a transaction it saw begin), from the
coordinator's own log, `__transaction_state`, which every proxy follows (every AddPartitionsToTxn and EndTxn
is there, wherever it went through), and from the leader (DescribeProducers). Without the log
(`verification.transaction_log_view: false`), a write with neither of the others is refused at once as not
added, with the error each client family aborts on (INVALID_TXN_STATE; TRANSACTION_ABORTABLE for
kafka-python), never held:

    client ─InitProducerId/AddPartitionsToTxn(p0)─▶ broker            (not through the proxy)
    client ─Produce p0─▶ gateway: no local evidence
        the log shows p0 added ─▶ forwarded (evidence "log")
        without the log: the coordinator lacks DescribeTransactions ─▶ INVALID_TXN_STATE at once (evidence "none")
    sidecars: client ─AddPartitionsToTxn─▶ coordinator's sidecar; ─Produce─▶ leader's sidecar: the log passes it

Every test ends by counting `Unexpected api key` in the brokers' logs: 0.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import clients, jars, kafka
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, gateway_for
from txnguard.testing.scenarios import (
    TxnActor,
    error_name,
    offsets,
    release_pending_offsets,
    s5_offsets_never_ended,
    wait_stable,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(r"ignore:.*is deprecated\. Use files\(\) instead:DeprecationWarning"),
]

VERSION = "2.8.2"
# What each family gets for a write the proxy cannot verify on 2.8 (the policy's "not in the transaction").
ABORTABLE = {"kafka-python": "TRANSACTION_ABORTABLE", "confluent-kafka": "INVALID_TXN_STATE",
             "aiokafka": "INVALID_TXN_STATE"}


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get(VERSION, 1, zookeeper=True)


@pytest.fixture(scope="module")
def cluster3(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get(VERSION, 3, sidecars=True, zookeeper=True)


def unexpected_api_key_lines(cluster: Cluster) -> int:
    return sum((cluster.node_dir(n.id) / "server.log").read_text(errors="replace").count("Unexpected api key")
               for n in cluster.nodes)


def _never_held(proxy: ProxyThread) -> None:
    assert proxy.metric("txnguard_verification_hold_endings_total", {"ending": "timeout"}) == 0
    assert proxy.metric("txnguard_verification_hold_endings_total", {"ending": "decided"}) == 0


def _no_hold_ran_out(proxy: ProxyThread) -> None:
    """A hold may end decided: a write that meets its transaction in PrepareCommit in the log waits for the
    Complete record, as the broker's own verification waits on CONCURRENT_TRANSACTIONS. None may run out."""
    assert proxy.metric("txnguard_verification_hold_endings_total", {"ending": "timeout"}) == 0


def _readyz(proxy: ProxyThread) -> tuple[int, str]:
    with urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5) as r:
        return r.status, r.read().decode()


def _lacks(proxy: ProxyThread, api: str) -> float:
    assert proxy.proxy is not None
    return sum(s.value for m in proxy.proxy.metrics.registry.collect() if m.name == "txnguard_broker_api_missing"
               for s in m.samples if s.labels.get("api") == api)


# -- the harness -------------------------------------------------------------------------------------------


def test_a_zookeeper_cluster_is_what_the_harness_says(cluster: Cluster) -> None:
    """ZooKeeper mode: a ZooKeeper process, brokers registered through it, transactions and groups ready."""
    status = cluster.status()
    assert (status["mode"], status["version"]) == ("zookeeper", VERSION)
    assert status["zookeeper"]["alive"] and status["zookeeper"]["listening"]
    assert [n["alive"] for n in status["nodes"]] == [True]
    config = (cluster.node_dir(1) / "server.properties").read_text()
    assert f"zookeeper.connect={cluster.zookeeper_connect}" in config and "process.roles" not in config
    # The ZooKeeper Kafka 2.8.2's POM names, run from the broker's own classpath.
    assert [p.name for p in jars.resolve("kafka_2.13", VERSION).glob("zookeeper-3*.jar")] == ["zookeeper-3.5.9.jar"]
    assert cluster.transaction_coordinator("any-txn") == 1 and cluster.group_coordinator("any-group") == 1


def test_zookeeper_cluster_kill_restart_and_down_leaves_nothing(tmp_path) -> None:
    """Kafka 3.4.1 in ZooKeeper mode through the Python API: a SIGKILLed broker comes back (its old ZooKeeper
    session expires first), and `down` leaves no process of the cluster behind."""
    c = kafka.up("3.4.1", 1, tmp_path / "zk341", zookeeper=True, die_with_parent=True, quick_jit=True)
    try:
        pids = [c.node(1).pid, c.zookeeper_pid]
        c.restart_node(1, kill=True)
        assert c.status()["nodes"][0]["alive"] and c.transaction_coordinator("after-restart") == 1
        pids.append(c.node(1).pid)
    finally:
        c.down()
    assert not any(kafka._alive(p) for p in pids)
    # Nothing of the cluster listens any more: no JVM names its folder. (Its freed ports themselves may already
    # be another process's: a parallel test took one, 2026-11-28, after the broker had gone.)
    assert kafka.java_processes_in(tmp_path / "zk341") == 0
    assert kafka.Cluster.load(tmp_path / "zk341").status()["zookeeper"]["alive"] is False


# -- a gateway ---------------------------------------------------------------------------------------------


def test_gateway_s1_s2_s5_prevented_on_2_8_without_asking_the_coordinator(cluster: Cluster, start_proxy,
                                                                         unique_name) -> None:
    """S1 (never added), S2 (late write after the abort), S5 (offsets of a group never added), each first
    directly (it hangs: the 2.8 broker verifies nothing) and then through a gateway (refused at once).
    One line per scenario printed, as test_verification.py prints them for 3.0.2 and 3.4.1."""
    before = unexpected_api_key_lines(cluster)
    bootstrap = cluster.bootstrap_servers
    # Direct.
    s1d = fresh_topic(cluster, unique_name("s1d"))
    direct = TxnActor(bootstrap, unique_name("txn"))
    direct.init()
    appended = direct.produce(s1d, 0, [b"never-added"])
    assert appended.error_code == ErrorCode.none
    s1_direct = offsets(bootstrap, s1d, 0)
    assert s1_direct == (1, 0), "direct S1 should hang the partition"
    s2d = fresh_topic(cluster, unique_name("s2d"))
    direct_late = TxnActor(bootstrap, unique_name("txn"))
    direct_late.init()
    assert direct_late.add_partitions(s2d, 0) == {0: 0}
    assert direct_late.produce(s2d, 0, [b"in-txn"]).error_code == ErrorCode.none
    assert direct_late.end(commit=False) == ErrorCode.none
    wait_stable(bootstrap, s2d)
    assert direct_late.produce(s2d, 0, [b"late"], sequence=1).error_code == ErrorCode.none
    s2_direct = offsets(bootstrap, s2d, 0)
    assert s2_direct[1] < s2_direct[0], "direct S2 should open a transaction nobody ends"
    s5d = fresh_topic(cluster, unique_name("s5d"))
    direct_offsets = TxnActor(bootstrap, unique_name("txn"))
    direct_offsets.init()
    assert direct_offsets.add_partitions(s5d, 0) == {0: 0}
    pending = s5_offsets_never_ended(direct_offsets, s5d, lambda: unique_name("group"))
    try:
        assert (pending.commit_error, pending.end_error) == (ErrorCode.none, ErrorCode.none)
        assert pending.hangs, pending
    finally:
        release_pending_offsets(direct_offsets, pending)

    proxy = gateway_for(cluster, start_proxy)
    s1 = fresh_topic(cluster, unique_name("s1p"))
    actor = TxnActor(proxy.bootstrap, unique_name("txn"))
    actor.init()
    started = time.monotonic()
    r = actor.produce(s1, 0, [b"never-added"])
    s1_ms = (time.monotonic() - started) * 1000
    assert (error_name(r.error_code), r.error_message) == ("INVALID_TXN_STATE",
                                                            "Partition was not added to the transaction")
    assert offsets(bootstrap, s1, 0) == (0, 0)

    # S2: the gateway saw the EndTxn, so the late write is refused from its own evidence.
    s2 = fresh_topic(cluster, unique_name("s2p"))
    late = TxnActor(proxy.bootstrap, unique_name("txn"))
    late.init()
    assert late.add_partitions(s2, 0) == {0: 0}
    assert late.produce(s2, 0, [b"in-txn"]).error_code == ErrorCode.none
    assert late.end(commit=False) == ErrorCode.none
    wait_stable(bootstrap, s2)
    started = time.monotonic()
    refused = late.produce(s2, 0, [b"late"], sequence=1)
    s2_ms = (time.monotonic() - started) * 1000
    assert error_name(refused.error_code) == "INVALID_TXN_STATE"
    assert offsets(bootstrap, s2, 0) == (2, 2)  # the aborted record and its marker

    # S5: TxnOffsetCommit for a group never added.
    started = time.monotonic()
    (code,) = actor.commit_offsets(unique_name("group"), {s1: {0: 1}})
    s5_ms = (time.monotonic() - started) * 1000
    assert error_name(code) == "INVALID_TXN_STATE"

    assert proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 2
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "late_write"}) == 1
    _never_held(proxy)
    assert unexpected_api_key_lines(cluster) == before == 0
    label = f"{VERSION} zookeeper"
    print(f"\nS1 {label}: direct appended at offset {appended.base_offset}, hangs (HW {s1_direct[0]}, "
          f"LSO {s1_direct[1]}); gateway refused INVALID_TXN_STATE after {s1_ms:.0f} ms, nothing written")
    print(f"S2 {label}: direct late write appended, hangs (HW {s2_direct[0]}, LSO {s2_direct[1]}); "
          f"gateway refused INVALID_TXN_STATE after {s2_ms:.0f} ms, nothing written")
    print(f"S5 {label}: direct offsets accepted, hang on __consumer_offsets-{pending.partition} "
          f"(HW {pending.high_watermark}, LSO {pending.last_stable}); gateway refused INVALID_TXN_STATE after "
          f"{s5_ms:.0f} ms")


def test_gateway_write_added_elsewhere_passes_on_the_coordinators_log_and_the_late_write_is_refused(
        cluster: Cluster, start_proxy, unique_name) -> None:
    """    client ─InitProducerId, AddPartitionsToTxn p0─▶ broker (a restarted proxy, another replica: not seen here)
           client ─Produce p0─▶ gateway: __transaction_state shows p0 added ─▶ forwarded (evidence "log")
           client ─EndTxn(commit)─▶ broker
           client ─Produce p0 (late)─▶ gateway: the log, read to its end, shows CompleteCommit ─▶ INVALID_TXN_STATE"""
    topic = fresh_topic(cluster, unique_name("logged"))
    proxy = gateway_for(cluster, start_proxy)
    actor = TxnActor(cluster.bootstrap_servers, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}   # directly: the gateway never saw it
    actor.bootstrap = proxy.bootstrap
    assert actor.produce(topic, 0, [b"added elsewhere"]).error_code == ErrorCode.none
    actor.bootstrap = cluster.bootstrap_servers
    assert actor.end(commit=True) == ErrorCode.none
    wait_stable(cluster.bootstrap_servers, topic)
    actor.bootstrap = proxy.bootstrap
    assert error_name(actor.produce(topic, 0, [b"late"]).error_code) == "INVALID_TXN_STATE"
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) == 1
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "log", "outcome": "late_write", "decision": "rejected"}) == 1
    assert offsets(cluster.bootstrap_servers, topic, 0) == (2, 2)  # the record and its commit marker
    _no_hold_ran_out(proxy)
    assert unexpected_api_key_lines(cluster) == 0


def test_gateway_without_the_log_refuses_a_write_added_elsewhere_at_once_and_the_redone_transaction_commits(
        cluster: Cluster, start_proxy, unique_name) -> None:
    """The transaction began before the gateway saw it (a restarted proxy, a client moved between replicas),
    and the coordinator's log is not followed: no local evidence, no DescribeTransactions to ask. Refused at
    once; the client's abort and redo pass."""
    topic = fresh_topic(cluster, unique_name("nolocal"))
    proxy = gateway_for(cluster, start_proxy, verification={"transaction_log": False})
    actor = TxnActor(cluster.bootstrap_servers, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}   # directly: the gateway never saw it
    actor.bootstrap = proxy.bootstrap
    started = time.monotonic()
    r = actor.produce(topic, 0, [b"unverifiable"])
    waited = time.monotonic() - started
    assert error_name(r.error_code) == "INVALID_TXN_STATE"
    print(f"write without local evidence through the gateway on {VERSION}: INVALID_TXN_STATE after "
          f"{waited * 1000:.0f} ms")
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "none", "outcome": "not_in_transaction", "decision": "rejected"}) == 1
    # What an aborting client does next: abort, then the whole transaction again, seen by the gateway.
    assert actor.end(commit=False) == ErrorCode.none
    wait_stable(cluster.bootstrap_servers, topic)
    assert actor.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"redone"]).error_code == ErrorCode.none
    assert actor.end(commit=True) == ErrorCode.none
    wait_stable(cluster.bootstrap_servers, topic)
    assert offsets(cluster.bootstrap_servers, topic, 0) == (3, 3)  # abort marker, the record, commit marker

    # Said once: the metric and /readyz name what the broker lacks (the proxy stays ready).
    assert _lacks(proxy, "DescribeTransactions") == 1 and _lacks(proxy, "ListTransactions") == 1
    assert _lacks(proxy, "DescribeProducers") == 0
    status, body = _readyz(proxy)
    assert status == 200 and body.startswith("ok; broker ") and "lacks DescribeTransactions" in body, body
    _never_held(proxy)
    assert unexpected_api_key_lines(cluster) == 0


@pytest.mark.parametrize("client_name", list(clients.PYTHON_CLIENTS))
def test_gateway_carries_each_client_family_exactly_on_2_8(cluster: Cluster, start_proxy, unique_name,
                                                           client_name: str) -> None:
    """Real clients through a gateway: every write has local evidence (the gateway forwarded its
    AddPartitionsToTxn), so 2.8's missing DescribeTransactions is never needed: committed exactly once."""
    client = clients.PYTHON_CLIENTS[client_name]
    topic = fresh_topic(cluster, unique_name("fam"))
    proxy = gateway_for(cluster, start_proxy)
    values = [f"{client_name}-{i}".encode() for i in range(20)]
    client.run_transaction(proxy.bootstrap, topic, unique_name("txn"), values[:10], commit=False, partition=0)
    client.run_transaction(proxy.bootstrap, topic, unique_name("txn"), values[10:], commit=True, partition=0)
    assert client.consume_committed(cluster.bootstrap_servers, topic) == values[10:]
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 0
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "local", "outcome": "pass", "decision": "forwarded"}) >= 2
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []
    assert unexpected_api_key_lines(cluster) == 0


def test_gateway_java_2_8_copier_copies_exactly_on_2_8(cluster: Cluster, start_proxy, unique_name) -> None:
    source, sink = fresh_topic(cluster, unique_name("src")), fresh_topic(cluster, unique_name("sink"))
    values = [f"java-{i}".encode() for i in range(300)]
    clients.PYTHON_CLIENTS["confluent-kafka"].produce(cluster.bootstrap_servers, source, values, partition=0)
    proxy = gateway_for(cluster, start_proxy)
    result = clients.java_transactional_copier(proxy.bootstrap, source, sink, unique_name("tid"),
                                               unique_name("group"), max_messages=len(values), java_version="2.8.2",
                                               transaction_size=50, timeout_s=120)
    assert (result.total_processed, result.remaining) == (len(values), 0)
    out = clients.PYTHON_CLIENTS["confluent-kafka"].consume_committed(cluster.bootstrap_servers, sink)
    assert sorted(out) == sorted(values)
    assert proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 0
    assert unexpected_api_key_lines(cluster) == 0


# -- sidecars ----------------------------------------------------------------------------------------------


@pytest.fixture
def sidecars(cluster3: Cluster, start_proxy) -> dict[int, ProxyThread]:
    return {n.id: start_proxy(mode="sidecar", upstream=f"{n.host}:{n.port}", listen=f"{n.host}:{n.sidecar_port}")
            for n in cluster3.nodes}


def test_sidecar_first_write_passes_on_the_coordinators_log_and_s1_s2_are_refused(cluster3: Cluster, sidecars,
                                                                                 unique_name) -> None:
    """    client ─AddPartitionsToTxn─▶ coordinator's sidecar ─▶ __transaction_state: Ongoing {p0}
           client ─Produce p0 (first write)─▶ leader's sidecar: its follower read the add ─▶ forwarded ("log")
           client ─EndTxn(commit)─▶ coordinator's sidecar
           client ─Produce p0 (late, S2)─▶ leader's sidecar: the log read to its end: CompleteCommit ─▶ refused
           another id, never added (S1) ─▶ refused: its log record shows no p0"""
    bootstrap = cluster3.sidecar_bootstrap
    topic = fresh_topic(cluster3, unique_name("sc"), replication_factor=3)
    leader = sidecars[cluster3.leader(topic, 0)]
    actor = TxnActor(bootstrap, unique_name("txn"))
    actor.init()
    assert actor.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"first"]).error_code == ErrorCode.none
    assert actor.produce(topic, 0, [b"second"]).error_code == ErrorCode.none
    assert leader.metric("txnguard_verifications_total",
                         {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) == 2
    assert actor.end(commit=True) == ErrorCode.none
    wait_stable(bootstrap, topic)

    started = time.monotonic()
    late = actor.produce(topic, 0, [b"late"])
    waited = time.monotonic() - started
    assert error_name(late.error_code) == "INVALID_TXN_STATE"
    never = TxnActor(bootstrap, unique_name("txn"))
    never.init()
    assert error_name(never.produce(topic, 0, [b"never-added"]).error_code) == "INVALID_TXN_STATE"
    hw, lso = offsets(bootstrap, topic, 0)
    assert hw == lso == 3  # two committed records and their marker: nothing hangs
    print(f"late write through a sidecar on {VERSION}: INVALID_TXN_STATE after {waited * 1000:.0f} ms")
    assert leader.metric("txnguard_verifications_total",
                         {"evidence": "log", "outcome": "late_write", "decision": "rejected"}) == 1
    assert leader.metric("txnguard_verifications_total",
                         {"evidence": "log", "outcome": "not_in_transaction", "decision": "rejected"}) == 1
    for p in sidecars.values():
        _no_hold_ran_out(p)
    assert unexpected_api_key_lines(cluster3) == 0


@pytest.mark.parametrize("client_name", list(clients.PYTHON_CLIENTS))
def test_sidecars_carry_each_client_family_exactly_on_2_8(cluster3: Cluster, sidecars, unique_name,
                                                          client_name: str) -> None:
    """Real clients through 2.8 sidecars: the leader's sidecar never sees AddPartitionsToTxn and cannot ask the
    coordinator, but its follower of __transaction_state read the add: an aborted transaction and a committed
    one, exactly the committed records read back, nothing refused, nothing hangs."""
    client = clients.PYTHON_CLIENTS[client_name]
    topic = fresh_topic(cluster3, unique_name("scfam"), replication_factor=3)
    values = [f"{client_name}-{i}".encode() for i in range(10)]
    client.run_transaction(cluster3.sidecar_bootstrap, topic, unique_name("txn"), values[:5], commit=False,
                           partition=0, timeout_s=60)
    client.run_transaction(cluster3.sidecar_bootstrap, topic, unique_name("txn"), values[5:], commit=True,
                           partition=0, timeout_s=60)
    assert client.consume_committed(cluster3.bootstrap_servers, topic) == values[5:]
    leader = sidecars[cluster3.leader(topic, 0)]
    refused = sum(p.metric("txnguard_verification_failures_total", {"reason": r}) for p in sidecars.values()
                  for r in ("not_in_transaction", "late_write", "coordinator_unavailable", "producer_fenced"))
    passed = leader.metric("txnguard_verifications_total", {"evidence": "log", "outcome": "pass",
                                                            "decision": "forwarded"})
    print(f"{client_name} through 2.8 sidecars: committed {len(values[5:])} of {len(values[5:])}, "
          f"refusals {refused:.0f}, passed on the log {passed:.0f}")
    assert refused == 0 and passed >= 2
    hw, lso = offsets(cluster3.bootstrap_servers, topic, 0)
    assert hw == lso, "nothing may hang"
    for p in sidecars.values():
        _no_hold_ran_out(p)
    assert unexpected_api_key_lines(cluster3) == 0


@pytest.mark.parametrize("java_version", ["2.8.2", "3.5.2"])
def test_sidecars_carry_the_java_copier_exactly_on_2_8_and_kcat_reads_it_back_through_them(
        cluster3: Cluster, sidecars, unique_name, java_version: str) -> None:
    """Kafka's own TransactionalMessageCopier (offsets in the transaction) through 2.8 sidecars, then kcat reads
    the output read_committed through the same sidecars."""
    source, sink = fresh_topic(cluster3, unique_name("src")), fresh_topic(cluster3, unique_name("sink"))
    values = [f"java-{i}".encode() for i in range(300)]
    clients.PYTHON_CLIENTS["confluent-kafka"].produce(cluster3.bootstrap_servers, source, values, partition=0)
    result = clients.java_transactional_copier(cluster3.sidecar_bootstrap, source, sink, unique_name("tid"),
                                               unique_name("group"), max_messages=len(values),
                                               java_version=java_version, transaction_size=50, timeout_s=120)
    assert (result.total_processed, result.remaining) == (len(values), 0)
    clients.stable_end_offsets(cluster3.bootstrap_servers, sink)
    out = clients.Kcat().consume_committed(cluster3.sidecar_bootstrap, sink)
    refused = sum(p.metric("txnguard_verification_failures_total", {"reason": r}) for p in sidecars.values()
                  for r in ("not_in_transaction", "late_write"))
    print(f"java {java_version} copier through 2.8 sidecars: copied {len(out)} of {len(values)} (read by kcat "
          f"through the sidecars), duplicates {len(out) - len(set(out))}, refusals {refused:.0f}")
    assert sorted(out) == sorted(values) and refused == 0
    assert unexpected_api_key_lines(cluster3) == 0


def test_sidecars_carry_sarama_paced_transactions_exactly_on_2_8(cluster3: Cluster, sidecars, unique_name) -> None:
    """IBM Sarama (Go), one Produce per record: every write through the leader's sidecar, which never sees
    AddPartitionsToTxn, passes on the coordinator's log."""
    topic = fresh_topic(cluster3, unique_name("sarama"), replication_factor=3)
    txn_id = unique_name("tid")
    result = clients.paced_transactions("sarama", cluster3.sidecar_bootstrap, topic, txn_id, transactions=3,
                                        per_transaction=10, timeout_s=90)
    expected = [v for t in range(3) for v in clients.paced_values(txn_id, t, 10)]
    assert (result.aborted, result.errors) == (0, [])
    assert result.committed == expected
    clients.stable_end_offsets(cluster3.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster3.bootstrap_servers, topic) == expected
    leader = sidecars[cluster3.leader(topic, 0)]
    assert leader.metric("txnguard_verifications_total", {"evidence": "log", "outcome": "pass",
                                                          "decision": "forwarded"}) >= 3
    assert sum(p.metric("txnguard_verification_failures_total", {"reason": r}) for p in sidecars.values()
               for r in ("not_in_transaction", "late_write")) == 0
    assert unexpected_api_key_lines(cluster3) == 0

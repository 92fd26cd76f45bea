"""Least privilege on an ACL cluster: 3 brokers, SASL/SCRAM-SHA-512, StandardAuthorizer, nothing allowed
that no ACL allows; and the coordinator's log on ZooKeeper-mode Kafka 2.8.2 and 3.0.2 with AclAuthorizer (one
broker each, SCRAM credentials in ZooKeeper), the authorizer most users of pre-3.6 brokers run.

    client (its own SCRAM user) ─SASL frames, untouched─▶ txnguard ─▶ broker: the broker sees the client
    txnguard ─(its own connections, User:txnguard)─▶ FindCoordinator, DescribeTransactions, Metadata,
                                                     DescribeProducers
    User:txnguard has DESCRIBE on the transactional id and DESCRIBE on the topic, nothing else.

Each right taken away gives the documented behaviour (docs/deployment/security.md): the check fails
closed with an error the client retries, a warning naming the ACL, a metric, and /readyz saying why;
once the ACL is granted again, the client's retry passes and /readyz is ready again.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import jars
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.raw import RawClient, RawProtocolError
from txnguard.testing.scenarios import TxnActor, error_name, offsets, wait_stable

pytestmark = pytest.mark.integration

PROXY, ALICE, BOB = ("txnguard", "proxy-secret"), ("alice", "alice-secret"), ("bob", "bob-secret")
USERS = dict([PROXY, ALICE, BOB])
# The clients' own rights (idempotent: creating an existing ACL is a no-op). Bob may not WRITE topics.
CLIENT_RIGHTS = [("alice", op, rtype, "*") for rtype, ops in (("TRANSACTIONAL_ID", ("WRITE", "DESCRIBE")),
                                                              ("TOPIC", ("WRITE", "DESCRIBE", "READ")),
                                                              ("GROUP", ("READ",)))
                 for op in ops] + [("bob", op, rtype, "*") for op, rtype in (
                     ("WRITE", "TRANSACTIONAL_ID"), ("DESCRIBE", "TRANSACTIONAL_ID"), ("DESCRIBE", "TOPIC"))]


def _acls(cluster, add=(), remove=()):
    """ACL changes through the Admin API on the PLAINTEXT listener (User:ANONYMOUS, the super user)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

    def binding(cls, principal, op, rtype, name, pattern="LITERAL"):
        return cls(getattr(ResourceType, rtype), name, getattr(ResourcePatternType, pattern), f"User:{principal}",
                   "*", getattr(AclOperation, op), AclPermissionType.ALLOW)

    if add:
        for f in admin.create_acls([binding(AclBinding, *a) for a in add]).values():
            f.result()
    if remove:
        for f in admin.delete_acls([binding(AclBindingFilter, *a) for a in remove]).values():
            f.result()
    time.sleep(0.5)  # every broker applies the change from the metadata log; on loopback well within this


@pytest.fixture
def acl_cluster(kafka_pool):
    cluster = kafka_pool.get("3.5.2", 3, scram_users=USERS, acls=True)
    _acls(cluster, add=CLIENT_RIGHTS)
    return cluster


def _proxy(start_proxy, cluster, password=PROXY[1], log=False):
    return start_proxy(
        upstream=",".join(f"{n.host}:{n.sasl_port}" for n in cluster.nodes), mode="gateway", client_auth="sasl",
        upstream_auth={"mechanism": "SCRAM-SHA-512", "username": PROXY[0], "password": password},
        # A check the proxy cannot decide is held a short while (0.1 of the request's 5 s), then answered. These
        # tests are about the questions the proxy asks as itself: the coordinator's log is followed only where a
        # test says so (`log`), as its own rights (DESCRIBE and READ on __transaction_state) decide it.
        verification={"hold_share": 0.1, "transaction_log": log})


def _readyz(proxy) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _warnings(capsys, event: str, *more: str) -> Any:
    """The log lines of `event` since the last call (several events: a dict of them, read at once)."""
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    found = {e: [x for x in lines if x.get("event") == e] for e in (event, *more)}
    return found if more else found[event]


def _total(proxy, sample: str) -> float:
    return sum(s.value for m in proxy.proxy.metrics.registry.collect() for s in m.samples if s.name == sample)


def _actors(proxy, cluster, txn_id: str) -> tuple[TxnActor, TxnActor]:
    """One producer, two routes: `direct` to the brokers' SASL listener for the coordinator requests, so the
    proxy holds no local evidence (another replica forwarded them, or the proxy restarted) and must ask
    the coordinator as itself; `proxied` writes through the proxy. Both authenticate as alice."""
    direct = TxnActor(",".join(f"{n.host}:{n.sasl_port}" for n in cluster.nodes), txn_id, sasl=ALICE)
    proxied = TxnActor(proxy.bootstrap, txn_id, sasl=ALICE, request_timeout_ms=5000)
    proxied.producer = direct.init()
    return direct, proxied


def test_the_least_privilege_principal_verifies_and_rejects(acl_cluster, start_proxy, unique_name, capsys):
    topic, txn = fresh_topic(acl_cluster, unique_name("acl"), partitions=2), unique_name("txn")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn), (PROXY[0], "DESCRIBE", "TOPIC", topic)])
    proxy = _proxy(start_proxy, acl_cluster)
    direct, actor = _actors(proxy, acl_cluster, txn)   # alice: the broker authenticates her, not us
    assert direct.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"clean"]).error_code == ErrorCode.none           # verified: coordinator
    r = actor.produce(topic, 1, [b"never-added"])                                     # S1: rejected by us
    assert (error_name(r.error_code), r.error_message) == ("INVALID_TXN_STATE",
                                                           "Partition was not added to the transaction")
    assert direct.end(commit=True) == ErrorCode.none
    assert offsets(acl_cluster.bootstrap_servers, topic, 1) == (0, 0)
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}) >= 1
    # Without READ on the topic the leader gives no evidence: counted, logged, not fatal (not ready stays ok).
    assert proxy.metric("txnguard_verification_authorization_failures_total",
                        {"api": "describe_producers", "operation": "READ", "resource_type": "Topic"}) >= 1
    assert _readyz(proxy) == (200, "ok\n")
    read = _warnings(capsys, "proxy_not_authorized")
    assert {(w["operation"], w["resource_type"], w["resource_name"], w["fails_closed"]) for w in read} == {
        ("READ", "Topic", topic, False)}
    assert proxy.metric("txnguard_verification_authorization_failures_total",
                        {"api": "find_coordinator", "operation": "DESCRIBE", "resource_type": "TransactionalId"}) == 0


def test_the_coordinators_log_needs_describe_and_read_on_it_and_without_them_the_proxy_works_as_before(
        acl_cluster, start_proxy, unique_name, capsys):
    """    proxy (no right on __transaction_state) ─Metadata─▶ TOPIC_AUTHORIZATION_FAILED: not followed; a log line,
           the metric, /readyz 200 with a note; writes verified with the coordinator as before
           operator: ALLOW DESCRIBE, READ on Topic __transaction_state
           a proxy started then reads the log: a write added elsewhere passes on it (evidence "log")"""
    topic, txn = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn), (PROXY[0], "DESCRIBE", "TOPIC", topic)])
    denied = _proxy(start_proxy, acl_cluster, log=True)
    denied.wait_for(lambda: denied.metric("txnguard_verification_authorization_failures_total", {
        "api": "transaction_log_metadata", "operation": "DESCRIBE", "resource_type": "Topic"}) >= 1, 30,
        "the follower refused")
    status, body = _readyz(denied)
    assert status == 200 and "may not DESCRIBE __transaction_state" in body, body
    assert _warnings(capsys, "transaction_log_not_followed")
    direct, actor = _actors(denied, acl_cluster, txn)
    assert direct.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"by the coordinator"]).error_code == ErrorCode.none
    assert denied.metric("txnguard_verifications_total",
                         {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}) == 1
    assert direct.end(commit=True) == ErrorCode.none

    rights = [(PROXY[0], op, "TOPIC", "__transaction_state") for op in ("DESCRIBE", "READ")]
    _acls(acl_cluster, add=rights)
    try:
        following = _proxy(start_proxy, acl_cluster, log=True)
        following.wait_for(lambda: _readyz(following) == (200, "ok\n"), 30, "the log read once")
        direct, actor = _actors(following, acl_cluster, unique_name("txn"))
        assert direct.add_partitions(topic, 0) == {0: 0}
        assert actor.produce(topic, 0, [b"by the log"]).error_code == ErrorCode.none
        assert following.metric("txnguard_verifications_total",
                                {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) == 1
        assert direct.end(commit=True) == ErrorCode.none
    finally:
        _acls(acl_cluster, remove=rights)


def test_a_real_client_with_its_own_identity_commits_through_the_proxy(acl_cluster, start_proxy, unique_name):
    from confluent_kafka import Producer

    topic, txn = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn), (PROXY[0], "DESCRIBE", "TOPIC", topic)])
    proxy = _proxy(start_proxy, acl_cluster)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": ALICE[0], "sasl.password": ALICE[1],
                         "transactional.id": txn})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"exactly once")
    producer.commit_transaction(30)
    del producer
    wait_stable(acl_cluster.bootstrap_servers, topic)
    assert offsets(acl_cluster.bootstrap_servers, topic, 0) == (2, 2)  # the record and the commit marker
    # Its AddPartitionsToTxn came through the proxy: the write passed on that (local) evidence.
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "local", "outcome": "pass", "decision": "forwarded"}) >= 1


def test_a_client_without_write_is_refused_by_kafka_not_by_us(acl_cluster, start_proxy, unique_name):
    from confluent_kafka import Producer

    topic, txn = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn")
    proxy = _proxy(start_proxy, acl_cluster)
    # Transactional: the coordinator refuses bob's AddPartitionsToTxn; the proxy relays the answer.
    bob = TxnActor(proxy.bootstrap, txn, sasl=BOB, request_timeout_ms=5000)
    bob.init()
    assert bob.add_partitions(topic, 0) == {0: ErrorCode.topic_authorization_failed}
    # Plain produce (nothing to verify): the leader refuses it.
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": BOB[0], "sasl.password": BOB[1],
                         "enable.idempotence": False, "message.timeout.ms": 10000})
    errors = []
    producer.produce(topic, b"not allowed", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(15)
    del producer  # librdkafka would go on reconnecting to the proxy after the test stopped it
    assert [e.name() for e in errors] == ["TOPIC_AUTHORIZATION_FAILED"]
    assert offsets(acl_cluster.bootstrap_servers, topic, 0) == (0, 0)
    # Both refusals are Kafka's answers, carried back unchanged: the proxy rewrote and rejected nothing.
    assert _total(proxy, "txnguard_error_rewrites_total") == 0
    assert _total(proxy, "txnguard_verification_failures_total") == 0


def test_no_client_can_borrow_the_proxys_principal(acl_cluster, start_proxy, unique_name, capsys):
    proxy = _proxy(start_proxy, acl_cluster)
    host, _, port = proxy.bootstrap.rpartition(":")
    # No SASL: the proxy adds no credentials of its own, so the broker's SASL listener drops the connection.
    with pytest.raises(RawProtocolError, match="closed the connection"), RawClient(host, int(port), timeout=10) as c:
        c.metadata([])
    # The proxy's user name with a guessed password: the broker refuses it.
    with pytest.raises(RawProtocolError, match=r"(?i)sasl_authentication_failed"):
        RawClient(host, int(port), timeout=10, sasl=(PROXY[0], "guess"))
    # The proxy's own password never leaves it: not on the client wire, not in its logs.
    assert PROXY[1].encode() not in proxy.wire.data()
    assert PROXY[1] not in capsys.readouterr().err


def test_without_describe_on_the_transactional_id_verification_fails_closed_and_says_why(
        acl_cluster, start_proxy, unique_name, capsys):
    topic, txn = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TOPIC", topic)])
    proxy = _proxy(start_proxy, acl_cluster)
    direct, actor = _actors(proxy, acl_cluster, txn)
    assert direct.add_partitions(topic, 0) == {0: 0}
    r = actor.produce(topic, 0, [b"unverifiable"])
    # Retriable for the client (the broker's own "cannot verify" answer); nothing written.
    assert error_name(r.error_code) == "NOT_ENOUGH_REPLICAS"
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED (txnguard's own principal)" in r.error_message
    assert offsets(acl_cluster.bootstrap_servers, topic, 0) == (0, 0)
    assert proxy.metric("txnguard_verification_authorization_failures_total",
                        {"api": "find_coordinator", "operation": "DESCRIBE", "resource_type": "TransactionalId"}) >= 1
    status, why = _readyz(proxy)
    assert status == 503 and f"User:txnguard lacks ALLOW DESCRIBE on TransactionalId '{txn}'" in why
    [warning] = [w for w in _warnings(capsys, "proxy_not_authorized") if w["resource_type"] == "TransactionalId"]
    assert (warning["principal"], warning["operation"], warning["resource_name"], warning["fails_closed"]) == (
        "User:txnguard", "DESCRIBE", txn, True)
    assert warning["fix"] == f"kafka-acls.sh --add --allow-principal User:txnguard --operation Describe " \
                             f"--transactional-id {txn}"

    # The operator grants it; the client's retry passes and the proxy is ready again.
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn)])
    assert actor.produce(topic, 0, [b"verified"]).error_code == ErrorCode.none
    assert _readyz(proxy) == (200, "ok\n")
    assert direct.end(commit=True) == ErrorCode.none


def test_without_describe_on_the_topic_a_hidden_partition_is_not_taken_for_an_unadded_one(
        acl_cluster, start_proxy, unique_name, capsys):
    """DescribeTransactions leaves out, silently, the partitions of topics the principal may not DESCRIBE:
    read naively, every first write would look unadded (INVALID_TXN_STATE, the client's transaction lost)."""
    topic, txn, txn2 = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn"), unique_name("txn")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn), (PROXY[0], "DESCRIBE", "TOPIC", topic),
                            (PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn2)])
    proxy = _proxy(start_proxy, acl_cluster)
    direct, actor = _actors(proxy, acl_cluster, txn)
    assert direct.add_partitions(topic, 0) == {0: 0}
    assert actor.produce(topic, 0, [b"first"]).error_code == ErrorCode.none   # the rights suffice
    assert direct.end(commit=True) == ErrorCode.none

    _acls(acl_cluster, remove=[(PROXY[0], "DESCRIBE", "TOPIC", topic)])
    direct, actor = _actors(proxy, acl_cluster, txn2)  # another producer: nothing in the proxy's registry
    assert direct.add_partitions(topic, 0) == {0: 0}
    r = actor.produce(topic, 0, [b"unverifiable"])
    assert error_name(r.error_code) == "NOT_ENOUGH_REPLICAS"
    assert "TOPIC_AUTHORIZATION_FAILED (txnguard's own principal)" in r.error_message
    assert proxy.metric("txnguard_verification_authorization_failures_total",
                        {"api": "metadata", "operation": "DESCRIBE", "resource_type": "Topic"}) >= 1
    status, why = _readyz(proxy)
    assert status == 503 and f"User:txnguard lacks ALLOW DESCRIBE on Topic '{topic}'" in why
    assert [w["fix"] for w in _warnings(capsys, "proxy_not_authorized") if w["operation"] == "DESCRIBE"] == [
        f"kafka-acls.sh --add --allow-principal User:txnguard --operation Describe --topic {topic}"]

    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TOPIC", topic)])
    assert actor.produce(topic, 0, [b"verified"]).error_code == ErrorCode.none
    assert _readyz(proxy) == (200, "ok\n")
    assert direct.end(commit=True) == ErrorCode.none
    wait_stable(acl_cluster.bootstrap_servers, topic)
    assert offsets(acl_cluster.bootstrap_servers, topic, 0) == (4, 4)  # 2 records, 2 commit markers


def test_refused_credentials_fail_closed_and_readyz_says_why(acl_cluster, start_proxy, unique_name, capsys):
    topic, txn = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn")
    proxy = _proxy(start_proxy, acl_cluster, password="wrong-Zq81")
    proxy.wait_for(lambda: _readyz(proxy)[0] == 503 and "could not authenticate" in _readyz(proxy)[1],
                   what="/readyz naming the refused credentials")
    direct, actor = _actors(proxy, acl_cluster, txn)  # the client's own SASL still passes through
    assert direct.add_partitions(topic, 0) == {0: 0}
    r = actor.produce(topic, 0, [b"unverifiable"])
    assert error_name(r.error_code) == "NOT_ENOUGH_REPLICAS"
    assert "SASL_AUTHENTICATION_FAILED (txnguard's own principal)" in r.error_message
    assert proxy.metric("txnguard_verification_authorization_failures_total",
                        {"api": "sasl_authenticate", "operation": "AUTHENTICATE", "resource_type": "SASL"}) >= 1
    assert "wrong-Zq81" not in capsys.readouterr().err
    assert direct.end(commit=False) == ErrorCode.none


def test_offsets_in_a_transaction_need_describe_on_consumer_offsets(acl_cluster, start_proxy, unique_name, capsys):
    """sendOffsetsToTransaction: the proxy finds the group's __consumer_offsets partition (Metadata) and the
    coordinator lists it in the transaction only to a principal that may DESCRIBE __consumer_offsets."""
    topic, txn, group = fresh_topic(acl_cluster, unique_name("acl")), unique_name("txn"), unique_name("group")
    offsets_acl = (PROXY[0], "DESCRIBE", "TOPIC", "__consumer_offsets")
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn), (PROXY[0], "DESCRIBE", "TOPIC", topic)])
    proxy = _proxy(start_proxy, acl_cluster)
    direct, actor = _actors(proxy, acl_cluster, txn)
    assert direct.add_offsets(group) == ErrorCode.none
    try:
        # Retriable for TxnOffsetCommit (as when the coordinator cannot be asked); nothing committed.
        assert actor.commit_offsets(group, {topic: {0: 0}}) == [ErrorCode.coordinator_load_in_progress]
        assert proxy.metric("txnguard_verification_authorization_failures_total",
                            {"api": "metadata", "operation": "DESCRIBE", "resource_type": "Topic"}) >= 1
        status, why = _readyz(proxy)
        assert status == 503 and "User:txnguard lacks ALLOW DESCRIBE on Topic '__consumer_offsets'" in why

        _acls(acl_cluster, add=[offsets_acl])
        assert actor.commit_offsets(group, {topic: {0: 0}}) == [ErrorCode.none]   # verified by the coordinator
        assert proxy.metric("txnguard_verifications_total",
                            {"evidence": "coordinator", "outcome": "pass", "decision": "forwarded"}) == 1
        assert direct.end(commit=True) == ErrorCode.none
    finally:
        _acls(acl_cluster, remove=[offsets_acl])  # the pooled cluster's proxy principal stays least-privileged


def test_mtls_to_the_proxy_with_sasl_inside_keeps_each_clients_own_principal(acl_cluster, start_proxy,
                                                                              unique_name, tmp_path):
    """client ══mTLS (one shared client certificate) + SASL/SCRAM══▶ txnguard ──SASL frames──▶ broker.

    The certificate admits the client to the proxy; the broker's decision follows the SASL identity."""
    from confluent_kafka import Producer

    from txnguard.testing.certificates import make_certs

    certs = make_certs(tmp_path / "certs")
    topic = fresh_topic(acl_cluster, unique_name("acl"))
    proxy = start_proxy(
        upstream=",".join(f"{n.host}:{n.sasl_port}" for n in acl_cluster.nodes), mode="gateway", client_auth="sasl",
        tls={"certfile": str(certs.server_cert), "keyfile": str(certs.server_key), "cafile": str(certs.ca),
             "require_client_cert": True},
        upstream_auth={"username": PROXY[0], "password": PROXY[1]})

    def send(user):
        producer = Producer({
            "bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(certs.ca),
            "ssl.certificate.location": str(certs.client_cert), "ssl.key.location": str(certs.client_key),
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user[0], "sasl.password": user[1],
            "enable.idempotence": False, "message.timeout.ms": 10000})
        results = []
        producer.produce(topic, user[0].encode(), on_delivery=lambda err, _m: results.append(err))
        producer.flush(15)
        return [e.name() if e else None for e in results]

    assert send(ALICE) == [None]                           # alice may WRITE
    assert send(BOB) == ["TOPIC_AUTHORIZATION_FAILED"]     # bob, same certificate, may not
    assert offsets(acl_cluster.bootstrap_servers, topic, 0) == (1, 1)


def test_txnguard_hanging_with_the_proxys_config_finds_and_aborts_as_the_proxys_principal(
        acl_cluster, unique_name, tmp_path):
    """`txnguard hanging --config` authenticates as upstream_auth says (SCRAM), on the SASL listener only.

        operator ─txnguard hanging --config proxy.yaml─▶ SASL listener, as User:txnguard
                  ◀─ the hanging transaction (DESCRIBE/READ on the topic, DESCRIBE on the id)
        operator ─--abort --yes─▶ WriteTxnMarkers (CLUSTER_ACTION) ─▶ the LSO moves past it
        operator ─same, a wrong password─▶ SASL refused: exit 1, and it says so
    """
    from test_hanging import make_open_transaction, txnguard

    topic, txn = fresh_topic(acl_cluster, unique_name("hang")), unique_name("hung")
    made = make_open_transaction(acl_cluster.bootstrap_servers, topic, txn)   # PLAINTEXT: the super user
    _acls(acl_cluster, add=[(PROXY[0], "DESCRIBE", "TOPIC", topic), (PROXY[0], "READ", "TOPIC", topic),
                            (PROXY[0], "DESCRIBE", "TRANSACTIONAL_ID", txn),
                            (PROXY[0], "CLUSTER_ACTION", "BROKER", "kafka-cluster")])

    def config(password: str) -> str:
        path = tmp_path / f"proxy-{password}.yaml"
        path.write_text(json.dumps({
            "upstream": ",".join(f"{n.host}:{n.sasl_port}" for n in acl_cluster.nodes),
            "upstream_auth": {"mechanism": "SCRAM-SHA-512", "username": PROXY[0], "password": password}}))
        return str(path)

    found = txnguard("hanging", "--config", config(PROXY[1]), "--topic", topic, "--max-transaction-timeout", "0",
                     "--json")
    assert found.returncode == 0, found.stderr
    [finding] = json.loads(found.stdout)["findings"]
    assert (finding["producer_id"], finding["start_offset"]) == (made.producer_id, made.start_offset)
    # Default flags: the scan also asks DescribeConfigs for transaction.max.timeout.ms, which this principal may not
    # (no DESCRIBE_CONFIGS on the cluster): Kafka's default is used and named, and the scan does not fail.
    own = txnguard("hanging", "--config", config(PROXY[1]), "--topic", topic, "--json")
    assert own.returncode == 0, own.stderr
    report = json.loads(own.stdout)
    assert [f["start_offset"] for f in report["findings"]] == [made.start_offset]
    assert report["unknown_transaction_timeout_ms"] == 15 * 60_000
    assert "CLUSTER_AUTHORIZATION_FAILED" in report["unknown_transaction_timeout_source"]

    wrong = txnguard("hanging", "--config", config("not-the-password"), "--topic", topic)
    assert wrong.returncode == 1 and "SASL" in wrong.stderr.upper(), (wrong.returncode, wrong.stderr)

    done = txnguard("hanging", "--config", config(PROXY[1]), "--topic", topic, "--max-transaction-timeout", "0",
                    "--abort", "--yes")
    assert done.returncode == 0, done.stderr
    wait_stable(acl_cluster.bootstrap_servers, topic, 0)   # the LSO reached the end: nothing holds it


# -- ZooKeeper mode, AclAuthorizer: the coordinator's log ---------------------------------------------------------
#
# One broker per version (the rights are the broker's decision, not the quorum's), SCRAM-SHA-512 credentials in
# ZooKeeper, `authorizer.class.name=kafka.security.authorizer.AclAuthorizer`, User:ANONYMOUS (the PLAINTEXT,
# inter-broker listener) the super user. Both versions run both cells: the cluster's start is the cost (about 4 s
# each), a cell is a proxy or two. 2.8.2 has no DescribeTransactions, so without the log a gateway has only what
# it saw itself; 3.0.2 asks the coordinator.

ZK_VERSIONS = ("2.8.2", "3.0.2")
LOG_TOPIC = "__transaction_state"
LOG_RIGHTS = [(PROXY[0], op, "TOPIC", LOG_TOPIC) for op in ("DESCRIBE", "READ")]
# What verifies a write whose AddPartitionsToTxn the proxy did not see, when the log is not followed:
# (evidence, outcome, decision) of txnguard_verifications_total.
WITHOUT_THE_LOG = {"2.8.2": ("none", "not_in_transaction", "rejected"),    # no DescribeTransactions to ask
                   "3.0.2": ("coordinator", "pass", "forwarded")}
ACLS_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "least-privilege-acls.sh"


@pytest.fixture(params=ZK_VERSIONS)
def zk_acl_cluster(request, kafka_pool):
    cluster = kafka_pool.get(request.param, 1, scram_users=USERS, acls=True, zookeeper=True)
    _acls(cluster, add=CLIENT_RIGHTS)
    return cluster


def _documented_rights(txn_prefix: str, topic_prefix: str) -> list[tuple[str, ...]]:
    """The least-privilege ACLs as deploy/least-privilege-acls.sh prints them (the docs' commands), as bindings."""
    printed = subprocess.run(["sh", str(ACLS_SCRIPT), f"User:{PROXY[0]}", txn_prefix, topic_prefix],
                             capture_output=True, text=True, check=True).stdout
    rights = []
    for line in printed.splitlines():
        args = dict(zip(*[iter(shlex.split(line)[2:])] * 2, strict=True))  # kafka-acls.sh --add, then pairs
        [(rtype, name)] = [(k[2:].replace("-", "_").upper(), v) for k, v in args.items()
                           if k in ("--topic", "--transactional-id")]
        rights.append((args["--allow-principal"].removeprefix("User:"), args["--operation"].upper(), rtype, name,
                       args.get("--resource-pattern-type", "literal").upper()))
    return rights


def _kafka_acls(cluster, *args: str) -> str:
    """kafka-acls.sh as an operator runs it: kafka.admin.AclCommand from the cluster's own Kafka."""
    run = subprocess.run(["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp",
                          jars.classpath(jars.resolve("kafka_2.13", cluster.version)), "kafka.admin.AclCommand",
                          *args], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _proxy_sees_the_log(cluster) -> bool:
    """Metadata for __transaction_state as User:txnguard: whether the broker's authorizer lets it DESCRIBE it now."""
    n = cluster.nodes[0]
    with RawClient(n.host, n.sasl_port, sasl=PROXY, timeout=10) as c:
        return c.metadata([LOG_TOPIC]).topics[0].error_code == ErrorCode.none


def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)


def _commit_through(proxy, cluster, topic: str, txn: str) -> None:
    """A real client (librdkafka, alice's SCRAM credentials) runs one transaction through the proxy: committed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": ALICE[0], "sasl.password": ALICE[1],
                         "transactional.id": txn})
    before, _ = offsets(cluster.bootstrap_servers, topic, 1)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"exactly once", partition=1)
    producer.commit_transaction(30)
    del producer  # librdkafka would go on reconnecting to the proxy after the test stopped it
    wait_stable(cluster.bootstrap_servers, topic, 1)
    assert offsets(cluster.bootstrap_servers, topic, 1) == (before + 2, before + 2)  # the record, its commit marker


def _log_refusals(proxy) -> dict[str, float]:
    return {api: proxy.metric("txnguard_verification_authorization_failures_total",
                              {"api": api, "operation": op, "resource_type": "Topic"})
            for api, op in (("transaction_log_metadata", "DESCRIBE"), ("transaction_log_fetch", "READ"))}


def test_zookeeper_acl_authorizer_the_documented_acls_let_the_follower_read_the_log(
        zk_acl_cluster, start_proxy, unique_name, capsys):
    """    operator ─the documented ACLs─▶ AclAuthorizer (ZooKeeper); __transaction_state's two with kafka-acls.sh:
               --bootstrap-server (the Admin API) on 3.0.2, --authorizer-properties zookeeper.connect= on 2.8.2
           proxy (User:txnguard) ─Metadata, Fetch __transaction_state─▶ broker: read to its end, no group, no
               right on a group
           client ─InitProducerId, AddPartitionsToTxn p0─▶ broker (not seen by the proxy)
           client ─Produce p0─▶ proxy: the log shows p0 added ─▶ forwarded (evidence "log", on 2.8.2 too)
           librdkafka (alice) ─a whole transaction─▶ proxy ─▶ broker: committed; no refusal of the log anywhere"""
    cluster = zk_acl_cluster
    topic, txn = fresh_topic(cluster, unique_name("zkacl"), partitions=2), unique_name("txn")
    _acls(cluster, add=[r for r in _documented_rights(txn, topic) if r[3] != LOG_TOPIC])
    where = (["--bootstrap-server", cluster.bootstrap_servers] if cluster.version != "2.8.2" else
             ["--authorizer-properties", f"zookeeper.connect={cluster.zookeeper_connect}"])
    _kafka_acls(cluster, *where, "--add", "--allow-principal", f"User:{PROXY[0]}", "--operation", "Describe",
                "--operation", "Read", "--topic", LOG_TOPIC)
    try:
        # Written to ZooKeeper; the broker's AclAuthorizer takes the change from its notification.
        _until(lambda: _proxy_sees_the_log(cluster), 30, "the broker applying the ACLs on __transaction_state")
        proxy = _proxy(start_proxy, cluster, log=True)
        proxy.wait_for(lambda: proxy.metric("txnguard_transaction_log_lag_seconds") >= 0, 30, "the log read once")
        status, body = _readyz(proxy)
        assert status == 200 and body.startswith("ok") and "transaction log" not in body, body

        direct, actor = _actors(proxy, cluster, txn)
        assert direct.add_partitions(topic, 0) == {0: 0}
        assert actor.produce(topic, 0, [b"added elsewhere"]).error_code == ErrorCode.none
        assert proxy.metric("txnguard_verifications_total",
                            {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) == 1
        assert direct.end(commit=True) == ErrorCode.none
        _commit_through(proxy, cluster, topic, f"{txn}-client")   # the prefix its rights name

        assert _log_refusals(proxy) == {"transaction_log_metadata": 0, "transaction_log_fetch": 0}
        assert _warnings(capsys, "transaction_log_not_followed") == []
    finally:
        _acls(cluster, remove=LOG_RIGHTS)   # the pooled cluster's proxy principal goes back to no right on the log


def test_zookeeper_acl_authorizer_without_the_logs_acls_the_follower_is_refused_and_the_proxy_works_as_before(
        zk_acl_cluster, start_proxy, unique_name, capsys):
    """    proxy (every documented right but those on __transaction_state) ─Metadata─▶ TOPIC_AUTHORIZATION_FAILED:
               `transaction_log_not_followed` and `proxy_not_authorized` (fix: the kafka-acls command), the metric
               {api="transaction_log_metadata"}, /readyz 200 with the note
           librdkafka (alice) ─a whole transaction─▶ proxy: committed on local evidence, as without the log
           client ─Produce p0 added elsewhere─▶ proxy: 3.0.2 asks the coordinator (pass); 2.8.2 has no one to ask
               (INVALID_TXN_STATE at once, the client's abort and redo pass), as with `transaction_log: false`
           operator ─DESCRIBE only─▶ a proxy started then: Metadata passes, Fetch ─▶ TOPIC_AUTHORIZATION_FAILED:
               {api="transaction_log_fetch", operation="READ"}, not followed, works as before"""
    cluster = zk_acl_cluster
    topic, txn = fresh_topic(cluster, unique_name("zkacl"), partitions=2), unique_name("txn")
    _acls(cluster, add=[r for r in _documented_rights(txn, topic) if r[3] != LOG_TOPIC])
    assert not _proxy_sees_the_log(cluster)
    proxy = _proxy(start_proxy, cluster, log=True)
    proxy.wait_for(lambda: _log_refusals(proxy)["transaction_log_metadata"] >= 1, 30, "the follower refused")
    status, body = _readyz(proxy)
    assert status == 200 and f"the proxy may not DESCRIBE {LOG_TOPIC}" in body, body
    said = _warnings(capsys, "transaction_log_not_followed", "proxy_not_authorized")
    assert any(f"may not DESCRIBE {LOG_TOPIC}" in w["detail"] for w in said["transaction_log_not_followed"]), said
    [refused] = [w for w in said["proxy_not_authorized"] if w["resource_name"] == LOG_TOPIC]
    assert (refused["operation"], refused["fails_closed"], refused["fix"]) == (
        "DESCRIBE", False, f"kafka-acls.sh --add --allow-principal User:{PROXY[0]} --operation Describe "
                           f"--topic {LOG_TOPIC}")

    _commit_through(proxy, cluster, topic, f"{txn}-client")
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": "local", "outcome": "pass", "decision": "forwarded"}) >= 1

    direct, actor = _actors(proxy, cluster, txn)
    assert direct.add_partitions(topic, 0) == {0: 0}
    evidence, outcome, decision = WITHOUT_THE_LOG[cluster.version]
    r = actor.produce(topic, 0, [b"added elsewhere"])
    assert error_name(r.error_code) == ("NONE" if decision == "forwarded" else "INVALID_TXN_STATE"), r
    assert proxy.metric("txnguard_verifications_total",
                        {"evidence": evidence, "outcome": outcome, "decision": decision}) == 1
    assert direct.end(commit=decision == "forwarded") == ErrorCode.none
    assert _log_refusals(proxy)["transaction_log_fetch"] == 0  # never got as far as a Fetch

    # DESCRIBE without READ: the follower finds the log's partitions, and may not Fetch them.
    describe_only = [LOG_RIGHTS[0]]
    _acls(cluster, add=describe_only)
    try:
        _until(lambda: _proxy_sees_the_log(cluster), 30, "the broker applying DESCRIBE on __transaction_state")
        fetching = _proxy(start_proxy, cluster, log=True)
        fetching.wait_for(lambda: _log_refusals(fetching)["transaction_log_fetch"] >= 1, 30, "the Fetch refused")
        since, first = time.monotonic(), _log_refusals(fetching)["transaction_log_fetch"]
        status, body = _readyz(fetching)
        assert status == 200 and f"Fetch of {LOG_TOPIC}-" in body, body
        assert _log_refusals(fetching)["transaction_log_metadata"] == 0
        _commit_through(fetching, cluster, topic, f"{txn}-again")
        assert fetching.metric("txnguard_verifications_total",
                               {"evidence": "log", "outcome": "pass", "decision": "forwarded"}) == 0
        # The refused Fetch is asked again after a backoff (up to 5 s), not at once: each counts its 10 partitions.
        rate = (_log_refusals(fetching)["transaction_log_fetch"] - first) / (time.monotonic() - since)
        assert rate < 100, f"{rate:.0f} refused partitions a second: the follower loops on the refusal"
    finally:
        _acls(cluster, remove=describe_only)

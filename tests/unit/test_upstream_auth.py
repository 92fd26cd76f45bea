"""The proxy's own principal: upstream_auth settings, the right each refusal names, and what /readyz says."""

import json

import pytest
from kio.schema.errors import ErrorCode

from txnguard.proxy import logs
from txnguard.proxy.access_report import AccessMonitor
from txnguard.proxy.config import ConfigError, load
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.access import missing_acl, refused
from txnguard.verification.verdicts import Outcome


def _load(tmp_path, text, environ=None):
    p = tmp_path / "txnguard.yaml"
    p.write_text("upstream: a:1\n" + text)
    return load(p, environ=environ or {})


def test_a_password_file_is_read_at_each_connection_and_never_shown(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    auth = _load(tmp_path, f"upstream_auth: {{username: txnguard, password_file: {secret}}}\n").upstream_auth
    assert (auth.mechanism, auth.principal, auth.secret()) == ("SCRAM-SHA-512", "User:txnguard", "s3cret")
    secret.write_text("rotated")
    assert auth.secret() == "rotated"
    assert "s3cret" not in repr(_load(tmp_path, "upstream_auth: {username: u, password: s3cret}\n"))


def test_the_environment_gives_the_password_as_written(tmp_path):
    # Parsed as YAML, "0123" would be the number 123 and "true" a boolean: neither is the password.
    for password in ("0123", "true", "a: b"):
        cfg = _load(tmp_path, "upstream_auth: {username: txnguard, password_file: null}\n",
                    environ={"TXNGUARD_UPSTREAM_AUTH__PASSWORD": password})
        assert cfg.upstream_auth.secret() == password


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("upstream_auth: {username: u}\n", "upstream_auth: set exactly one of password"),
        ("upstream_auth: {username: u, password: p, password_file: /etc/hostname}\n", "set exactly one of"),
        ("upstream_auth: {username: u, password: p, mechanism: GSSAPI}\n",
         "upstream_auth.mechanism: 'GSSAPI' is not one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN"),
        ("upstream_auth: {username: '', password: p}\n", "upstream_auth.username: required"),
        ("upstream_auth: {username: u, password: 1234}\n", "upstream_auth.password: must be a non-empty string"),
        ("upstream_auth: {username: u, password_file: /nope}\n",
         "upstream_auth.password_file: '/nope' is not a readable file"),
        ("upstream_auth: {user: u, password: p}\n", "upstream_auth.user: unknown setting"),
    ],
)
def test_upstream_auth_errors_name_the_setting_never_the_secret(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    assert message in str(e.value)
    assert "1234" not in str(e.value)  # a wrongly typed password is not echoed either


@pytest.mark.parametrize(
    ("api", "code", "right"),
    [
        ("find_coordinator", ErrorCode.transactional_id_authorization_failed,
         ("DESCRIBE", "TransactionalId", "t", True)),
        ("describe_transactions", ErrorCode.transactional_id_authorization_failed,
         ("DESCRIBE", "TransactionalId", "t", True)),
        ("metadata", ErrorCode.topic_authorization_failed, ("DESCRIBE", "Topic", "t", True)),
        ("describe_producers", ErrorCode.topic_authorization_failed, ("READ", "Topic", "t", False)),
        ("add_partitions_to_txn_verify_only", ErrorCode.cluster_authorization_failed,
         ("CLUSTER_ACTION", "Cluster", "kafka-cluster", True)),
        ("sasl_authenticate", ErrorCode.sasl_authentication_failed, ("AUTHENTICATE", "SASL", "t", True)),
        ("sasl_authenticate", ErrorCode.unsupported_sasl_mechanism, ("AUTHENTICATE", "SASL", "t", True)),
    ],
)
def test_each_refusal_names_the_right_the_proxys_principal_lacks(api, code, right):
    missing = missing_acl(api, code, "t")
    assert missing is not None
    assert (missing.operation, missing.resource_type, missing.name, missing.essential) == right


def test_errors_that_are_not_the_proxys_own_authorization_name_nothing():
    assert missing_acl("find_coordinator", ErrorCode.coordinator_not_available, "t") is None
    assert missing_acl("describe_producers", ErrorCode.not_leader_or_follower, "t") is None
    # A topic error from DescribeTransactions cannot happen (it filters); not mistaken for a missing right.
    assert missing_acl("describe_transactions", ErrorCode.topic_authorization_failed, "t") is None


def test_a_refusal_fails_closed_with_a_verdict_the_client_retries():
    missing = missing_acl("find_coordinator", ErrorCode.transactional_id_authorization_failed, "app-1")
    assert missing is not None
    v = refused(missing, "User:txnguard")
    assert v.outcome is Outcome.COORDINATOR_RETRIABLE and not v.passed
    assert v.underlying == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED (txnguard's own principal)"
    assert v.detail == ("cannot verify: User:txnguard lacks ALLOW DESCRIBE on TransactionalId 'app-1' "
                        "(find_coordinator answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_readyz_says_why_until_the_right_is_proved_or_the_refusal_is_old(capsys):
    logs.configure("info")
    metrics, clock = ProxyMetrics(), _Clock()
    access = AccessMonitor(metrics, "User:txnguard", window_s=60, clock=clock)
    txn = missing_acl("describe_transactions", ErrorCode.transactional_id_authorization_failed, "app-1")
    read = missing_acl("describe_producers", ErrorCode.topic_authorization_failed, "orders")
    assert txn is not None and read is not None
    access.refused(read)
    assert access.not_ready() is None          # READ only costs the leader's evidence: still ready
    access.refused(txn)
    access.refused(txn)
    assert access.not_ready() == ("verification fails closed: User:txnguard lacks ALLOW DESCRIBE on "
                                  "TransactionalId 'app-1' (describe_transactions answered "
                                  "TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
    assert metrics.registry.get_sample_value("txnguard_verification_authorization_failures_total", {
        "api": "describe_transactions", "operation": "DESCRIBE", "resource_type": "TransactionalId"}) == 2
    access.proved(("DESCRIBE", "TransactionalId", "app-1"))
    assert access.not_ready() is None
    access.refused(txn)
    clock.now = 61
    assert access.not_ready() is None          # nobody asked for a minute: the refusal is forgotten
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    # One warning per right per 30 s, again after it was proved and refused anew.
    assert [(x["event"], x.get("operation")) for x in lines] == [
        ("proxy_not_authorized", "READ"), ("proxy_not_authorized", "DESCRIBE"),
        ("proxy_authorized_again", "DESCRIBE"), ("proxy_not_authorized", "DESCRIBE")]

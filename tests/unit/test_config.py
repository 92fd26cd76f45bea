"""Configuration: YAML, then TXNGUARD_* environment, then flags; every error names key and value."""

import pytest

from txnguard.proxy.config import ConfigError, load


def _write(tmp_path, text):
    p = tmp_path / "txnguard.yaml"
    p.write_text(text)
    return p


def test_file_then_environment_then_flags(tmp_path):
    path = _write(tmp_path, "upstream: a:1\nlisten: 127.0.0.1:9000\nlimits: {max_in_flight: 10}\n")
    cfg = load(path, {"listen": "127.0.0.1:9100"},
               environ={"TXNGUARD_MODE": "gateway", "TXNGUARD_LIMITS__MAX_IN_FLIGHT": "50", "TXNGUARD_LISTEN": "x:1"})
    assert cfg.limits.max_in_flight == 50          # environment over file
    assert str(cfg.listen) == "127.0.0.1:9100"     # flag over environment
    assert [str(u) for u in cfg.upstream] == ["a:1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("upstream: a:1\nmode: mesh\n", "mode: 'mesh' is not one of gateway, sidecar"),
        ("upstream: a:1\nlimits: {max_in_flight: -3}\n", "limits.max_in_flight: -3 is not a positive integer"),
        ("upstream: a:1\nlimits: {max_inflight: 3}\n", "limits.max_inflight: unknown setting"),
        ("upstream: nohost\n", "upstream: 'nohost' is not host:port"),
        ("listen: 127.0.0.1:1\n", "upstream: required"),
        ("upstream: [a:1, b:2]\nmode: sidecar\n", "sidecar mode forwards to exactly one broker"),
        ("upstream: a:1\ntls: {certfile: /nope, keyfile: /nope}\n", "tls.certfile: '/nope' is not a readable file"),
        ("upstream: a:1\npolicy: {mode: sometimes}\n", "policy.mode: 'sometimes' is not one of enforce, monitor, off"),
        ("upstream: a:1\nverification: {evidence_ttl_ms: -1}\n", "verification.evidence_ttl_ms: -1"),
        ("upstream: a:1\nverification: {coordinator_evidence: ask_nicely}\n",
         "verification.coordinator_evidence: 'ask_nicely' is not one of describe_transactions, verify_only"),
        ("upstream: a:1\nverification: {evidence_ttl_ms: 5, coordinator_evidence: x}\n",
         "verification.coordinator_evidence: 'x'"),
        ("upstream: a:1\n: [\n", "not valid YAML"),
        ("- a\n- b\n", "the top level must be a mapping"),
    ],
)
def test_errors_name_the_key_the_value_and_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        load(_write(tmp_path, text), environ={})
    assert message in str(e.value)


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.yaml", environ={})


def test_broker_ports_follow_the_bootstrap_port_unless_mapped(tmp_path):
    cfg = load(None, {"upstream": "a:1", "listen": "127.0.0.1:9092"}, environ={})
    assert cfg.broker_port(1) == 9094
    cfg = load(None, {"upstream": "a:1", "listen": "127.0.0.1:9092", "broker_port_base": 30000,
                      "broker_ports": {2: 31000}}, environ={})
    assert (cfg.broker_port(1), cfg.broker_port(2)) == (30001, 31000)


def test_yaml_off_is_a_policy_mode_not_a_boolean(tmp_path):
    # YAML 1.1 reads `off` as False: the example rule in the policy docs was refused.
    path = _write(tmp_path, 'upstream: a:1\npolicy:\n  mode: monitor\n  rules: [{topic: "audit.*", mode: off}]\n')
    cfg = load(path, environ={})
    assert cfg.policy.as_mapping()["rules"] == [{"topic": "audit.*", "mode": "off"}]  # what the proxy builds from


def test_environment_off_is_a_policy_mode_and_true_stays_a_boolean(tmp_path):
    cfg = load(None, environ={"TXNGUARD_UPSTREAM": "a:1", "TXNGUARD_POLICY__MODE": "off",
                              "TXNGUARD_VERIFICATION__ENABLED": "true"})
    assert cfg.policy.as_mapping()["mode"] == "off"
    assert cfg.verification.enabled is True


def test_a_bracketed_ipv6_upstream_from_the_environment_is_a_host_port():
    cfg = load(None, environ={"TXNGUARD_UPSTREAM": "[::1]:9092"})
    assert [(u.host, u.port) for u in cfg.upstream] == [("::1", 9092)]


def test_yes_and_no_are_not_booleans_so_a_boolean_setting_says_what_it_wants(tmp_path):
    path = _write(tmp_path, "upstream: a:1\nverification: {enabled: no}\n")
    with pytest.raises(ConfigError, match=r"verification\.enabled: 'no' is not true or false"):
        load(path, environ={})

"""One configuration schema: the models give the loader, the JSON Schema, the shipped copies, the reference
and `check-config --show`, and they all agree.

    ProxyConfig (pydantic) ─▶ txnguard config-schema ─▶ deploy/schema/txnguard.schema.json (equal, checked here)
                           │                         └▶ the chart's values.schema.json `config:` (equal)
                           ├▶ load(): file, TXNGUARD_* (pydantic-settings), flags ─▶ messages read from the schema
                           └▶ config-schema --markdown (the reference) / check-config --show (value and origin)
"""

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from txnguard import cli
from txnguard.policies.outcomes import Outcome
from txnguard.proxy import config, config_reference
from txnguard.proxy.config import ConfigError, load, load_with_origins

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "deploy").rglob("*.yaml") if "helm" not in p.parts)


def _validator() -> Draft202012Validator:
    schema = json.loads((ROOT / config_reference.SCHEMA_FILE).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _as_json(raw):
    return json.loads(json.dumps(raw))  # what an editor or Helm sees: mapping keys are strings


def _schema_errors(raw) -> list[str]:
    # best_match goes into a union (`policy: null` or a section) for the error an editor would show.
    errors = [best_match([e]) for e in _validator().iter_errors(_as_json(raw))]
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]


def test_the_shipped_schema_is_the_generated_one():
    assert (ROOT / config_reference.SCHEMA_FILE).read_text() == config_reference.schema_text(), \
        "run `txnguard config-schema --write`"


def test_the_charts_values_schema_carries_the_same_schema_for_config():
    shipped = json.loads((ROOT / config_reference.HELM_VALUES_SCHEMA).read_text())
    assert shipped == config_reference.helm_values_schema(shipped), "run `txnguard config-schema --write`"
    generated = config.schema()
    assert shipped["properties"]["config"]["$ref"] == "#/$defs/TxnguardConfig"
    assert shipped["$defs"]["TxnguardConfig"]["properties"] == generated["properties"]
    assert all(shipped["$defs"][name] == d for name, d in generated["$defs"].items())


@pytest.mark.parametrize("path", [str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_example_configurations_validate_against_the_schema(path):
    raw = config.load_file(ROOT / path)
    assert _schema_errors(raw) == []
    load(ROOT / path, environ={})  # and the loader agrees


def test_a_broken_example_is_refused_by_the_schema_and_the_loader_names_key_and_value(tmp_path):
    # Negative control for the test above: one wrong value, and both checks must say so.
    text = (ROOT / "deploy" / "gateway.yaml").read_text().replace("max_in_flight: 1000", "max_in_flight: -3")
    assert "max_in_flight: -3" in text
    broken = tmp_path / "gateway.yaml"
    broken.write_text(text)
    assert _schema_errors(config.load_file(broken)) == ["limits.max_in_flight: -3 is less than or equal to the "
                                                         "minimum of 0"]
    with pytest.raises(ConfigError, match=r"^limits\.max_in_flight: -3 is not a positive integer$"):
        load(broken, environ={})


# Each snippet: the schema's verdict and the loader's must be the same (both from the same models).
AGREEMENT = [
    ("upstream: a:1", True),
    ("upstream: [a:1, '[::1]:9092']", True),
    ("upstream: a:1,b:2\nmode: gateway", True),
    ("upstream: a:1\nupstream_tls: true", True),
    ("upstream: a:1\nupstream_tls: false", True),
    ("upstream: a:1\npolicy:\nhealth:\n", True),  # sections whose lines are all commented out
    ("upstream: a:1\nbroker_ports: {2: 31000}", True),
    ("upstream: a:1\npolicy: {mode: monitor, rules: [{topic: 'audit.*', mode: off}]}", True),
    ("upstream: a:1\npolicy: {errors: {kafka-python: {produce: {not_in_transaction: 120}}}}", True),
    ("upstream: a:1\naudit: {topic: t, bootstrap: 'k1:9092,k2:9092', producer: {linger.ms: 5}}", True),
    ("upstream: a:1\nverification: {hold_share: 0, evidence_ttl_ms: 0}", True),
    ("upstream: a:1\nhealth: {concurrent_transactions_budget_ms: 0}", True),
    ("upstream: a:1\nmode: mesh", False),
    ("upstream: nohost", False),
    ("upstream: a:1\nlimits: {max_in_flight: 0}", False),
    ("upstream: a:1\nlimits: {max_inflight: 3}", False),
    ("upstream: a:1\nlimits: {idle_timeout_s: soon}", False),
    ("upstream: a:1\nverification: {enabled: no}", False),
    ("upstream: a:1\nverification: {hold_share: 1.5}", False),
    ("upstream: a:1\nverification: {coordinator_evidence: ask_nicely}", False),
    ("upstream: a:1\nbroker_ports: {x: 1}", False),
    ("upstream: a:1\nbroker_port_base: 70000", False),
    ("upstream: a:1\npolicy: {mode: sometimes}", False),
    ("upstream: a:1\npolicy: {rules: [{topic: x}]}", False),
    ("upstream: a:1\npolicy: {errors: {java: {fetch: {late_write: 1}}}}", False),
    ("upstream: a:1\npolicy: {errors: {java: {produce: {pass: 1}}}}", False),
    ("upstream: a:1\naudit: {topic: ''}", False),
    ("upstream: a:1\nupstream_auth: {username: u, password: p, mechanism: GSSAPI}", False),
    ("upstream: a:1\nlog_level: loud", False),
]


@pytest.mark.parametrize(("text", "valid"), AGREEMENT)
def test_the_schema_and_the_loader_agree(text, valid):
    raw = config.parse_yaml(text)
    assert (_schema_errors(raw) == []) is valid, _schema_errors(raw)
    try:
        config.from_mapping(raw)
    except ConfigError as e:
        assert not valid, str(e)
    else:
        assert valid, "the loader accepted it"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("upstream: a:1\nbroker_ports: {x: 1}", "broker_ports.x: 'x' is not a non-negative integer"),
        ("upstream: a:1\nbroker_port_base: 70000", "broker_port_base: 70000 is not an integer from 1 to 65535"),
        ("upstream: a:1\npolicy: {errors: {java: {fetch: {late_write: 1}}}}",
         "policy.errors.java.fetch: 'fetch' is not one of produce, txn_offset_commit"),
        ("upstream: a:1\npolicy: {rules: [{topic: x}]}", "policy.rules[0].mode: required"),
        ("upstream: a:1\nverification: {hold_share: 1.5}", "verification.hold_share: 1.5 is not a share between 0 and "
         "1 of the request's timeout (0: no hold; more than 1 would answer after the client gave up)"),
        ("upstream: a:1\nadvertised_host: ''", "advertised_host: '' is not a host name"),
        ("upstream: a:1\nlimits: {low_water_bytes: 9, high_water_bytes: 8}",
         "limits.low_water_bytes: 9 is above limits.high_water_bytes"),
        ("upstream: a:1\nhealth: {concurrent_transactions_budget_ms: -1}",
         "health.concurrent_transactions_budget_ms: -1 is not a non-negative number"),
        ("upstream: a:1\nlimits: {max_in_flight: 5, max_connections: 0}\nlog_level: loud",
         "limits.max_connections: 0 is not a positive integer\nlog_level: 'loud' is not one of debug, info, "
         "warning, error"),
    ],
)
def test_more_messages_name_the_key_the_value_and_what_it_should_be(text, message):
    with pytest.raises(ConfigError) as e:
        config.from_mapping(config.parse_yaml(text))
    assert str(e.value) == message


def test_the_policy_outcomes_are_every_outcome_but_pass():
    assert {o.value for o in config.RefusedOutcome} == {o.value for o in Outcome if o is not Outcome.PASS}


def test_an_unknown_txnguard_variable_is_refused_and_the_tools_own_are_not():
    with pytest.raises(ConfigError, match=r"TXNGUARD_LIMTS__MAX_IN_FLIGHT: unknown setting \(known: .*limits"):
        load(None, environ={"TXNGUARD_UPSTREAM": "a:1", "TXNGUARD_LIMTS__MAX_IN_FLIGHT": "5"})
    with pytest.raises(ConfigError, match=r"^limits\.max_inflight: unknown setting"):
        load(None, environ={"TXNGUARD_UPSTREAM": "a:1", "TXNGUARD_LIMITS__MAX_INFLIGHT": "5"})
    tools = {name: "x" for name in config.NOT_SETTINGS}
    assert [str(u) for u in load(None, environ={"TXNGUARD_UPSTREAM": "a:1", **tools}).upstream] == ["a:1"]


def test_origins_say_file_environment_flag_or_default(tmp_path):
    path = tmp_path / "txnguard.yaml"
    path.write_text("upstream: a:1\nlisten: 127.0.0.1:9000\nlimits: {max_in_flight: 10, idle_timeout_s: 60}\n")
    loaded = load_with_origins(path, {"listen": "127.0.0.1:9100", "mode": None},
                               environ={"TXNGUARD_LIMITS__MAX_IN_FLIGHT": "50", "TXNGUARD_LISTEN": "x:1"})
    rows = {k: (v, o) for k, v, o in config_reference.effective(loaded)}
    assert rows["upstream"] == (["a:1"], f"file {path}")
    assert rows["listen"] == ("127.0.0.1:9100", "flag --listen")
    assert rows["limits.max_in_flight"] == (50, "environment TXNGUARD_LIMITS__MAX_IN_FLIGHT")
    assert rows["limits.idle_timeout_s"] == (60.0, f"file {path}")
    assert rows["limits.drain_timeout_s"] == (30.0, "default")
    assert rows["mode"] == ("gateway", "default")
    assert len(rows) == len(config_reference._flat(loaded.config.model_dump(mode="json")))


def test_check_config_show_prints_every_setting_with_its_origin_and_masks_secrets(tmp_path, monkeypatch, capsys):
    path = tmp_path / "txnguard.yaml"
    path.write_text("upstream: a:1\naudit: {topic: t, producer: {sasl.password: hunter2, linger.ms: 5}}\n"
                    "upstream_auth: {username: txnguard}\n")
    monkeypatch.setenv("TXNGUARD_UPSTREAM_AUTH__PASSWORD", "s3cret-0123")
    monkeypatch.setenv("TXNGUARD_LIMITS__MAX_IN_FLIGHT", "50")
    assert cli.main(["check-config", str(path), "--show", "--listen", "127.0.0.1:9100"]) == 0
    out = capsys.readouterr().out
    assert "s3cret-0123" not in out and "hunter2" not in out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()[1:]}
    assert lines["upstream_auth.password"].endswith("# environment TXNGUARD_UPSTREAM_AUTH__PASSWORD")
    assert '"**********"' in lines["upstream_auth.password"]
    assert '"sasl.password": "**********"' in lines["audit.producer"] and '"linger.ms": 5' in lines["audit.producer"]
    assert lines["listen"].endswith("# flag --listen") and lines["upstream"].endswith(f"# file {path}")
    assert lines["limits.max_in_flight"].endswith("# environment TXNGUARD_LIMITS__MAX_IN_FLIGHT")
    assert lines["verification.timeout_s"].endswith("# default")


def test_config_schema_prints_the_schema_and_the_markdown_reference(capsys):
    assert cli.main(["config-schema"]) == 0
    assert json.loads(capsys.readouterr().out) == config.schema()
    assert cli.main(["config-schema", "--markdown"]) == 0
    assert capsys.readouterr().out == config_reference.markdown()


def _settings(model, prefix=""):
    for name, field in model.model_fields.items():
        yield prefix + name
        ann = field.annotation
        if getattr(ann, "__origin__", None) is tuple:  # tuple[Section, ...]: a list of sections
            ann, name = ann.__args__[0], name + "[]"
        for inner in (ann, *getattr(ann, "__args__", ())):  # Section or Section | None
            if isinstance(inner, type) and issubclass(inner, config.BaseModel):
                yield from _settings(inner, f"{prefix}{name}.")


def test_the_markdown_reference_has_a_row_for_every_setting_with_its_choices():
    text = config_reference.markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    keys = [row.split("`")[1] for row in rows]
    settings = list(_settings(config.ProxyConfig))
    assert len(settings) > 80 and sorted(keys) == sorted(settings)
    mode = next(row for row in rows if row.startswith("| `mode` "))
    assert "`gateway` \\| `sidecar`" in mode and "`TXNGUARD_MODE`" in mode
    hold = next(row for row in rows if row.startswith("| `verification.hold_share` "))
    assert "number >= 0, <= 1" in hold and "`0.8`" in hold
    assert "## `policy.rules[]`" in text  # a heading for each nested section

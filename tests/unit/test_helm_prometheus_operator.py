"""The chart's optional Prometheus Operator objects: off by default; on, valid and the repository's own alerts.

    helm template (default values) ─▶ no monitoring.coreos.com object
    helm template (prometheusOperator.*.enabled) ─▶ ServiceMonitor + PrometheusRule
        ─▶ jsonschema against tests/data/prometheus-operator/ (the CRDs' structural schemas, their source named
           in the file) ─▶ the ServiceMonitor selects the rendered Service and scrapes its `admin` port
        ─▶ the PrometheusRule's groups are grafana/alerts.yaml's (runbook_url prefixed) ─▶ promtool check rules

The chart cannot read grafana/alerts.yaml (Helm reads only the chart's own files): it carries a copy,
files/alerts.yaml, which must stay byte for byte the same.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "txnguard"
ALERTS = ROOT / "grafana" / "alerts.yaml"
HELM = Path.home() / ".cache" / "txnguard" / "bin" / "helm"
CRD_SCHEMAS = json.loads((ROOT / "tests" / "data" / "prometheus-operator" / "monitoring.coreos.com-v1.schema.json")
                         .read_text())
ENABLED = ("--set", "prometheusOperator.serviceMonitor.enabled=true",
           "--set", "prometheusOperator.prometheusRule.enabled=true",
           "--set", "prometheusOperator.serviceMonitor.labels.release=kube-prometheus-stack",
           "--set", "prometheusOperator.prometheusRule.labels.release=kube-prometheus-stack",
           "--set", "prometheusOperator.prometheusRule.runbookBaseUrl=https://docs.example/txnguard/")


def _render(shape: str, *flags: str) -> list[dict[str, Any]]:
    done = subprocess.run([str(HELM), "template", "kafka", str(CHART), "--namespace", "streaming",
                           "--set", f"shape={shape}", *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind]
    return found


def _errors(kind: str, document: dict[str, Any]) -> list[str]:
    schema = {**CRD_SCHEMAS, "$ref": f"#/$defs/{kind}"}
    return [f"{list(e.absolute_path)}: {e.message}" for e in Draft202012Validator(schema).iter_errors(document)]


@pytest.mark.parametrize("shape", ["gateway", "sidecar"])
def test_nothing_of_the_operator_is_rendered_by_default(shape):
    assert [d["kind"] for d in _render(shape) if d["apiVersion"].startswith("monitoring.coreos.com")] == []


@pytest.mark.parametrize("shape", ["gateway", "sidecar"])
def test_the_service_monitor_validates_and_scrapes_the_admin_port_of_the_rendered_service(shape):
    docs = _render(shape, *ENABLED)
    monitor = _one(docs, "ServiceMonitor")
    assert _errors("ServiceMonitor", monitor) == []
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The Services it selects: the shape's own, with a port named `admin` (the proxy's /metrics).
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [d for d in docs if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()]
    assert selected and all("admin" in {p["name"] for p in s["spec"]["ports"]} for s in selected)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["streaming"]}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("admin", "/metrics")]
    # TxnguardDown selects up{job=~".*txnguard.*"}: the job is set to the release's txnguard name.
    [relabel] = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "job" and "txnguard" in relabel["replacement"]


def test_shape_sidecar_container_scrapes_the_port_its_component_adds_to_your_service():
    # The chart renders no Service of its own there: without the Service's labels it refuses to guess.
    done = subprocess.run([str(HELM), "template", "kafka", str(CHART), "--set", "shape=sidecar-container",
                           "--set", "prometheusOperator.serviceMonitor.enabled=true"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "prometheusOperator.serviceMonitor.selector" in done.stderr, done.stderr
    docs = _render("sidecar-container", "--set", "prometheusOperator.serviceMonitor.enabled=true",
                   "--set", "prometheusOperator.serviceMonitor.selector.app=kafka")
    monitor = _one(docs, "ServiceMonitor")
    assert _errors("ServiceMonitor", monitor) == []
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "kafka"}}
    component = _one(docs, "Component")
    service_patch = next(p["patch"] for p in component["patches"] if p["target"]["kind"] == "Service")
    port = monitor["spec"]["endpoints"][0]["port"]
    assert f"name: {port}," in service_patch  # the port the component adds to the Service


def test_the_prometheus_rule_validates_and_carries_the_shipped_alerts_with_full_runbook_links():
    rule = _one(_render("gateway", *ENABLED), "PrometheusRule")
    assert _errors("PrometheusRule", rule) == []
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    shipped = yaml.safe_load(ALERTS.read_text())["groups"]
    for group in shipped:
        for r in group["rules"]:
            r["annotations"]["runbook_url"] = "https://docs.example/txnguard/" + r["annotations"]["runbook_url"]
    assert rule["spec"]["groups"] == shipped
    hanging = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "TxnguardHangingTransaction")
    assert "health.hanging_scan_interval_s" in hanging["annotations"]["description"]


def test_without_a_base_url_the_runbook_links_stay_the_shipped_paths():
    rule = _one(_render("gateway", "--set", "prometheusOperator.prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_the_rendered_rule_groups_pass_promtool(tmp_path):
    rule = _one(_render("gateway", *ENABLED), "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "SUCCESS: 6 rules found" in done.stdout, done.stdout + done.stderr


def test_the_chart_carries_the_shipped_alerts_unchanged():
    assert (CHART / "files" / "alerts.yaml").read_bytes() == ALERTS.read_bytes(), \
        "cp grafana/alerts.yaml deploy/helm/txnguard/files/alerts.yaml"


def test_the_schemas_refuse_what_the_crds_would():
    # Negative controls: the same objects, each with one mistake the operator's CRDs refuse or drop.
    docs = _render("gateway", *ENABLED)
    monitor, rule = _one(docs, "ServiceMonitor"), _one(docs, "PrometheusRule")
    endpoint = monitor["spec"]["endpoints"][0]
    assert _errors("ServiceMonitor", {**monitor, "spec": {**monitor["spec"], "endpoints": [
        {**endpoint, "interval": "30 seconds"}]}}) != []
    assert _errors("ServiceMonitor", {**monitor, "spec": {"endpoint": monitor["spec"]["endpoints"],
                                                          "selector": monitor["spec"]["selector"]}}) != []
    first = rule["spec"]["groups"][0]
    broken = {**first, "rules": [{**first["rules"][0], "for": "two minutes"}]}
    assert _errors("PrometheusRule", {**rule, "spec": {"groups": [broken]}}) != []
    assert _errors("PrometheusRule", {**rule, "spec": {"groups": [{"rules": first["rules"]}]}}) != []


def test_helm_lint_is_clean_with_both_on_and_refuses_a_misspelled_setting():
    done = subprocess.run([str(HELM), "lint", "--strict", str(CHART), *ENABLED], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr
    wrong = subprocess.run([str(HELM), "template", "kafka", str(CHART), "--set",
                            "prometheusOperator.serviceMonitor.enable=true"], capture_output=True, text=True,
                           timeout=120)
    assert wrong.returncode != 0 and "enable" in wrong.stderr, wrong.stderr

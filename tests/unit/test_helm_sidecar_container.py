"""shape: sidecar-container: txnguard added to a broker StatefulSet the operator already runs, not a cluster of its own.

    helm template --set shape=sidecar-container ─▶ a kustomize Component (kustomization.yaml: the StatefulSet and
    Service patches) + configmap.yaml ─▶ kustomize build over an existing broker StatefulSet and Service
    (tests/data/helm-sidecar-container/kafka.yaml) ─▶ kubernetes-validate --strict on what comes out (Kubernetes
    1.32's OpenAPI schemas, offline) ─▶ the broker's pod as before plus the txnguard container, the Service plus
    the admin port, the txnguard.yaml loaded by txnguard's own config loader

helm, kustomize (both built from the Go module proxy) and kubernetes-validate are tools `make setup` provides
(`make helm kustomize kube-schemas`): missing, these tests fail, they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from txnguard.proxy.config import load

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "txnguard"
EXISTING = ROOT / "tests" / "data" / "helm-sidecar-container" / "kafka.yaml"
TOOLS = Path.home() / ".cache" / "txnguard"
HELM = TOOLS / "bin" / "helm"
KUSTOMIZE = TOOLS / "bin" / "kustomize"
KUBE_VALIDATE = TOOLS / "kubeval" / "bin" / "kubernetes-validate"
KUBERNETES_VERSION = "1.32.0"


def _run(*args: str | Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _helm_template(*settings: str, show_only: str | None = None) -> str:
    flags = [f for s in ("shape=sidecar-container", *settings) for f in ("--set", s)]
    only = ["--show-only", show_only] if show_only else []
    return _run(HELM, "template", "kafka", CHART, "--namespace", "streaming", *flags, *only)


def _merge(tmp_path: Path, *settings: str) -> list[dict[str, Any]]:
    """What an operator does: the component in a folder of its own, listed under `components:` beside the brokers."""
    component = tmp_path / "txnguard"
    component.mkdir()
    (component / "kustomization.yaml").write_text(
        _helm_template(*settings, show_only="templates/sidecar-container.yaml"))
    (component / "configmap.yaml").write_text(_helm_template(*settings, show_only="templates/configmap.yaml"))
    shutil.copy(EXISTING, tmp_path / "kafka.yaml")
    (tmp_path / "kustomization.yaml").write_text("resources: [kafka.yaml]\ncomponents: [txnguard]\n")
    merged = _run(KUSTOMIZE, "build", tmp_path)
    (tmp_path / "merged.yaml").write_text(merged)
    return [d for d in yaml.safe_load_all(merged) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _existing(kind: str) -> dict[str, Any]:
    return _one([d for d in yaml.safe_load_all(EXISTING.read_text()) if d], kind)


def test_helm_lint_is_clean_and_the_shape_renders_only_the_component_and_the_configmap():
    out = _run(HELM, "lint", "--strict", CHART, "--set", "shape=sidecar-container")
    assert "0 chart(s) failed" in out
    docs = [d for d in yaml.safe_load_all(_helm_template()) if d]
    assert sorted(d["kind"] for d in docs) == ["Component", "ConfigMap"]  # no StatefulSet, no PodDisruptionBudget


def test_the_merged_statefulset_and_service_validate_against_the_kubernetes_schemas(tmp_path):
    docs = _merge(tmp_path)
    out = _run(KUBE_VALIDATE, "--strict", "-k", KUBERNETES_VERSION, tmp_path / "merged.yaml")
    assert out.count(" passed for resource ") == len(docs) == 3 and "ERROR" not in out, out


def test_the_brokers_pods_get_txnguard_beside_the_broker_and_nothing_of_theirs_changes(tmp_path):
    merged = _merge(tmp_path)
    before, after = _existing("StatefulSet"), _one(merged, "StatefulSet")
    pod = after["spec"]["template"]["spec"]
    # The patch puts its container first; the broker stays the pod's default container for kubectl exec and logs.
    assert [c["name"] for c in pod["containers"]] == ["txnguard", "kafka"]
    assert after["spec"]["template"]["metadata"]["annotations"] == {"kubectl.kubernetes.io/default-container": "kafka"}
    assert pod["containers"][1] == before["spec"]["template"]["spec"]["containers"][0]
    assert after["spec"]["selector"] == before["spec"]["selector"]
    assert after["spec"]["volumeClaimTemplates"] == before["spec"]["volumeClaimTemplates"]
    assert [v["name"] for v in pod["volumes"]] == ["txnguard-config", "txnguard-audit"]
    sidecar = pod["containers"][0]
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"txnguard": 9092, "txnguard-admin": 9404}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "txnguard-admin"}
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] and sidecar["securityContext"]["runAsNonRoot"]

    # The Service keeps its ports and gains the admin port, which names the container's port.
    ports = {p["name"]: p for p in _one(merged, "Service")["spec"]["ports"]}
    assert sorted(ports) == ["client", "controller", "replication", "txnguard-admin"]
    assert (ports["txnguard-admin"]["port"], ports["txnguard-admin"]["targetPort"]) == (9404, "txnguard-admin")


def test_the_sidecar_serves_the_port_the_broker_advertises_and_forwards_to_its_loopback_listener(tmp_path):
    merged = _merge(tmp_path)
    config_map = _one(merged, "ConfigMap")
    volume = next(v for v in _one(merged, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "txnguard-config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    (tmp_path / "txnguard.yaml").write_text(config_map["data"]["txnguard.yaml"])
    config = load(tmp_path / "txnguard.yaml", environ={})
    broker = {e["name"]: e.get("value") for e in _existing("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
              ["env"]}
    assert config.mode.value == "sidecar"
    assert f"PLAINTEXT://$(POD_NAME).kafka.streaming.svc:{config.listen.port}," in broker["KAFKA_ADVERTISED_LISTENERS"]
    assert [f"PLAINTEXT://{u}" for u in map(str, config.upstream)] == [broker["KAFKA_LISTENERS"].split(",")[0]]


def test_other_names_and_ports_come_from_sidecar_container_values(tmp_path):
    docs = [d for d in yaml.safe_load_all(_helm_template(
        "sidecarContainer.statefulSet=brokers", "sidecarContainer.service=", "sidecarContainer.clientPort=9095",
        "sidecarContainer.brokerLocalPort=19092")) if d]
    component = _one(docs, "Component")
    assert [p["target"]["name"] for p in component["patches"]] == ["brokers"]  # service "": no Service patch
    rendered = yaml.safe_load(_one(docs, "ConfigMap")["data"]["txnguard.yaml"])
    assert (rendered["listen"], rendered["upstream"]) == ("0.0.0.0:9095", ["127.0.0.1:19092"])


def test_a_component_aimed_at_another_statefulset_adds_nothing(tmp_path):
    # Control: the container above is there because the patch names the brokers' StatefulSet, not by accident.
    merged = _merge(tmp_path, "sidecarContainer.statefulSet=brokers")
    untouched = _one(merged, "StatefulSet")
    assert [c["name"] for c in untouched["spec"]["template"]["spec"]["containers"]] == ["kafka"]
    assert untouched == _existing("StatefulSet")


def test_helm_refuses_an_unknown_sidecar_container_setting():
    done = subprocess.run([str(HELM), "template", "kafka", str(CHART), "--set", "shape=sidecar-container",
                           "--set", "sidecarContainer.statefulset=kafka"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "statefulset" in done.stderr, done.stderr


def test_the_post_renderer_adds_the_component_to_a_chart_that_installs_the_brokers(tmp_path):
    # A Kafka chart of the operator's (here: the existing objects as its one template) rendered by Helm with
    # deploy/kustomize/txnguard-post-render.sh: what `helm upgrade --install ... --post-renderer` would apply.
    chart = tmp_path / "kafka-chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: kafka\nversion: 0.1.0\n")
    shutil.copy(EXISTING, chart / "templates" / "kafka.yaml")
    component = tmp_path / "txnguard"
    component.mkdir()
    (component / "kustomization.yaml").write_text(_helm_template(show_only="templates/sidecar-container.yaml"))
    (component / "configmap.yaml").write_text(_helm_template(show_only="templates/configmap.yaml"))

    out = _run(HELM, "template", "kafka", chart, "--namespace", "streaming",
               "--post-renderer", ROOT / "deploy" / "kustomize" / "txnguard-post-render.sh",
               "--post-renderer-args", component,
               env={**os.environ, "PATH": f"{KUSTOMIZE.parent}:{os.environ['PATH']}"})  # the script's kustomize

    docs = [d for d in yaml.safe_load_all(out) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Service", "StatefulSet"]
    pod = _one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["txnguard", "kafka"]
    (tmp_path / "post-rendered.yaml").write_text(out)
    validated = _run(KUBE_VALIDATE, "--strict", "-k", KUBERNETES_VERSION, tmp_path / "post-rendered.yaml")
    assert validated.count(" passed for resource ") == 3 and "ERROR" not in validated, validated

"""What we ship must stay valid: example configurations load, dashboards and alerts use real metrics."""

import json
import re
from pathlib import Path

import pytest
import yaml

from txnguard.proxy.config import load
from txnguard.proxy.metrics import ProxyMetrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "deploy").rglob("*.yaml")
                                       if "helm" not in p.parts))  # the chart: tests/unit/test_helm_chart.py
def test_example_configurations_validate(path):
    load(ROOT / path, environ={})


def _exported_names() -> set[str]:
    names = set()
    for family in ProxyMetrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update({family.name + s for s in ("_bucket", "_sum", "_count")})
    return names


def _used_names(text: str) -> set[str]:
    return set(re.findall(r"\btxnguard_[a-z_]+", text))


def test_every_dashboard_query_uses_an_exported_metric():
    exprs = []
    for path in (ROOT / "grafana").glob("*.json"):
        dashboard = json.loads(path.read_text())
        exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = set().union(*(_used_names(e) for e in exprs))
    assert used and used <= _exported_names(), used - _exported_names()


def test_every_alert_uses_an_exported_metric():
    rules = yaml.safe_load((ROOT / "grafana" / "alerts.yaml").read_text())
    used = set().union(*(_used_names(r["expr"]) for g in rules["groups"] for r in g["rules"]))
    assert used and used <= _exported_names(), used - _exported_names()

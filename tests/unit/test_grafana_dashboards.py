"""Dashboards are code: the committed JSON is what grafana/dashboards.py generates, and every query is
narrowed by the instance and cluster variables (tests/integration/test_dashboards.py runs the queries)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"


def _generator():
    spec = importlib.util.spec_from_file_location("grafana_dashboards", GRAFANA / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("name", sorted(GEN.DASHBOARDS))
def test_committed_json_equals_the_generated_one(name):
    committed = (GRAFANA / f"txnguard-{name}.json").read_text()
    assert committed == GEN.render(GEN.DASHBOARDS[name]), "run: python grafana/dashboards.py"


def test_no_stray_dashboard_json():
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == sorted(f"txnguard-{n}.json" for n in GEN.DASHBOARDS)


@pytest.mark.parametrize("name", sorted(GEN.DASHBOARDS))
def test_every_query_is_narrowed_by_cluster_and_instance(name):
    board = json.loads((GRAFANA / f"txnguard-{name}.json").read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "cluster", "instance"]
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        assert expr.count('cluster=~"$cluster"') == expr.count('instance=~"$instance"') >= 1, expr


def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    # Every alert has a firing and a not-firing (or resolving) case in alerts.test.yaml.
    check = subprocess.run(["promtool", "check", "rules", "alerts.yaml"], cwd=GRAFANA, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 6 rules found" in check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "alerts.test.yaml"], cwd=GRAFANA, capture_output=True,
                          text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout + test.stderr, test.stdout + test.stderr


def test_every_alert_has_a_promtool_test_that_fires_it():
    import yaml

    rules = yaml.safe_load((GRAFANA / "alerts.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((GRAFANA / "alerts.test.yaml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c["exp_alerts"]}
    assert alerts == fired == quiet

"""The alerts page and the runbooks cannot drift from grafana/alerts.yaml.

    docs/operations/alerts.md: prose + the line `<!-- txnguard-alerts -->`
        ─▶ docs/gen_alerts_reference.py (the site's build hook) writes there every alert of alerts.yaml
    the page as the site shows it, read back  ─▶  exactly the alerts of alerts.yaml, each with its runbook link,
        severity, `for`, expression and summary as the file has them (negative controls: a missing alert, an
        extra one, each field changed)
    every alert  ─▶  one runbook page (from its runbook_url); every runbook page  ─▶  one alert
    every runbook: H1 = the alert's name, a marker naming it  ─▶  shown with its severity and expression
    a missing or foreign runbook page, a marker naming another alert  ─▶  the build fails
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGE = DOCS / "operations" / "alerts.md"
RUNBOOKS = DOCS / "operations" / "runbooks"
RULES = ROOT / "grafana" / "alerts.yaml"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_alerts_reference", DOCS / "gen_alerts_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _shipped() -> dict[str, dict[str, Any]]:
    """The alerts of alerts.yaml, read here, not by the generator."""
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _read_back(page: str) -> dict[str, dict[str, Any]]:
    """The alerts as the built page states them: its table's rows, and each section's expression."""
    found: dict[str, dict[str, Any]] = {}
    row = re.compile(r"^\| \[(\w+)\]\(runbooks/([a-z0-9-]+)\.md\) \| `(\w+)` \| `(\w+)` \| (.*) \|$", re.MULTILINE)
    for name, runbook, severity, for_, summary in row.findall(page):
        assert name not in found, f"{name} twice in the table"
        found[name] = {"runbook": runbook, "severity": severity, "for": for_, "summary": _unescape(summary)}
    sections = re.split(r"^### (\w+)\n", page, flags=re.MULTILINE)
    for name, body in zip(sections[1::2], sections[2::2], strict=True):
        expr = re.search(r"^```promql\n(.*?)\n```$", body, re.MULTILINE | re.DOTALL)
        head = re.search(r"^\*\*Severity: `(\w+)`\*\* · \*\*for: `(\w+)`\*\*", body, re.MULTILINE)
        entry = found.setdefault(name, {})
        entry["sections"] = entry.get("sections", 0) + 1
        entry["expr"] = expr.group(1) if expr else None
        entry["section severity, for"] = head.groups() if head else None
    return found


def _problems(page: str, shipped: dict[str, dict[str, Any]]) -> list[str]:
    stated = _read_back(page)
    problems = [f"{name} is in alerts.yaml, not on the page" for name in shipped if name not in stated]
    problems += [f"{name} is on the page, not in alerts.yaml" for name in stated if name not in shipped]
    for name, rule in shipped.items():
        if name not in stated:
            continue
        want = {"runbook": rule["annotations"]["runbook_url"].removeprefix("operations/runbooks/").rstrip("/"),
                "severity": rule["labels"]["severity"], "for": str(rule.get("for", "0s")),
                "summary": " ".join(rule["annotations"]["summary"].split()), "sections": 1,
                "expr": rule["expr"].rstrip()}
        want["section severity, for"] = (want["severity"], want["for"])
        for field, value in want.items():
            if stated[name].get(field) != value:
                problems.append(f"{name}: {field} on the page {stated[name].get(field)!r}, in alerts.yaml {value!r}")
    return problems


@pytest.fixture(scope="module")
def built() -> str:
    return gen.render(PAGE.read_text())


def test_the_built_page_states_every_alert_as_alerts_yaml_defines_it(built: str) -> None:
    assert "<!-- txnguard-alerts" not in built
    assert len(_shipped()) == 6
    assert _problems(built, _shipped()) == []


def _drop(page: str, name: str) -> str:
    page = re.sub(rf"^\| \[{name}\].*\n", "", page, flags=re.MULTILINE)
    return re.sub(rf"^### {name}\n.*?(?=^### |^## |\Z)", "", page, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize(("plant", "found"), [
    (lambda p: _drop(p, "TxnguardDown"), "TxnguardDown is in alerts.yaml, not on the page"),
    (lambda p: p.replace("| [TxnguardDown]", "| [TxnguardGone](runbooks/txnguard-gone.md) | `page` | `2m` | x |\n"
                         "| [TxnguardDown]", 1), "TxnguardGone is on the page, not in alerts.yaml"),
    (lambda p: p.replace("| [TxnguardDown](runbooks/txnguard-down.md) | `page` | `2m`",
                         "| [TxnguardDown](runbooks/txnguard-down.md) | `ticket` | `2m`"), "TxnguardDown: severity"),
    (lambda p: p.replace("| `page` | `5m` |", "| `page` | `1m` |"), "TxnguardCoordinatorUnavailable: for"),
    (lambda p: p.replace("(above 100 ms) |", "(above 200 ms) |"), "TxnguardVerificationSlow: summary"),
    (lambda p: p.replace("(txnguard_ready) == 0\n", "(txnguard_ready) < 1\n"), "TxnguardNotReady: expr"),
    (lambda p: p.replace("runbooks/txnguard-not-ready.md) |", "runbooks/txnguard-down.md) |"),
     "TxnguardNotReady: runbook"),
    (lambda p: p.replace("**Severity: `ticket`** · **for: `10m`**", "**Severity: `page`** · **for: `10m`**"),
     "TxnguardVerificationSlow: section severity, for"),
])
def test_a_page_that_differs_from_alerts_yaml_is_caught(built: str, plant: Any, found: str) -> None:
    # Negative controls: the built page with one planted mismatch each.
    planted = plant(built)
    assert planted != built
    problems = _problems(planted, _shipped())
    assert any(p.startswith(found) for p in problems), problems


def test_every_alert_has_one_runbook_page_and_every_runbook_page_one_alert() -> None:
    pages = {p.stem for p in RUNBOOKS.glob("*.md")}
    wanted = [r["annotations"]["runbook_url"] for r in _shipped().values()]
    assert sorted(f"operations/runbooks/{p}/" for p in pages) == sorted(wanted)
    assert gen.check_runbooks(gen.alerts(), gen.runbook_pages()) == []


def _docs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules: dict[str, Any] | None = None) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(RUNBOOKS, docs / "operations" / "runbooks")
    monkeypatch.setattr(gen, "DOCS", docs)
    if rules is not None:
        (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        monkeypatch.setattr(gen, "RULES", tmp_path / "alerts.yaml")
    return docs


def test_an_alert_without_a_runbook_page_fails_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = yaml.safe_load(RULES.read_text())
    rules["groups"][0]["rules"].append({
        "alert": "TxnguardNew", "expr": "vector(1)", "labels": {"severity": "ticket"},
        "annotations": {"summary": "new", "runbook_url": "operations/runbooks/txnguard-new/"}})
    _docs_copy(tmp_path, monkeypatch, rules)
    with pytest.raises(ValueError, match="TxnguardNew has no runbook page"):
        gen.render(PAGE.read_text())


def test_a_runbook_page_of_no_alert_fails_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs_copy(tmp_path, monkeypatch)
    stray = docs / "operations" / "runbooks" / "txnguard-retired.md"
    stray.write_text("# TxnguardRetired\n\n<!-- txnguard-alert: TxnguardRetired -->\n\nGone.\n")
    with pytest.raises(ValueError, match=r"txnguard-retired\.md is the runbook of no alert"):
        gen.render(PAGE.read_text())
    with pytest.raises(ValueError, match="runbook of no alert"):
        gen.render_runbook("operations/runbooks/txnguard-retired.md", stray.read_text())


@pytest.mark.parametrize("page", sorted(p.name for p in RUNBOOKS.glob("*.md")))
def test_every_runbook_opens_with_its_alert_its_severity_and_its_expression(page: str) -> None:
    url = f"operations/runbooks/{page.removesuffix('.md')}/"
    rule = next(r for r in _shipped().values() if r["annotations"]["runbook_url"] == url)
    source = (RUNBOOKS / page).read_text()
    assert source.startswith(f"# {rule['alert']}\n\n<!-- txnguard-alert: {rule['alert']} -->\n\n")
    shown = gen.render_runbook(f"operations/runbooks/{page}", source)
    top = shown.split("\n## ")[0]
    assert "<!-- txnguard-alert" not in shown
    assert f"**Severity: `{rule['labels']['severity']}`** · **for: `{rule.get('for', '0s')}`**" in top
    assert f"```promql\n{rule['expr'].rstrip()}\n```" in top
    # What the page adds in words: when it fires (its lead) and what to do.
    assert "\n## What to do\n" in shown
    fires, todo = gen.prose(rule["alert"], f"operations/runbooks/{page}", source)
    assert fires and todo


def test_a_runbook_marker_or_h1_naming_another_alert_fails_the_build() -> None:
    source = (RUNBOOKS / "txnguard-down.md").read_text()
    with pytest.raises(ValueError, match="needs one `<!-- txnguard-alert: TxnguardDown -->`"):
        gen.render_runbook("operations/runbooks/txnguard-down.md",
                           source.replace("txnguard-alert: TxnguardDown", "txnguard-alert: TxnguardNotReady"))
    with pytest.raises(ValueError, match="H1 must be `# TxnguardDown`"):
        gen.render_runbook("operations/runbooks/txnguard-down.md", source.replace("# TxnguardDown", "# Down", 1))
    with pytest.raises(ValueError, match="exactly one line"):
        gen.render(PAGE.read_text().replace("<!-- txnguard-alerts -->", ""))


def test_the_runbooks_words_keep_their_links_working_on_the_alerts_page(built: str) -> None:
    # The runbooks' paragraphs moved one directory up: every relative link is rebased and lands on a page.
    links = re.findall(r"\]\((?![a-z]+:|#)([^)#\s]+)(?:#[^)\s]*)?\)", built)
    assert "../concepts/hanging-transactions.md" in links  # from the hanging runbook's "What to do"
    for link in links:
        assert (PAGE.parent / link).resolve().is_file(), link


def test_the_page_keeps_its_own_prose(built: str) -> None:
    assert "## The hanging-transaction alert needs the scan" in built
    assert "health.hanging_scan_interval_s" in built.split("### TxnguardHangingTransaction")[1]

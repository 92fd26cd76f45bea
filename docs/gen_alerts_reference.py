"""Puts the alerting rules of grafana/alerts.yaml into the alerts page and the runbooks at docs build time.

A MkDocs hook (mkdocs.yml `hooks:`), with one source for each fact:

- grafana/alerts.yaml: each alert's name, severity, `for`, expression, summary and description, and its
  `runbook_url` (`operations/runbooks/<page>/`, so the runbook is docs/operations/runbooks/<page>.md);
- each runbook page: in words, when the alert fires (the page's lead paragraph, after its marker) and what to
  do (the first paragraph of its section "What to do").

In docs/operations/alerts.md the line `<!-- txnguard-alerts -->` becomes the reference: a table of every alert
(its name linked to its runbook, severity, `for`, summary) and a section per alert with its expression, its
annotations, and the runbook's lead and "What to do" (their relative links rebased onto the alerts page).
In each runbook the line `<!-- txnguard-alert: <name> -->`, under the page's H1 (the alert's name), becomes
the alert's severity, `for`, expression and annotations. The build fails when a marker is missing or names
another alert, when an alert has no runbook page, or a runbook page belongs to no alert;
tests/unit/test_alerts_reference.py checks the same and reads the built pages back against alerts.yaml.

Run it alone to print the alerts page as the site shows it: `python docs/gen_alerts_reference.py`
(or a runbook's: `python docs/gen_alerts_reference.py operations/runbooks/txnguard-down.md`).
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RULES = ROOT / "grafana" / "alerts.yaml"
PAGE = "operations/alerts.md"
RUNBOOKS = "operations/runbooks/"
PAGE_MARKER = re.compile(r"^<!-- txnguard-alerts -->$", re.MULTILINE)
RUNBOOK_MARKER = re.compile(r"^<!-- txnguard-alert: (\S+) -->$", re.MULTILINE)
# A relative link to another page of the site: [text](path.md#anchor), not a URL.
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|/|#)([^)\s#]+)(#[^)\s]*)?\)")


def alerts(rules: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every alerting rule of alerts.yaml (or of `rules`, the file as loaded), by name, in the file's order."""
    if rules is None:
        rules = yaml.safe_load(RULES.read_text())
    found: dict[str, dict[str, Any]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                if rule["alert"] in found:
                    raise ValueError(f"grafana/alerts.yaml: {rule['alert']} is defined twice")
                found[rule["alert"]] = rule
    return found


def runbook(rule: dict[str, Any]) -> str:
    """The runbook's page, relative to docs/, from the rule's runbook_url ("operations/runbooks/<page>/")."""
    url = rule.get("annotations", {}).get("runbook_url", "")
    match = re.fullmatch(re.escape(RUNBOOKS) + r"([a-z0-9-]+)/", url)
    if not match:
        raise ValueError(f"grafana/alerts.yaml: {rule['alert']}'s runbook_url {url!r} is not {RUNBOOKS}<page>/")
    return f"{RUNBOOKS}{match.group(1)}.md"


def runbook_pages() -> set[str]:
    return {f"{RUNBOOKS}{p.name}" for p in (DOCS / RUNBOOKS).glob("*.md")}


def check_runbooks(known: dict[str, dict[str, Any]], pages: set[str]) -> list[str]:
    """What is wrong between the alerts and the runbook pages: an alert without a page, a page without an alert."""
    wanted = {runbook(rule): name for name, rule in known.items()}
    problems = [f"{name} has no runbook page: docs/{page} is missing"
                for page, name in wanted.items() if page not in pages]
    problems += [f"docs/{page} is the runbook of no alert in grafana/alerts.yaml"
                 for page in sorted(pages - set(wanted))]
    if len(wanted) < len(known):
        problems.append("two alerts share one runbook_url")
    return problems


def _text(value: str) -> str:
    """An annotation as Markdown text: as written, with Markdown's own characters escaped."""
    return re.sub(r"([\\`*_|<>\[\]])", r"\\\1", " ".join(value.split()))


def _for(rule: dict[str, Any]) -> str:
    return str(rule.get("for", "0s"))


def header(rule: dict[str, Any]) -> str:
    """What a runbook's marker becomes: the rule as alerts.yaml defines it."""
    severity = rule["labels"]["severity"]
    lines = [f"**Severity: `{severity}`** · **for: `{_for(rule)}`** · from `grafana/alerts.yaml`:", "",
             "```promql", rule["expr"].rstrip(), "```", ""]
    for key, value in rule.get("annotations", {}).items():
        if key != "runbook_url":
            lines += [f"{key.capitalize()}: {_text(value)}", ""]
    return "\n".join(lines).rstrip()


def _section(markdown: str, title: str) -> str | None:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    return match.group(1) if match else None


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n")[0].strip()


def _rebase(paragraph: str, page: str) -> str:
    """Relative links of a runbook's paragraph, rewritten to work from the alerts page."""
    base = posixpath.dirname(page)
    here = posixpath.dirname(PAGE)

    def link(match: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(base, match.group(1)))
        return f"]({posixpath.relpath(target, here)}{match.group(2) or ''})"

    return _LINK.sub(link, paragraph)


def prose(name: str, page: str, markdown: str) -> tuple[str, str]:
    """A runbook's words: when the alert fires (its lead paragraph) and what to do (first paragraph there)."""
    marker = RUNBOOK_MARKER.search(markdown)
    todo = _section(markdown, "What to do")
    if marker is None or todo is None:
        raise ValueError(f"docs/{page}: needs `<!-- txnguard-alert: {name} -->` under its H1 and a "
                         "section '## What to do'")
    lead = _first_paragraph(markdown[marker.end():])
    if not lead or lead.startswith(("#", "!!!")):
        raise ValueError(f"docs/{page}: needs a lead paragraph (when {name} fires, in words) after its marker")
    return _rebase(lead, page), _rebase(_first_paragraph(todo), page)


def reference(known: dict[str, dict[str, Any]] | None = None, read: Any = None) -> str:
    """What the alerts page's marker becomes. `read(page)` gives a runbook's Markdown (by default its file)."""
    known = alerts() if known is None else known
    read = read or (lambda page: (DOCS / page).read_text())
    here = posixpath.dirname(PAGE)
    rows = ["| alert (runbook) | severity | for | summary |", "| --- | --- | --- | --- |"]
    sections = []
    for name, rule in known.items():
        page = runbook(rule)
        link = posixpath.relpath(page, here)
        summary = _text(rule.get("annotations", {}).get("summary", ""))
        rows.append(f"| [{name}]({link}) | `{rule['labels']['severity']}` | `{_for(rule)}` | {summary} |")
        fires, todo = prose(name, page, read(page))
        sections += [f"### {name}", "", header(rule), "", f"**When it fires** (from [its runbook]({link})): {fires}",
                     "", f"**What to do**: {todo}", ""]
    return "\n".join([*rows, "", *sections]).rstrip()


def render(markdown: str) -> str:
    """The alerts page as the site shows it."""
    if len(PAGE_MARKER.findall(markdown)) != 1:
        raise ValueError(f"docs/{PAGE} needs exactly one line `<!-- txnguard-alerts -->`")
    problems = check_runbooks(alerts(), runbook_pages())
    if problems:
        raise ValueError("; ".join(problems))
    return PAGE_MARKER.sub(lambda _: reference(), markdown)


def render_runbook(page: str, markdown: str, known: dict[str, dict[str, Any]] | None = None) -> str:
    """A runbook page as the site shows it: its marker becomes the rule."""
    known = alerts() if known is None else known
    owners = [name for name, rule in known.items() if runbook(rule) == page]
    if not owners:
        raise ValueError(f"docs/{page} is the runbook of no alert in grafana/alerts.yaml")
    name = owners[0]
    h1 = re.match(r"# (.+)\n", markdown)
    named = RUNBOOK_MARKER.findall(markdown)
    if h1 is None or h1.group(1) != name or named != [name]:
        raise ValueError(f"docs/{page}: its H1 must be `# {name}` and it needs one `<!-- txnguard-alert: {name} -->`")
    return RUNBOOK_MARKER.sub(lambda _: header(known[name]), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the alerts page's and the runbooks' markers become the rules of alerts.yaml."""
    uri = page.file.src_uri
    if uri == PAGE:
        return render(markdown)
    if uri.startswith(RUNBOOKS):
        return render_runbook(uri, markdown)
    return markdown


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else PAGE
    text = (DOCS / which).read_text()
    print(render(text) if which == PAGE else render_runbook(which, text))

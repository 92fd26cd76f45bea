"""The documentation site builds, strictly, and every link in it lands somewhere.

    mkdocs build --strict (offline)  ->  a temporary site
    every href/src in every built page that stays inside the site  ->  an existing file, and its #anchor an id there
    every alert's runbook_url  ->  a built page about that alert
    the README's links  ->  files of the repository
    nothing in the repository  ->  the team's folder outside it
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = (".." + "/shared", "/work" + "/shared")  # spelt in two halves so this file does not match itself


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.h1: list[str] = []
        self._in_h1 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if a.get("name") and tag == "a":
            self.ids.add(a["name"] or "")
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script"):
                self.links.append(a[key] or "")
        self._in_h1 = tag == "h1"

    def handle_endtag(self, tag: str) -> None:
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data: str) -> None:
        if self._in_h1:
            self.h1.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _target(site: Path, page: Path, href: str) -> tuple[Path, str] | None:
    """The file and anchor an internal link points to; None for a link that leaves the site."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    path = unquote(parts.path)
    if not path:
        target = page
    elif path.startswith("/"):  # 404.html links from the site's root: it is served at any depth
        target = (site / path.lstrip("/")).resolve()
    else:
        target = (page.parent / path).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_the_site_builds_strictly_and_every_internal_link_and_anchor_resolves(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    parsed = {p.resolve(): _parse(p) for p in pages}
    broken: list[str] = []
    checked = 0
    for path, page in parsed.items():
        for href in page.links:
            found = _target(site, path, href)
            if found is None:
                continue
            target, anchor = found
            checked += 1
            if not target.exists():
                broken.append(f"{path.relative_to(site.resolve())}: {href} (no {target})")
            elif anchor and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if anchor not in ids:
                    broken.append(f"{path.relative_to(site.resolve())}: {href} (no #{anchor})")
    print(f"{len(pages)} pages, {checked} internal links checked")
    assert len(pages) > 30
    assert not broken, "\n".join(broken)


def test_the_build_fetches_nothing_from_outside(site: Path) -> None:
    # Stylesheets, scripts and fonts come from the site itself (Material's font: false, no privacy/social plugin).
    outside = set()
    for path in site.rglob("*.html"):
        page = _parse(path)
        outside |= {h for h in page.links if h.startswith(("http://", "https://", "//"))
                    and re.search(r"\.(css|js|woff2?|ttf)(\?|$)|fonts\.", h)}
    assert not outside, outside


def test_every_alert_has_a_runbook_url_that_is_a_page_about_it(site: Path) -> None:
    rules = yaml.safe_load((ROOT / "grafana" / "alerts.yaml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        page = site / url / "index.html"
        assert page.is_file(), f"{rule['alert']}: runbook_url {url} is not a page of the site"
        assert "".join(_parse(page).h1).strip().rstrip("¶").strip() == rule["alert"]


def test_the_readme_links_only_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not urlsplit(link).scheme]
    assert local  # it points into the docs
    missing = [link for link in local if not (ROOT / urlsplit(link).path).exists()]
    assert not missing, missing
    assert "make run" in readme and "make test" in readme


def test_nothing_in_the_repository_refers_to_the_team_folder_outside_it() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    offenders = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(needle in line for needle in OUTSIDE):
                offenders.append(f"{name}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

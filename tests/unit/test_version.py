"""One version, written once (pyproject.toml's [project] version), and everything an operator reads says it.

    pyproject.toml ─▶ package metadata ─▶ txnguard.__version__ ─▶ `txnguard --version`
                   ─▶ build-image.sh ─▶ the image's tag and org.opencontainers.image.version
                      (the built image is checked in tests/integration/test_image.py)
    Chart.yaml appVersion (Helm cannot read pyproject: written by hand, so checked here)  ══ the same
    CHANGELOG.md: its newest release is this version
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

import txnguard

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_package_and_the_command_line_say_pyprojects_version() -> None:
    assert txnguard.__version__ == VERSION
    cli = Path(sys.executable).parent / "txnguard"  # the console script the install made
    done = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"txnguard {VERSION}\n", "")


def test_the_version_is_written_in_pyproject_only() -> None:
    # The package reads it from its metadata: no second literal to forget when the version moves.
    assert VERSION not in (ROOT / "src" / "txnguard" / "__init__.py").read_text()
    assert VERSION not in (ROOT / "Containerfile").read_text()
    assert VERSION not in (ROOT / "deploy" / "container" / "build-image.sh").read_text()


def test_the_helm_charts_app_version_is_the_packages() -> None:
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "txnguard" / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    # The chart's image tag defaults to appVersion, the tag build-image.sh gives the image.
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "txnguard" / "values.yaml").read_text())
    assert values["image"]["tag"] == ""
    assert ".Values.image.tag | default .Chart.AppVersion" in "".join(
        p.read_text() for p in (ROOT / "deploy" / "helm" / "txnguard" / "templates").iterdir())


def test_the_changelogs_newest_release_is_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert releases[:2] == ["Unreleased", VERSION], releases

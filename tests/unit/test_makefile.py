"""`make run` and `make demo` set up only what they run; `make test` sets up everything.

    make -n -B run   ─▶ every recipe of run and of all its prerequisites, printed and not run
                        (-B: as if nothing were built yet, a fresh machine)
        python3 -m venv, pip install -r requirements.lock, Kafka 3.5.2's jars, txnguard dev      present
        apt-get/sudo, go install/build, podman, buildah, mmdebstrap, helm, Chromium, Prometheus   absent
    make -n -B demo  ─▶ the same, ending in txnguard demo
    make -n -B test  ─▶ every one of those absent words present: the check sees them where they are (control)

Only `$(MAKE)` lines run under -n (`make setup`'s parallel sub-make), and that sub-make is itself a dry run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the light set up must not touch: the system's package manager, Go, the container tools, the chart's tools,
# the browser and Prometheus the tests use.
HEAVY = {
    "apt": r"\bapt-get\b|\$SUDO\b|\bsudo\b",
    "go": r"\bgo (install|build)\b",
    "podman": r"\bpodman\b",
    "buildah": r"\bbuildah\b",
    "mmdebstrap": r"\bmmdebstrap\b",
    "helm": r"\bhelm\b",
    "chromium": r"\bchromium\b",
    "prometheus": r"\bprometheus\b",
    "kubernetes schemas": r"kubernetes-validate",
    "image build": r"build-image\.sh",
}


def _dry_run(target: str) -> str:
    assert shutil.which("make"), "make is not on PATH"
    # Run from `make test` or not, the dry run is the same: no outer make's flags or job server.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", "-C", str(ROOT), target],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _heavy_in(commands: str) -> list[str]:
    return sorted(name for name, pattern in HEAVY.items() if re.search(pattern, commands, re.IGNORECASE))


@pytest.mark.parametrize(("target", "last"), [
    ("run", "txnguard dev --version 3.5.2"),
    ("demo", "txnguard demo"),
])
def test_run_and_demo_set_up_only_the_venv_and_kafka_jars(target: str, last: str) -> None:
    commands = _dry_run(target)
    print(commands)
    assert "-m venv .venv" in commands
    assert "pip install -q --disable-pip-version-check -r requirements.lock" in commands
    assert "txnguard.testing.jars kafka_2.13:3.5.2" in commands  # only the server it starts
    assert "kafka fetch" not in commands  # not every Kafka version the tests use
    assert last in commands.strip().splitlines()[-1]  # and then the command itself
    assert _heavy_in(commands) == []


def test_make_test_still_sets_up_everything() -> None:
    # The control: the same patterns find each heavy step in `make test`'s set up, so their absence above means
    # something. `make test` keeps installing them as before (CI runs it through .ci/run).
    commands = _dry_run("test")
    assert _heavy_in(commands) == sorted(HEAVY)
    assert "kafka fetch" in commands
    assert "make test" in (ROOT / ".ci" / "run").read_text()

"""The release as an operator installs it: `make dist`'s wheel in a fresh virtual environment, outside the checkout.

    make dist DIST=tmp ─▶ txnguard-V.tar.gz, txnguard-V-cp311-abi3-linux_<arch>.whl (V: pyproject.toml's version;
        one wheel for CPython 3.11+, the native data path built in)
    python -m venv tmp/venv; pip install -c requirements.lock txnguard-V.whl   (the runtime dependencies only)
        txnguard --version                       ─▶ "txnguard V"
        txnguard config-schema                   ─▶ the JSON Schema, as the checkout prints it
        txnguard check-config deploy/**/*.yaml   ─▶ ok, each (the helm chart's files are not txnguard configs)
        txnguard demo                            ─▶ exit 2: "pip install 'txnguard[demo]'", nothing started
    pip install 'txnguard-V.whl[demo]'
        txnguard demo ─▶ Kafka 3.5.2 from the jars in ~/.cache/txnguard ─▶ written direct, refused through txnguard

Every command runs in a folder outside the repository with no PYTHONPATH, and the package it imports is checked to
be the installed one. pip reads PyPI (through its cache): it has no offline mode for a cache alone.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from txnguard.proxy import config_reference

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"txnguard-{VERSION}-cp311-abi3-linux_{platform.machine()}.whl"
SHIPPED_CONFIGS = sorted(p for p in (ROOT / "deploy").rglob("*.yaml") if "helm" not in p.parts)


def _env() -> dict[str, str]:
    # Nothing of the checkout's environment leaks in: no outer make, no PYTHONPATH, no active virtualenv.
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    print(f"{' '.join(str(c) for c in cmd[:4])}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = _run(["make", "--no-print-directory", "-C", str(ROOT), "dist", f"DIST={out}"], ROOT, 600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def test_make_dist_builds_an_sdist_and_a_wheel_of_this_version(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [WHEEL, f"txnguard-{VERSION}.tar.gz"]
    with tarfile.open(dist / f"txnguard-{VERSION}.tar.gz") as sdist:
        names = sdist.getnames()
    assert {f"txnguard-{VERSION}/pyproject.toml", f"txnguard-{VERSION}/README.md",
            f"txnguard-{VERSION}/src/txnguard/cli.py", f"txnguard-{VERSION}/native/src/produce.rs",
            f"txnguard-{VERSION}/native/Cargo.lock"} <= set(names)  # the sdist builds the native path too
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        assert "txnguard/_native.abi3.so" in wheel.namelist()
        entry_points = wheel.read(f"txnguard-{VERSION}.dist-info/entry_points.txt").decode()
        metadata = wheel.read(f"txnguard-{VERSION}.dist-info/METADATA").decode()
    assert "txnguard=txnguard.cli:main" in entry_points.replace(" ", "")
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "Provides-Extra: demo" in metadata


def test_the_wheel_installed_in_a_fresh_venv_runs_its_commands_and_the_demo(dist: Path, tmp_path: Path) -> None:
    wheel = dist / WHEEL
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120).returncode == 0
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
           "-c", str(ROOT / "requirements.lock")]
    installed = _run([*pip, str(wheel)], tmp_path, 600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    txnguard = str(venv / "bin" / "txnguard")

    where = _run([str(venv / "bin" / "python"), "-c", "import txnguard; print(txnguard.__file__)"], tmp_path, 60)
    assert where.stdout.startswith(str(venv)), where.stdout  # the installed package, not the checkout's
    fast = _run([str(venv / "bin" / "python"), "-c", "from txnguard.codecs import native; print(native.AVAILABLE)"],
                tmp_path, 60)
    assert fast.stdout.strip() == "True", fast.stderr  # the wheel's native data path loads where it is installed

    version = _run([txnguard, "--version"], tmp_path, 60)
    assert (version.returncode, version.stdout) == (0, f"txnguard {VERSION}\n")

    schema = _run([txnguard, "config-schema"], tmp_path, 60)
    assert schema.returncode == 0, schema.stderr
    # The checkout's schema, which tests/unit/test_config_schema.py keeps equal to deploy/schema/'s file.
    assert schema.stdout == config_reference.schema_text()

    assert SHIPPED_CONFIGS, "no txnguard configuration under deploy/"
    for config in SHIPPED_CONFIGS:
        checked = _run([txnguard, "check-config", str(config)], tmp_path, 60)
        assert checked.returncode == 0, f"{config}: {checked.stdout}{checked.stderr}"
        assert checked.stdout.startswith(f"{config}: ok ("), checked.stdout

    # The runtime dependencies carry no Kafka client: the demo says what to install, and starts nothing.
    bare = _run([txnguard, "demo"], tmp_path, 60)
    assert (bare.returncode, bare.stdout) == (2, ""), bare.stdout + bare.stderr
    assert "pip install 'txnguard[demo]'" in bare.stderr

    extra = _run([*pip, f"{wheel}[demo]"], tmp_path, 600)
    assert extra.returncode == 0, extra.stderr[-3000:]
    demo = _run([txnguard, "demo", "--temp-dir", str(tmp_path)], tmp_path, 300)
    print(demo.stdout[-2500:])
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"write outside its transaction\s+NONE \(0\): written\s+INVALID_TXN_STATE \(48\): refused",
                     demo.stdout), demo.stdout
    assert re.search(r"read_committed consumer got\s+0 of 3\s+3 of 3", demo.stdout), demo.stdout
    assert re.search(r"^Done in \d+ s\.$", demo.stdout, re.M)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("txnguard-demo-")] == []  # removed at the end

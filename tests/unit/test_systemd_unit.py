"""deploy/systemd/txnguard-sidecar.service as systemd reads it, and the configuration file it starts with.

    systemd-analyze verify (systemd's own parser: unknown keys, bad values, a missing executable) ─▶ no output
    the sandbox's directives ─▶ present, with the values docs/deployment/sidecar.md promises
    deploy/systemd/sidecar.yaml ─▶ txnguard's config loader; its drain fits in the unit's stop timeout

systemd-analyze comes with Debian's systemd package; without it these tests fail, they are never skipped. The
unit's command line beside real brokers: tests/integration/test_systemd_sidecar.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from txnguard.proxy.config import load

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "txnguard-sidecar.service"
SIDECAR_YAML = ROOT / "deploy" / "systemd" / "sidecar.yaml"
INSTALLED = "/opt/txnguard/venv/bin/txnguard"


def _verify(unit_text: str, tmp_path: Path) -> str:
    """systemd-analyze verify on the unit, the installed txnguard's path pointed at this checkout's."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd"
    path = tmp_path / "txnguard-sidecar.service"
    path.write_text(unit_text.replace(INSTALLED, str(Path(sys.executable).parent / "txnguard")))
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _service() -> dict[str, list[str]]:
    """The [Service] section, every value of a repeated key in order."""
    values: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path):
    assert _verify(UNIT.read_text(), tmp_path) == ""


def test_the_verify_check_speaks_on_a_misspelled_directive(tmp_path):
    # Negative control: systemd ignores an unknown key (exit 0) but says so; the check above must see that.
    out = _verify(UNIT.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"), tmp_path)
    assert "Unknown key 'ProtectSytem'" in out


def test_the_unit_runs_txnguard_sandboxed_and_restarts_it_on_failure():
    service = _service()
    assert service["ExecStart"] == [f"{INSTALLED} run --config /etc/txnguard/sidecar.yaml"]
    assert service["DynamicUser"] == ["yes"] and service["LogsDirectory"] == ["txnguard"]
    assert service["ProtectSystem"] == ["strict"] and service["PrivateTmp"] == ["yes"]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["CapabilityBoundingSet"] == [""] and service["AmbientCapabilities"] == [""]
    assert service["RestrictAddressFamilies"] == ["AF_INET AF_INET6 AF_UNIX"]
    assert service["MemoryMax"] == ["1G"] and service["Restart"] == ["on-failure"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"] and service["KillSignal"] == ["SIGTERM"]


def test_the_shipped_config_is_a_sidecar_whose_drain_fits_the_stop_timeout(tmp_path):
    config = load(SIDECAR_YAML, environ={})
    assert config.mode == "sidecar" and [str(u) for u in config.upstream] == ["127.0.0.1:9192"]
    assert str(config.listen) == "0.0.0.0:9092"
    assert config.policy.mode.value == "monitor"  # a rollout starts in monitor mode (docs/operations/rollout.md)
    assert config.verification.evidence_ttl_ms == 0
    # The only place the sandbox lets it write: LogsDirectory=txnguard.
    assert str(config.audit.path).startswith("/var/log/txnguard/")
    stop_timeout = int(_service()["TimeoutStopSec"][0])
    assert config.limits.drain_timeout_s < stop_timeout


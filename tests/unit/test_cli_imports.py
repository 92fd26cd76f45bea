"""`txnguard run` must not load the test harness: checked in a fresh interpreter, at run time."""

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_the_cli_and_the_proxy_load_no_test_harness():
    loaded = _modules_after("import txnguard.cli, txnguard.proxy.main")
    assert "txnguard.cli" in loaded and "txnguard.proxy.main" in loaded
    assert not any(m.startswith("txnguard.testing") for m in loaded)


def test_the_harness_commands_are_still_there():
    out = subprocess.run([sys.executable, "-m", "txnguard.cli", "kafka", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "up" in out.stdout and "down" in out.stdout

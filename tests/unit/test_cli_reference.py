"""The command line reference cannot drift from the argument parsers.

    docs/reference/cli.md: prose + one `<!-- txnguard-help: <command> -->` marker per command
        ─▶ docs/gen_cli_reference.py (the site's build hook) replaces each marker with that command's --help
    every command the parsers know (txnguard, its subcommands, kafka's) ─▶ exactly one marker on the page
    every option string of every parser ─▶ in the page as the site shows it
    the page's claims about behaviour (every subcommand in `txnguard --help`; check-config: exit 2 and every
    error) ─▶ checked on the real command
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _txnguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txnguard.cli", *args], capture_output=True, text=True, timeout=60)


def test_the_parsers_know_every_command_the_project_ships():
    assert set(gen.parsers()) == {
        "txnguard", "txnguard run", "txnguard check-config", "txnguard config-schema", "txnguard hanging",
        "txnguard report", "txnguard kafka", "txnguard kafka up", "txnguard kafka down", "txnguard kafka status",
        "txnguard kafka fetch", "txnguard kafka run", "txnguard dev", "txnguard demo"}


def test_every_command_has_exactly_one_help_block_on_the_page():
    markers = gen.MARKER.findall(PAGE.read_text())
    assert sorted(markers) == sorted(gen.parsers())


def test_the_built_page_shows_every_option_of_every_command():
    page = gen.render(PAGE.read_text())
    assert "<!-- txnguard-help" not in page
    for name, parser in gen.parsers().items():
        assert f"usage: {name} " in page, name
        for action in parser._actions:
            for option in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", page), f"{name} {option}"


def test_a_marker_naming_no_command_fails_the_build():
    with pytest.raises(ValueError, match="names no command"):
        gen.render("<!-- txnguard-help: txnguard kafka upp -->\n")


def test_txnguard_help_lists_every_subcommand_including_the_harness_ones():
    done = _txnguard("--help")
    assert done.returncode == 0
    listed = set(re.findall(r"^    ([a-z-]+)", done.stdout, re.MULTILINE))
    assert listed == {"run", "check-config", "config-schema", "hanging", "report", "kafka", "dev", "demo"}
    # And each listed harness command still reaches its own parser.
    for name in ("kafka", "dev", "demo"):
        assert _txnguard(name, "--help").stdout.startswith(f"usage: txnguard {name} ")


def test_check_config_exits_2_and_prints_every_error_as_the_page_says(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream: 127.0.0.1:9092\nlimits: {idle_timeout_s: soon, max_in_flight: -1}\n"
                   "policy: {mode: sometimes}\n")
    done = _txnguard("check-config", str(bad))
    assert done.returncode == 2
    for setting in ("limits.max_in_flight", "limits.idle_timeout_s", "policy.mode"):
        assert setting in done.stderr and setting in PAGE.read_text()
    good = tmp_path / "good.yaml"
    good.write_text("upstream: 127.0.0.1:9092\n")
    assert _txnguard("check-config", str(good)).returncode == 0

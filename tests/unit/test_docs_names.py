"""What the pages name exists in the code: settings, TXNGUARD_* variables, metric families, command flags, files.

    README.md, docs/**/*.md (prose, examples, runbooks)
        `section.key` (first part a top-level setting)  ─▶ a setting of the configuration's reference
        TXNGUARD_X__Y                                   ─▶ that setting (or a variable the test harness reads)
        txnguard_*                                      ─▶ a family a proxy exports (docs/ and the shipped alerts)
        txnguard <command> ... --flag                   ─▶ an option of that command's parser
        `deploy/...`, `src/...`, `bench/...`, ...       ─▶ a file or folder of the repository

The generated references have their own tests (test_cli_reference.py, test_metrics_reference.py,
test_config_schema.py); this one covers every other page, where a renamed setting or flag stays behind.
Each checker is first shown to report a name that does not exist.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from txnguard.proxy import config_reference
from txnguard.proxy.metrics import ProxyMetrics

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Files named with a dot that are not settings (`policy.py`, `audit.jsonl`).
FILE_SUFFIX = re.compile(r"\.(py|rs|ya?ml|jsonl?|md|html|txt|toml|properties|service|sh|lock|so)$")
# TXNGUARD_* variables that are not settings: the test harness's (src/txnguard/testing).
HARNESS_VARIABLES = {"TXNGUARD_MAX_CLUSTERS", "TXNGUARD_FAILED_LOGS"}


def _lines(pages: list[Path]) -> Iterator[tuple[str, int, str]]:
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            yield str(page.relative_to(ROOT)), number, line


def settings() -> set[str]:
    """Every setting of the reference (`policy.rules[].mode` also as `policy.rules.mode`) and every section."""
    rows = [line.split("`")[1] for line in config_reference.markdown().splitlines() if line.startswith("| `")]
    names: set[str] = set()
    for row in rows:
        for key in (row, row.replace("[]", "")):
            parts = key.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


SETTINGS = settings()
SECTIONS = {name for name in SETTINGS if "." not in name}


def unknown_settings(lines: Iterator[tuple[str, int, str]]) -> list[str]:
    found = []
    for where, number, line in lines:
        for name in re.findall(r"`([a-z][a-z0-9_]*(?:\.[a-z0-9_\[\]]+)+)", line):
            if name.split(".")[0] in SECTIONS and not FILE_SUFFIX.search(name) and name not in SETTINGS \
                    and name.replace("[]", "") not in SETTINGS:
                found.append(f"{where}:{number}: {name}")
        for variable in re.findall(r"\bTXNGUARD_[A-Z0-9_]*[A-Z0-9]", line):
            if variable not in HARNESS_VARIABLES and \
                    variable.removeprefix("TXNGUARD_").lower().replace("__", ".") not in SETTINGS:
                found.append(f"{where}:{number}: {variable}")
    return found


def exported() -> set[str]:
    names: set[str] = set()
    for family in ProxyMetrics().registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in ("_total", "_bucket", "_count", "_sum", "_created"))
    return names


EXPORTED = exported()


def unknown_metrics(lines: Iterator[tuple[str, int, str]]) -> list[str]:
    return [f"{where}:{number}: {name}" for where, number, line in lines
            for name in re.findall(r"\btxnguard_[a-z0-9_]*[a-z0-9](?![a-z0-9_.])", line) if name not in EXPORTED]


def _parsers() -> dict[str, set[str]]:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: {o for a in parser._actions for o in a.option_strings} for name, parser in module.parsers().items()}


PARSERS = _parsers()


def unknown_flags(lines: Iterator[tuple[str, int, str]]) -> list[str]:
    """`txnguard <command> [<subcommand>] ... --flag` up to the end of the command (a backquote, a pipe, `;`, `&&`)."""
    found = []
    for where, number, line in lines:
        for m in re.finditer(r"\btxnguard((?: [a-z][a-z-]+)+)", line):
            command = "txnguard"
            for word in m.group(1).split():
                if f"{command} {word}" not in PARSERS:
                    break
                command = f"{command} {word}"
            if command == "txnguard":
                continue
            rest = re.split(r"`|\||;|&&", line[m.start():])[0]
            flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
            found += [f"{where}:{number}: {command} {flag}" for flag in flags if flag not in PARSERS[command]]
    return found


def missing_files(lines: Iterator[tuple[str, int, str]]) -> list[str]:
    """Backquoted repository paths; results of benchmark runs (bench/results/, not in the repository) aside."""
    found = []
    for where, number, line in lines:
        for path in re.findall(r"`((?:src|deploy|bench|tests|docs|tools|native)/[\w./*-]+)", line):
            path = path.rstrip(".")
            if path.startswith("bench/results/"):
                continue
            exists = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
            if not exists:
                found.append(f"{where}:{number}: {path}")
    return found


CHECKERS = [unknown_settings, unknown_metrics, unknown_flags, missing_files]


@pytest.mark.parametrize(("checker", "line"), [
    (unknown_settings, "set `verification.transaction_log_view` to false"),
    (unknown_settings, "or TXNGUARD_VERIFICATION__NO_SUCH_SETTING=1"),
    (unknown_metrics, "watch `txnguard_no_such_family_total`"),
    (unknown_flags, "`txnguard check-config --no-such-flag x.yaml`"),
    (unknown_flags, "`txnguard kafka up --version 3.5.2 --no-such-flag`"),
    (missing_files, "see `deploy/no-such-file.yaml`"),
])
def test_each_check_reports_a_name_that_does_not_exist(checker, line) -> None:
    assert len(checker(iter([("page.md", 1, line)]))) == 1


@pytest.mark.parametrize(("checker", "line"), [
    (unknown_settings, "`verification.transaction_log: false`, `policy.rules[]`, TXNGUARD_LIMITS__MAX_IN_FLIGHT, "
                       "`policy.py`, `audit.jsonl`"),
    (unknown_metrics, "`rate(txnguard_verification_time_ms_bucket[5m])`, `txnguard_ready`, `txnguard_guard.py`"),
    (unknown_flags, "`txnguard check-config --show x.yaml | grep --color x`, `txnguard kafka up --zookeeper`"),
    (missing_files, "`deploy/systemd/sidecar.yaml`, `bench/results/any.json`, `deploy/**/*.yaml`"),
])
def test_each_check_passes_names_that_exist(checker, line) -> None:
    assert checker(iter([("page.md", 1, line)])) == []


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.__name__)
def test_the_pages_name_only_what_exists(checker) -> None:
    found = checker(_lines(PAGES))
    assert found == []


def test_the_shipped_alerts_use_only_exported_families() -> None:
    alerts = sorted((ROOT / "deploy").rglob("alerts*.y*ml"))
    assert alerts
    assert unknown_metrics(_lines(alerts)) == []


def test_the_harness_variables_are_read_by_the_harness() -> None:
    harness = "".join(p.read_text() for p in (ROOT / "src" / "txnguard" / "testing").rglob("*.py"))
    assert all(f'"{variable}"' in harness for variable in HARNESS_VARIABLES)

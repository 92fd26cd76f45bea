"""Puts each command's `--help` into the command line reference (reference/cli.md) at docs build time.

A MkDocs hook (mkdocs.yml `hooks:`): in docs/reference/cli.md, each line `<!-- txnguard-help: txnguard kafka up -->`
becomes a text block with that command's help, formatted by its own argparse parser (`txnguard.cli.build_parser`
and, for kafka, dev and demo, `txnguard.testing.harness_cli.build_parser`), 100 columns wide. So every command, flag and
default on the page is the code's; the prose around the blocks is the page's own. A marker naming no command fails
the build; tests/unit/test_cli_reference.py fails when a command has no marker.

Run it alone to print the page as the site shows it: `python docs/gen_cli_reference.py`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = "reference/cli.md"
MARKER = re.compile(r"^<!-- txnguard-help: (txnguard(?: [a-z-]+)*) -->$", re.MULTILINE)
WIDTH = "100"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command, `txnguard` first, by its full name ("txnguard kafka up"), with the parser that reads it."""
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)  # this checkout's code, also when another txnguard is installed
    from txnguard import cli
    from txnguard.testing import harness_cli

    top = cli.build_parser()
    harness = _subcommands(harness_cli.build_parser())
    found: dict[str, argparse.ArgumentParser] = {"txnguard": top}

    def walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield name, parser
        for child, sub in _subcommands(parser).items():
            yield from walk(f"{name} {child}", sub)

    for name, parser in _subcommands(top).items():
        found.update(walk(f"txnguard {name}", harness.get(name, parser)))
    return found


def help_text(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps at the terminal's width: the page's is fixed
    try:
        return parser.format_help().rstrip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def render(markdown: str) -> str:
    known = parsers()

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in known:
            raise ValueError(f"{PAGE}: {match.group(0)} names no command (known: {', '.join(known)})")
        return f"```text\n{help_text(known[name])}\n```"

    return MARKER.sub(block, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the page's markers become the commands' help."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown


if __name__ == "__main__":
    print(render((ROOT / "docs" / PAGE).read_text()))

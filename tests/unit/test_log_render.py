"""Log lines for machines (JSON) or for a person at a terminal (structlog's ConsoleRenderer): `render="auto"`
picks by whether the stream is a TTY, as `txnguard demo` and `txnguard dev` do; `txnguard run` writes JSON."""

from __future__ import annotations

import io
import json

import pytest

from txnguard.proxy import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore():
    yield
    logs.configure("info")


def _write(stream: io.StringIO, render: str) -> str:
    logs.configure("info", stream, render)
    logs.get(component="proxy").info("verification_failed", decision="rejected", error="INVALID_TXN_STATE")
    return stream.getvalue()


def test_auto_writes_json_to_a_pipe_or_a_file():
    line = json.loads(_write(io.StringIO(), "auto"))
    assert (line["event"], line["decision"], line["level"]) == ("verification_failed", "rejected", "info")


def test_auto_renders_for_a_terminal():
    text = _write(Terminal(), "auto")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert "verification_failed" in text and "decision" in text and "rejected" in text
    assert "\x1b[" in text  # coloured: it is a terminal


def test_console_forced_on_a_pipe_is_plain_text_without_colours():
    text = _write(io.StringIO(), "console")
    assert "verification_failed" in text and "\x1b[" not in text and not text.startswith("{")


def test_json_stays_json_on_a_terminal():
    assert json.loads(_write(Terminal(), "json"))["event"] == "verification_failed"


def test_an_unknown_render_is_refused():
    with pytest.raises(ValueError, match="render must be one of json, console, auto"):
        logs.configure("info", io.StringIO(), "pretty")

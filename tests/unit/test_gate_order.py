"""The gate's file order (tests/conftest.py `LONGEST_FIRST`) names files that exist.

A renamed or removed file would drop out of the list silently and run wherever collection puts it; this
makes the rename fail here instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _longest_first() -> tuple[str, ...]:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["LONGEST_FIRST"]:
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError("tests/conftest.py has no LONGEST_FIRST")


def test_every_file_in_the_gates_order_exists_once():
    names = _longest_first()
    assert len(names) == len(set(names)) > 0
    assert [n for n in names if not (TESTS / "integration" / n).is_file()] == []

"""The test tree itself: pytest imports test modules by their base name (no packages under tests/), so two
files with one name in unit/ and integration/ stop the whole run at collection (a clean-clone CI run did)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique_across_the_tree():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []

"""The in-flight entry: the native class (native/src/relay.rs) and the Python one that stands in without the
native module have the same fields, the same defaults, and take the same assignments.

    InFlight(correlation id, key, version, action, sent at) ─▶ the same fields ─▶ the same values, native or not
"""

from __future__ import annotations

import gc
import weakref

import pytest

from txnguard.codecs import native
from txnguard.connection.apis import ResponseAction
from txnguard.connection.in_flight import InFlight, PythonInFlight

FIELDS = sorted(PythonInFlight.__slots__)


def _fields(entry: object) -> dict[str, object]:
    return {name: getattr(entry, name) for name in FIELDS}


def test_this_install_uses_the_native_entry() -> None:
    assert native.AVAILABLE, native.MISSING
    assert InFlight is native.InFlight and InFlight is not PythonInFlight


def test_both_are_made_alike() -> None:
    made = [cls(7, 22, 3, ResponseAction.OBSERVE, 1.5) for cls in (InFlight, PythonInFlight)]
    assert _fields(made[0]) == _fields(made[1])
    assert _fields(made[0])["retries"] == 0 and _fields(made[0])["response"] is None


@pytest.mark.parametrize("cls", [InFlight, PythonInFlight], ids=["native", "python"])
def test_every_field_takes_what_the_core_assigns(cls: type) -> None:
    entry = cls(7, 0, 9, ResponseAction.PASS, 1.5)
    given: dict[str, object] = {
        "correlation_id": 8, "api_key": 22, "api_version": 4, "action": ResponseAction.MERGE_PRODUCE,
        "sent_at": 2.5, "response": [b"x"], "observed": ("t", 1), "merge": object(), "evidence": "local",
        "evidence_at": 3.5, "request": b"frame", "retries": 2, "refused_at": 4.5,
    }
    assert sorted(given) == FIELDS
    for name, value in given.items():
        setattr(entry, name, value)
    assert _fields(entry) == given
    entry.response = entry.observed = entry.merge = entry.evidence = entry.request = entry.refused_at = None
    assert all(getattr(entry, name) is None for name in ("response", "observed", "merge", "evidence", "request",
                                                          "refused_at"))
    with pytest.raises(AttributeError):
        entry.context = 1  # no field beyond these


@pytest.mark.parametrize("cls", [InFlight, PythonInFlight], ids=["native", "python"])
def test_a_cycle_through_an_entry_is_collected(cls: type) -> None:
    class Decision:
        entry: object = None

    decision, entry = Decision(), cls(7, 0, 9, ResponseAction.MERGE_PRODUCE, 1.5)
    entry.merge, decision.entry = decision, entry  # entry ─▶ decision ─▶ entry
    gone = weakref.ref(decision)
    del decision, entry
    gc.collect()
    assert gone() is None  # the native class tells the cycle collector what it holds

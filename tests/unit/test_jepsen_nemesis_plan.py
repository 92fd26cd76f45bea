"""The nemesis plans its windows up front: every kind of the short form gets its window however slow the heals.

The rotation used to stop once another window would pass duration_s by the clock; on a loaded machine a slow
heal (a paused broker's catch-up) then dropped the last kind (proxy-kill) from the gate's run.
"""

from __future__ import annotations

from txnguard.testing.jepsen.nemesis import NemesisConfig


def test_the_short_form_plans_one_window_per_kind() -> None:
    kinds = ("delay", "hold-endtxn", "reset", "bandwidth", "broker-pause", "proxy-kill")
    assert NemesisConfig(kinds=kinds, period_s=6.0, duration_s=36.0).windows == len(kinds)


def test_windows_are_whole_periods_and_at_least_one() -> None:
    assert NemesisConfig(period_s=15.0, duration_s=300.0).windows == 20
    assert NemesisConfig(period_s=15.0, duration_s=44.0).windows == 2
    assert NemesisConfig(period_s=15.0, duration_s=5.0).windows == 1

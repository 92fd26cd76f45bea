from __future__ import annotations

import time

import pytest

pytest_plugins = ["txnguard.testing.fixtures"]

_STARTED = time.time()

# `make test` runs on two xdist workers a file at a time (`--dist loadfile --no-loadscope-reorder`): a worker
# takes the next file in collection order once it has two tests left. Left to itself, xdist orders files by
# how many tests they hold, which puts the files of one long test (a Spark cluster, a ZooKeeper matrix) last,
# where one of them can run alone for minutes while the other worker has nothing left. So the longest files
# (their summed setup + call + teardown in the gate's --durations, longest first) go first, and the hundreds
# of short unit files fill the gaps at the end: longest-processing-time-first scheduling.
LONGEST_FIRST = (
    "test_zookeeper_matrix.py",
    "test_pipeline.py",
    "test_rolling_upgrade_zk.py",
    "test_clients_through_proxy.py",
    "test_coordinator_unavailable.py",
    "test_verification.py",
    "test_hanging.py",
    "test_exactly_once.py",
    "test_coordinator_holds.py",
    "test_proxy_bounce.py",
    "test_unobserved_evidence.py",
    "test_log_follower_faults.py",
    "test_log_follower.py",
    "test_release.py",
    "test_pipeline_standalone.py",
    "test_harness.py",
    "test_concurrent_absorption_live.py",
    "test_coordinator_timeouts.py",
    "test_jepsen_lite.py",
    "test_kafka_17754.py",
    "test_smoke_direct.py",
    "test_kafka_28.py",
    "test_dashboards.py",
    "test_least_privilege.py",
    "test_sidecar_verification.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The broker logs a worker kept because a test failed (testing/fixtures.py), named and quoted here."""
    from txnguard.testing.fixtures import report_kept_logs  # here: imported first as the plugin it is

    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        report_kept_logs(_STARTED, terminalreporter.write_line)

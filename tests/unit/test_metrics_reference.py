"""The metrics page lists exactly the families a proxy exports.

A fresh ProxyMetrics is read as Prometheus reads it (its registry's collect(), every family with
or without a series yet); the page's table is read for the backquoted `txnguard_*` names in its
first column. A family added to the code and not to the page, or a page entry the code no longer
exports, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from txnguard.proxy.metrics import ProxyMetrics

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "metrics.md"


def exported_families() -> set[str]:
    """Each of txnguard's own families by the name a scrape shows: counters with their `_total` (the standard
    process_* families of prometheus_client's ProcessCollector are named once on the page, not listed)."""
    return {f"{f.name}_total" if f.type == "counter" else f.name for f in ProxyMetrics().registry.collect()
            if f.name.startswith("txnguard_")}


def documented_families() -> set[str]:
    names: set[str] = set()
    for line in PAGE.read_text().splitlines():
        cells = line.split("|")
        if line.startswith("| `txnguard_") and len(cells) > 2:
            names.update(re.findall(r"`(txnguard_[a-z0-9_]+)`", cells[1]))
    return names


def test_the_page_reads_a_table_of_families():
    documented = documented_families()
    assert "txnguard_ready" in documented and len(documented) > 30


def test_every_exported_family_is_on_the_page():
    assert sorted(exported_families() - documented_families()) == []


def test_every_family_on_the_page_is_exported():
    assert sorted(documented_families() - exported_families()) == []


def test_the_follower_families_come_from_the_same_registry():
    assert {"txnguard_transaction_log_lag_records", "txnguard_transaction_log_lag_seconds",
            "txnguard_transaction_log_transactional_ids",
            "txnguard_transaction_log_records_total"} <= exported_families()


def test_the_process_families_sizing_watches_are_exported_and_named_on_the_page():
    names = {f.name for f in ProxyMetrics().registry.collect()}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert "process_cpu_seconds_total" in PAGE.read_text()

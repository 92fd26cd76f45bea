"""A plain counter (proxy/traffic_metrics.py) scrapes as prometheus_client's Counter does: the same family, `_total`
samples per label set, the value the caller added."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txnguard.proxy.traffic_metrics import PlainCounter


def scraped(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_each_label_set_scrapes_as_a_total_of_what_was_added():
    registry = CollectorRegistry()
    records = PlainCounter("txnguard_x_records", "Records read.", ["outcome"], registry)
    records.labels("state")  # exists at 0 before its first count
    assert scraped(registry) == {("txnguard_x_records_total", (("outcome", "state"),)): 0.0}
    records.labels("state").value += 3
    records.labels("tombstone").value += 1
    assert scraped(registry) == {("txnguard_x_records_total", (("outcome", "state"),)): 3.0,
                                 ("txnguard_x_records_total", (("outcome", "tombstone"),)): 1.0}


def test_an_unlabelled_counter_has_one_child_and_a_wrong_label_count_is_refused():
    registry = CollectorRegistry()
    fetches = PlainCounter("txnguard_x_fetches", "Fetches sent.", [], registry)
    fetches.labels().value += 2
    assert fetches.labels() is fetches.labels()
    assert scraped(registry) == {("txnguard_x_fetches_total", ()): 2.0}
    with pytest.raises(ValueError, match="0 label values expected, got 1"):
        fetches.labels("a")

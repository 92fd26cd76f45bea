"""Open connections by KIP-511 software name and version: exact while honest, bounded whatever clients send.

    client A ─ApiVersions v3 (apache-kafka-java 3.5.2)─▶ proxy: {java 3.5.2: 1}
    client B ─ApiVersions v3 (apache-kafka-java 3.5.2)─▶ proxy: {java 3.5.2: 2}
    client A closes                                      proxy: {java 3.5.2: 1}
    client B closes                                      proxy: {}  (the series goes: only open ones count)
    a client naming itself "<script>" or 500 made-up versions: "invalid", then "other" past 200 series
"""

from __future__ import annotations

from txnguard.proxy.metrics import MAX_SOFTWARE_SERIES, ProxyMetrics


def live(m: ProxyMetrics) -> dict[tuple[str, str, str], float]:
    return {(s.labels["software_name"], s.labels["software_version"], s.labels["family"]): s.value
            for f in m.registry.collect() for s in f.samples if s.name == "txnguard_client_connections"}


def test_connections_are_counted_while_open_and_the_series_goes_with_the_last():
    m = ProxyMetrics()
    a = m.client_software_opened("apache-kafka-java", "3.5.2", "java")
    b = m.client_software_opened("apache-kafka-java", "3.5.2", "java")
    assert live(m) == {("apache-kafka-java", "3.5.2", "java"): 2.0}
    m.client_software_closed(a)
    assert live(m) == {("apache-kafka-java", "3.5.2", "java"): 1.0}
    m.client_software_closed(b)
    assert live(m) == {}


def test_names_outside_kip_511_and_too_many_series_cannot_grow_the_scrape():
    m = ProxyMetrics()
    assert m.client_software_opened("<script>", "1.0", "unknown") == ("invalid", "invalid", "unknown")
    assert m.client_software_opened("a" * 65, "1.0", "unknown")[0] == "invalid"   # longer than the pattern allows
    for i in range(MAX_SOFTWARE_SERIES + 300):
        m.client_software_opened("made-up", f"0.{i}", "unknown")
    series = live(m)
    assert len(series) == MAX_SOFTWARE_SERIES + 1  # the first 200 live ones (one of them "invalid"), then "other"
    assert series[("other", "other", "unknown")] == 301.0
    assert series[("invalid", "invalid", "unknown")] == 2.0

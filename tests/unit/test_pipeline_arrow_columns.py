"""The cheap Arrow forms of two column rules give what their plain definitions give (no Spark).

    target "TOPIC-PARTITION" ──_topic_partition──▶ what the regex ^(.*)-(\\d+)$ extracts
    time_ms                  ──_hour──────────────▶ what floor_temporal(hour) of the UTC timestamp gives
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from txnguard.pipeline import arrow_aggregates, arrow_tables

TARGETS = ["orders-3", "my-topic-12", "txn:abc", "a-", "-5", "a-b", "x-٣", "", None, "group:g-1", "t-0012", "a--1",
           "é-7", "t-1a"]


def test_the_topic_split_takes_what_the_regex_took():
    targets = pa.array(TARGETS, pa.string())
    regex = pc.extract_regex(targets, r"^(?P<topic>.*)-(?P<partition>\d+)$")
    topic, partition = arrow_tables._topic_partition(targets)
    assert topic.to_pylist() == pc.struct_field(regex, [0]).to_pylist()
    assert partition.to_pylist() == pc.struct_field(regex, [1]).to_pylist()
    assert topic.to_pylist()[:3] == ["orders", "my-topic", None]  # the comparison above is not of two empties


def test_the_hour_from_milliseconds_is_the_floored_timestamp_before_and_after_the_epoch():
    ms = pa.array([0, 1, 3_599_999, 3_600_000, -1, -3_600_000, -3_600_001, 1_767_225_601_000], pa.int64())
    floored = pc.floor_temporal(pc.cast(pc.multiply(ms, 1000), pa.timestamp("us", tz="UTC")), unit="hour")
    assert arrow_aggregates._hour(ms).equals(floored)

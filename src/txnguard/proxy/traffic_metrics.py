"""The connection cores' plain-int traffic counters as Prometheus metrics, built when /metrics is read."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from txnguard.codecs.schemas import api_name
from txnguard.connection.traffic import KEYS, RTT_BUCKETS, Traffic

CLIENT_TO_BROKER = "client_to_broker"
BROKER_TO_CLIENT = "broker_to_client"


class TrafficCollector(Collector):
    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic

    def collect(self) -> Iterator[Metric]:
        t = self.traffic
        frames = CounterMetricFamily("txnguard_frames", "Kafka frames forwarded or answered, per API and direction",
                                     labels=["api", "direction"])
        sizes = CounterMetricFamily("txnguard_bytes", "Bytes of Kafka frames per API and direction",
                                    labels=["api", "direction"])
        for direction, counts, totals in ((CLIENT_TO_BROKER, t.frames_in, t.bytes_in),
                                          (BROKER_TO_CLIENT, t.frames_out, t.bytes_out)):
            for key in range(KEYS):
                if counts[key]:
                    name = _name(key)
                    frames.add_metric([name, direction], counts[key])
                    sizes.add_metric([name, direction], totals[key])
        rtt = HistogramMetricFamily("txnguard_upstream_rtt_seconds",
                                    "From forwarding a request to its broker response, per API", labels=["api"])
        bounds = [*(str(b) for b in RTT_BUCKETS), "+Inf"]
        for key in range(KEYS):
            buckets = t.rtt_buckets[key]
            if buckets is None:
                continue
            cumulative, running = [], 0
            for bound, n in zip(bounds, buckets, strict=True):
                running += n
                cumulative.append((bound, running))
            rtt.add_metric([_name(key)], cumulative, t.rtt_sum[key])
        yield frames
        yield sizes
        yield rtt


def _name(key: int) -> str:
    return "other" if key == KEYS - 1 else api_name(key)

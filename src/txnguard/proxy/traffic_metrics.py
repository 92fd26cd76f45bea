"""The connection cores' plain-int traffic counters, and the verification's histograms, as Prometheus metrics
built when /metrics is read."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from txnguard.codecs.schemas import api_name
from txnguard.connection.traffic import KEYS, RTT_BUCKETS, TrafficCounters

C = TypeVar("C")  # a family's child: what `labels()` gives

CLIENT_TO_BROKER = "client_to_broker"
BROKER_TO_CLIENT = "broker_to_client"


class TrafficCollector(Collector):
    def __init__(self, traffic: TrafficCounters) -> None:
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
        rtt_buckets, rtt_sum = t.rtt_buckets, t.rtt_sum  # each read once: the native arrays' are copies
        for key in range(KEYS):
            buckets = rtt_buckets[key]
            if buckets is None:
                continue
            cumulative, running = [], 0
            for bound, n in zip(bounds, buckets, strict=True):
                running += n
                cumulative.append((bound, running))
            rtt.add_metric([_name(key)], cumulative, rtt_sum[key])
        yield frames
        yield sizes
        yield rtt


def _name(key: int) -> str:
    return "other" if key == KEYS - 1 else api_name(key)


class _PlainFamily(Collector, Generic[C]):
    """A labelled family counted in plain Python values: its children by label values, made by `labels()` as
    prometheus_client's are, and registered so that /metrics reads them (`collect`, in each family)."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry,
                 make: Callable[[], C]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self._make = make
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)

    def labels(self, *values: str) -> C:
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(key)}")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._make()
        return child


class PlainHistogram(_PlainFamily["PlainHistogramChild"]):
    """A labelled histogram counted in plain Python values, exported when /metrics is read.

    For the per-request path: a prometheus_client `observe` takes a lock per bucket and sum and walks
    its bounds in Python (~3 us); this is one bisect and two additions. Children are made by
    `labels()` as prometheus_client's are, and the exposition is the same (`_bucket` with `le`,
    `_count`, `_sum`), without the `_created` samples.
    """

    def __init__(self, name: str, documentation: str, labelnames: list[str], buckets: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        super().__init__(name, documentation, labelnames, registry, lambda: PlainHistogramChild(self.bounds))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for values, child in list(self._children.items()):
            cumulative, running = [], 0
            for bound, n in zip(bounds, child.counts, strict=True):
                running += n
                cumulative.append((bound, float(running)))
            family.add_metric(list(values), cumulative, child.sum)
        yield family


class PlainCounter(_PlainFamily["PlainCounterChild"]):
    """A labelled counter of plain ints, exported when /metrics is read.

    For counts made several times per transaction of the cluster (the follower of the coordinator's log counts
    each round and each record): prometheus_client's `inc` takes a lock and makes two Python calls each time; here
    the caller adds to a child's `value`. The exposition is prometheus_client's (`_total`), without `_created`.
    """

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry, PlainCounterChild)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(list(values), float(child.value))
        yield family


class PlainCounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class PlainHistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus' le
        self.sum += value

    def observe_many(self, values: list[float]) -> None:
        """`observe` of each value in turn (the sum adds them in this order: the same float)."""
        counts, bounds, total = self.counts, self.bounds, self.sum
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.sum = total

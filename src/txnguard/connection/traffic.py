"""Traffic counters in plain ints, shared by every connection of a proxy; exported at scrape time.

A prometheus_client `inc()` takes a lock and walks a few Python frames; per frame
that was a visible share of the relay's CPU. Here counting a frame is a few array
additions, and the shell's collector turns the arrays into metrics when /metrics is
read. With the native module (`make_traffic`) the arrays are native (native/src/traffic.rs):
the relay's book counts a response with no Python object touched. This class is the
fallback without it, and says what either does.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Protocol

from txnguard.codecs import native

# Upstream round trip buckets (seconds), the upper bounds of txnguard_upstream_rtt_seconds.
RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KEYS = 128  # API keys below this are counted per key (Kafka 4.x uses < 100); the rest share the last slot


class TrafficCounters(Protocol):
    """What the core counts into and the shell reads (lists by slot: the API key, the last slot for any other)."""

    @property
    def frames_in(self) -> list[int]: ...   # *_in: client to broker
    @property
    def bytes_in(self) -> list[int]: ...
    @property
    def frames_out(self) -> list[int]: ...  # *_out: broker to client
    @property
    def bytes_out(self) -> list[int]: ...
    @property
    def rtt_buckets(self) -> list[list[int] | None]: ...  # counts per bucket (the last is +Inf), not cumulative
    @property
    def rtt_sum(self) -> list[float]: ...
    def count_in(self, key: int, bytes_: int, /) -> None: ...
    def count_out(self, key: int, bytes_: int, seconds: float, /) -> None: ...


class Traffic:
    __slots__ = ("bytes_in", "bytes_out", "frames_in", "frames_out", "rtt_buckets", "rtt_sum")

    def __init__(self) -> None:
        self.frames_in = [0] * KEYS
        self.bytes_in = [0] * KEYS
        self.frames_out = [0] * KEYS
        self.bytes_out = [0] * KEYS
        self.rtt_buckets: list[list[int] | None] = [None] * KEYS
        self.rtt_sum = [0.0] * KEYS

    def count_in(self, key: int, bytes_: int, /) -> None:
        slot = key if 0 <= key < KEYS - 1 else KEYS - 1
        self.frames_in[slot] += 1
        self.bytes_in[slot] += bytes_

    def count_out(self, key: int, bytes_: int, seconds: float, /) -> None:
        slot = key if 0 <= key < KEYS - 1 else KEYS - 1
        self.frames_out[slot] += 1
        self.bytes_out[slot] += bytes_
        buckets = self.rtt_buckets[slot]
        if buckets is None:
            buckets = self.rtt_buckets[slot] = [0] * (len(RTT_BUCKETS) + 1)
        buckets[bisect_left(RTT_BUCKETS, seconds)] += 1
        self.rtt_sum[slot] += seconds


def make_traffic() -> TrafficCounters:
    """The proxy's counters: the native arrays where the module is there, else this module's lists."""
    if native.AVAILABLE:
        made: TrafficCounters = native.new_traffic(RTT_BUCKETS)
        return made
    return Traffic()

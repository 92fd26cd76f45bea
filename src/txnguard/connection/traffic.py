"""Traffic counters in plain ints, shared by every connection of a proxy; exported at scrape time.

A prometheus_client `inc()` takes a lock and walks a few Python frames; per frame
that was a visible share of the relay's CPU. Here counting a frame is two list
index additions, and the shell's collector turns the arrays into metrics when
/metrics is read.
"""

from __future__ import annotations

# Upstream round trip buckets (seconds), the upper bounds of txnguard_upstream_rtt_seconds.
RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KEYS = 128  # API keys below this are counted per key (Kafka 4.x uses < 100); the rest share the last slot


class Traffic:
    __slots__ = ("bytes_in", "bytes_out", "frames_in", "frames_out", "rtt_buckets", "rtt_sum")

    def __init__(self) -> None:
        # *_in: client to broker; *_out: broker to client; indexed by API key.
        self.frames_in = [0] * KEYS
        self.bytes_in = [0] * KEYS
        self.frames_out = [0] * KEYS
        self.bytes_out = [0] * KEYS
        # Per API key: counts per bucket (the last is +Inf), not cumulative; and the sum of seconds.
        self.rtt_buckets: list[list[int] | None] = [None] * KEYS
        self.rtt_sum = [0.0] * KEYS

"""The confluent-kafka copier's watch on send_offsets_to_transaction (librdkafka #5511/#5456).

    copier ──send_offsets_to_transaction──▶ producer (blocked forever: the bug)
    copier: the watch runs out ──▶ "hung" noted ──▶ the producer abandoned, kept referenced ──▶ a new one

A stand-in producer: the client's hang cannot be produced on demand (whether a real librdkafka hangs is a race:
bench/librdkafka_5511.py), so this checks only the copier's own decision; the rolling-upgrade test runs it with
the real client. No outcome here depends on how fast a thread is scheduled: a call that returns (or raises) is
watched for far longer than any scheduling delay (the watch ends when the call does, so that costs no time), and
a blocked call stays blocked until the test releases it, after the watch has run out.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from txnguard.testing.clients import confluent

LONG_WATCH_S = 600.0  # never reached: the call returns first, and the watch with it


class StandInProducer:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.release = threading.Event()
        self.calls: list[float] = []
        self.threads: list[threading.Thread] = []

    def send_offsets_to_transaction(self, _offsets: Any, _metadata: Any, timeout: float) -> None:
        self.calls.append(timeout)
        self.threads.append(threading.current_thread())
        if self.behaviour == "blocks":
            self.release.wait()  # until the test lets it go, whatever the watch
        elif self.behaviour == "raises":
            raise RuntimeError("NOT_COORDINATOR")


def loop_with(producer: StandInProducer, watch_s: float | None) -> Any:
    loop = object.__new__(confluent._ExactlyOnceLoop)
    loop.producer, loop.timeout_s, loop.watch_send_offsets_s = producer, 0.05, watch_s
    loop.errors, loop.timeline, loop.abandoned = [], [], []
    loop.trace = None
    return loop


def test_a_call_that_returns_in_time_is_not_watched_further() -> None:
    producer = StandInProducer("returns")
    loop = loop_with(producer, watch_s=LONG_WATCH_S)

    assert loop._send_offsets([], None) is True
    assert producer.calls == [0.05]  # its own timeout: the loop's, at most SEND_OFFSETS_TIMEOUT_S
    assert producer.threads != [threading.current_thread()]  # on a thread of its own, watched
    assert loop.timeline == []


def test_a_call_blocked_past_the_watch_is_noted_hung() -> None:
    producer = StandInProducer("blocks")
    loop = loop_with(producer, watch_s=0.1)
    try:
        assert loop._send_offsets([], None) is False
        [call] = producer.threads
        assert call.is_alive()  # the watch ran out while the call was still blocked, in that order
    finally:
        producer.release.set()

    [(_, kind, text)] = loop.timeline
    assert kind == "hung" and "#5511" in text


def test_the_trace_says_where_a_stuck_loop_is_as_it_happens(tmp_path: Path) -> None:
    producer = StandInProducer("blocks")
    loop = loop_with(producer, watch_s=0.1)
    loop.trace = (tmp_path / "copier.trace").open("a", buffering=1)
    try:
        loop._send_offsets([], None)
        # Written while the loop runs (line-buffered), not when it ends: a stuck loop never sends its result.
        lines = (tmp_path / "copier.trace").read_text().splitlines()
    finally:
        producer.release.set()
        loop.trace.close()

    assert [line.split(" ", 1)[1].split(":")[0] for line in lines] == ["calling", "hung"]
    assert lines[0].endswith("calling: send_offsets_to_transaction")


def test_the_calls_error_is_raised_on_the_loops_thread() -> None:
    loop = loop_with(StandInProducer("raises"), watch_s=LONG_WATCH_S)

    with pytest.raises(RuntimeError, match="NOT_COORDINATOR"):
        loop._send_offsets([], None)


def test_unwatched_the_call_runs_on_the_loops_thread_with_the_loops_timeout() -> None:
    producer = StandInProducer("returns")
    loop = loop_with(producer, watch_s=None)
    loop.timeout_s = 300.0

    assert loop._send_offsets([], None) is True
    assert producer.calls == [300.0] and producer.threads == [threading.current_thread()]


def test_past_the_limit_of_abandoned_producers_the_copy_gives_up() -> None:
    loop = loop_with(StandInProducer("blocks"), watch_s=0.1)
    loop.abandoned = [object()] * confluent.MAX_ABANDONED

    with pytest.raises(confluent.ClientError, match="abandoned"):
        loop._abandon_producer()

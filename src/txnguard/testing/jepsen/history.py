"""A Jepsen-style history: every operation is an invocation, then one completion by the same process.

    {"index": 7, "time": 1.25, "process": "w0", "type": "invoke", "f": "txn", "value": [...]}
    {"index": 9, "time": 1.31, "process": "w0", "type": "ok",     "f": "txn", "value": [...]}

Types as in Jepsen: `ok` (it happened), `fail` (it definitely did not: an aborted transaction),
`info` (unknown: a commit that timed out may or may not have taken effect). Operations (`f`):

    txn         micro-ops [["send", partition, value, offset|None], ["poll", [[partition, offset, value], ...]]]
    poll        a read_committed reader's poll: [[partition, offset, value], ...]
    assign      a reader (re)assigned its partitions from the start: its offsets may go back after it
    final-read  after the faults healed: {"partitions": [{"partition", "records", "stable", "end"}]}
    nemesis     {"kind": ..., "phase": "start"|"stop", ...} (type info)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Op = dict[str, Any]


class History:
    """Thread-safe, append-only; indexes are the order operations were recorded in."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def record(self, process: str, type_: str, f: str, value: Any, **extra: Any) -> Op:
        with self._lock:
            op = {"index": len(self.ops), "time": round(time.monotonic() - self._started, 4),
                  "process": process, "type": type_, "f": f, "value": value, **extra}
            self.ops.append(op)
            return op

    def write_jsonl(self, path: Path) -> None:
        with self._lock:
            path.write_text("".join(json.dumps(op) + "\n" for op in self.ops))


def read_jsonl(path: Path) -> list[Op]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def of_mode(ops: Iterable[Op], mode: str) -> list[Op]:
    """One mode's operations (processes named "<mode>/...") plus the nemesis's, which both modes share."""
    return [op for op in ops if op["f"] == "nemesis" or op["process"].startswith(f"{mode}/")]

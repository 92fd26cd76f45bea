"""A pure checker over a J1-lite history (no IO, no clock): feed it the operations, get the anomalies.

What it checks, after Jepsen's Kafka queue checker (jepsen.tests.kafka): J1 is Jepsen's queue workload run
under rotating faults, scaled down (docs/testing/jepsen-lite.md):

    aborted-read         a value of a transaction that failed (was aborted) was read at read_committed
    lost-write           a value of a committed (ok) transaction was never read although a reader read a
                         later offset of its partition, or the final read got past its offset
    duplicate            one value at two (partition, offset) positions
    inconsistent-offset  one (partition, offset) read with two different values
    torn-transaction     an ok or info transaction whose values are partly visible: some read, others
                         provably not (same test as lost-write); a failed one showing is an aborted read
    nonmonotonic-poll    one process's reads of one partition go back (or repeat an offset) with no
                         `assign` between them

Indeterminate (info) transactions are Jepsen's: they may or may not have committed, so their values
are never lost writes, and reading them is no aborted read; they must still be all or nothing.
A value read that nobody sent is counted as an inconsistent offset (the log holds something else).

Each anomaly is attributed to a fault kind: the last one the nemesis started at or before the operation
that shows it (the writer's completion for its values, the poll for a non-monotonic read), else "none".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txnguard.testing.jepsen.history import Op

CLASSES = ("aborted-read", "lost-write", "duplicate", "inconsistent-offset", "torn-transaction",
           "nonmonotonic-poll")


@dataclass(frozen=True)
class Anomaly:
    kind: str          # one of CLASSES
    fault: str         # the fault kind it is attributed to
    index: int         # the operation it is attributed to
    detail: str


@dataclass
class _Write:
    value: str
    partition: int
    offset: int | None
    outcome: str       # ok, fail, info
    txn: int           # index of the transaction's completion


@dataclass
class CheckResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(CLASSES, 0)
        for a in self.anomalies:
            out[a.kind] += 1
        return out

    def by_fault(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CLASSES, 0))
        for a in self.anomalies:
            out[a.fault][a.kind] += 1
        return dict(out)

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def summary(self) -> dict[str, Any]:
        return {"valid": self.valid, "counts": self.counts(), "by_fault": self.by_fault(), "stats": self.stats,
                "examples": [a.__dict__ for a in self.anomalies[:20]]}


def _pairs(ops: Sequence[Op]) -> list[tuple[Op, Op]]:
    """(invocation, completion) per operation; an invocation never completed counts as info."""
    open_: dict[str, Op] = {}
    out: list[tuple[Op, Op]] = []
    for op in ops:
        if op["f"] == "nemesis":
            continue
        if op["type"] == "invoke":
            open_[op["process"]] = op
        elif op["process"] in open_:
            out.append((open_.pop(op["process"]), op))
        else:
            out.append((op, op))  # a completion recorded alone (a poll, an assign, the final read)
    for inv in open_.values():
        out.append((inv, {**inv, "type": "info"}))
    out.sort(key=lambda p: p[1]["index"])
    return out


def _fault_at(nemesis: list[tuple[int, str]], index: int) -> str:
    kind = "none"
    for start, k in nemesis:
        if start > index:
            break
        kind = k
    return kind


@dataclass
class _Parsed:
    writes: dict[str, _Write] = field(default_factory=dict)
    txns: dict[int, list[str]] = field(default_factory=dict)            # completion index -> its values
    # process, op index, partition, offset, value
    reads: list[tuple[str, int, int, int, str]] = field(default_factory=list)
    assigns: list[tuple[str, int]] = field(default_factory=list)
    stable: dict[int, int] = field(default_factory=dict)    # final read: partition -> offsets below it are readable
    complete: dict[int, bool] = field(default_factory=dict)  # final read: partition read to its log end
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def reads_of(self, process: str, index: int, records: Iterable[Sequence[Any]]) -> None:
        self.reads.extend((process, index, int(p), int(o), str(v)) for p, o, v in records)


def _parse(ops: Sequence[Op]) -> _Parsed:
    out = _Parsed()
    for _, done in _pairs(ops):
        f, process, index = done["f"], done["process"], done["index"]
        if f == "txn":
            out.outcomes[done["type"]] += 1
            sent: list[str] = []
            for m in done["value"]:
                if m[0] == "send":
                    _, p, v, off = m
                    out.writes[v] = _Write(v, int(p), None if off is None else int(off), done["type"], index)
                    sent.append(v)
                elif m[0] == "poll":
                    out.reads_of(process, index, m[1])
            out.txns[index] = sent
        elif f == "poll" and done["type"] == "ok":
            out.reads_of(process, index, done["value"])
        elif f == "assign":
            out.assigns.append((process, index))
        elif f == "final-read" and done["type"] == "ok":
            for part in done["value"]["partitions"]:
                p = int(part["partition"])
                out.stable[p] = int(part["stable"])
                out.complete[p] = int(part["stable"]) >= int(part["end"])
                out.reads_of(process, index, ([p, o, v] for o, v in part["records"]))
    return out


class _Checker:
    def __init__(self, ops: Sequence[Op]) -> None:
        self.nemesis = [(o["index"], str(o["value"]["kind"])) for o in ops
                        if o["f"] == "nemesis" and o["value"].get("phase") == "start"]
        self.h = _parse(ops)
        self.result = CheckResult()
        self.where: dict[str, set[tuple[int, int]]] = defaultdict(set)   # value -> positions it was read at
        self.highest: dict[int, int] = defaultdict(lambda: -1)           # partition -> highest offset read

    def report(self, kind: str, index: int, detail: str) -> None:
        self.result.anomalies.append(Anomaly(kind, _fault_at(self.nemesis, index), index, detail))

    def positions(self) -> None:
        """Duplicates (a value at two positions) and inconsistent offsets (a position with two values)."""
        at: dict[tuple[int, int], set[str]] = defaultdict(set)
        first_read: dict[str, int] = {}
        for _, index, p, o, v in self.h.reads:
            at[(p, o)].add(v)
            self.where[v].add((p, o))
            first_read.setdefault(v, index)
            self.highest[p] = max(self.highest[p], o)
        for (p, o), values in sorted(at.items()):
            if len(values) > 1:
                self.report("inconsistent-offset", min(first_read[v] for v in values),
                            f"{p}/{o} holds {sorted(values)}")
        for v, where in sorted(self.where.items()):
            w = self.h.writes.get(v)
            if w is None:
                self.report("inconsistent-offset", first_read[v], f"{v} read at {sorted(where)} was never sent")
            elif len(where) > 1:
                self.report("duplicate", w.txn, f"{v} at {sorted(where)}")

    def provably_unread(self, w: _Write) -> bool:
        """Never read, though a reader got past it (or, offset unknown, the final read got to the end)."""
        if w.value in self.where:
            return False
        if w.offset is not None:
            return self.highest[w.partition] > w.offset or w.offset < self.h.stable.get(w.partition, -1)
        return self.h.complete.get(w.partition, False)

    def writes(self) -> None:
        for w in self.h.writes.values():
            if w.outcome == "fail" and w.value in self.where:
                self.report("aborted-read", w.txn,
                            f"{w.value} of failed txn {w.txn} read at {sorted(self.where[w.value])}")
            elif w.outcome == "ok" and self.provably_unread(w):
                self.report("lost-write", w.txn, f"{w.value} ({w.partition}/{w.offset}) of ok txn {w.txn} never read")
        for index, values in self.h.txns.items():
            ws = [self.h.writes[v] for v in values]
            if len(ws) < 2 or ws[0].outcome == "fail":
                continue
            seen = [w.value for w in ws if w.value in self.where]
            missing = [w.value for w in ws if self.provably_unread(w)]
            if seen and missing:
                self.report("torn-transaction", index, f"txn {index} ({ws[0].outcome}): read {seen}, never {missing}")

    def monotonic(self) -> None:
        """Per process and partition, offsets only go forward between two assigns (the final read is not a poller)."""
        last: dict[tuple[str, int], int] = {}
        events = sorted([(i, 0, proc, -1, -1) for proc, i in self.h.assigns] +
                        [(i, 1, proc, p, o) for proc, i, p, o, _ in self.h.reads if not proc.endswith("final")])
        for index, is_read, proc, p, o in events:
            if not is_read:
                for key in [k for k in last if k[0] == proc]:
                    del last[key]
                continue
            prev = last.get((proc, p))
            if prev is not None and o <= prev:
                self.report("nonmonotonic-poll", index, f"{proc} read {p}/{o} after {p}/{prev}")
            last[(proc, p)] = o

    def stats(self) -> dict[str, int]:
        writes = self.h.writes.values()
        return {"txn-ok": self.h.outcomes["ok"], "txn-fail": self.h.outcomes["fail"],
                "txn-info": self.h.outcomes["info"], "sends": len(self.h.writes), "reads": len(self.h.reads),
                "unseen-ok": sum(1 for w in writes
                                 if w.outcome == "ok" and w.value not in self.where and not self.provably_unread(w)),
                "partitions-stuck": sum(1 for ok in self.h.complete.values() if not ok)}


def check(ops: Iterable[Op]) -> CheckResult:
    checker = _Checker(sorted(ops, key=lambda o: o["index"]))
    checker.positions()
    checker.writes()
    checker.monotonic()
    checker.result.stats = checker.stats()
    return checker.result

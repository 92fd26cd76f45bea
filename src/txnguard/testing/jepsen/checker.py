"""A pure checker over a J1-lite history (no IO, no clock): feed it the operations, get the anomalies.

What it checks, after Jepsen's Kafka queue checker (jepsen.tests.kafka) and the J1 recipe
(../shared/notes/reliability-anchors.md):

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


def check(ops: Iterable[Op]) -> CheckResult:
    ops = sorted(ops, key=lambda o: o["index"])
    nemesis = [(o["index"], str(o["value"]["kind"])) for o in ops
               if o["f"] == "nemesis" and o["value"].get("phase") == "start"]
    result = CheckResult()

    def report(kind: str, index: int, detail: str) -> None:
        result.anomalies.append(Anomaly(kind, _fault_at(nemesis, index), index, detail))

    writes: dict[str, _Write] = {}
    txns: dict[int, list[str]] = {}
    reads: list[tuple[str, int, int, int, str]] = []  # process, op index, partition, offset, value
    assigns: list[tuple[str, int]] = []
    stable: dict[int, int] = {}                       # final read: partition -> offsets below are readable
    complete: dict[int, bool] = {}                    # final read: partition read to its log end
    outcomes: dict[str, int] = defaultdict(int)

    for inv, done in _pairs(ops):
        f, process = done["f"], done["process"]
        if f == "txn":
            outcome = done["type"]
            outcomes[outcome] += 1
            sent: list[str] = []
            for m in done["value"]:
                if m[0] == "send":
                    _, p, v, off = m
                    writes[v] = _Write(v, int(p), None if off is None else int(off), outcome, done["index"])
                    sent.append(v)
                elif m[0] == "poll":
                    reads.extend((process, done["index"], int(p), int(o), v) for p, o, v in m[1])
            txns[done["index"]] = sent
        elif f == "poll" and done["type"] == "ok":
            reads.extend((process, done["index"], int(p), int(o), v) for p, o, v in done["value"])
        elif f == "assign":
            assigns.append((process, done["index"]))
        elif f == "final-read" and done["type"] == "ok":
            for part in done["value"]["partitions"]:
                p = int(part["partition"])
                stable[p] = int(part["stable"])
                complete[p] = int(part["stable"]) >= int(part["end"])
                reads.extend((process, done["index"], p, int(o), v) for o, v in part["records"])

    # Positions: duplicates and inconsistent offsets.
    at: dict[tuple[int, int], set[str]] = defaultdict(set)
    where: dict[str, set[tuple[int, int]]] = defaultdict(set)
    first_read: dict[str, int] = {}
    highest: dict[int, int] = defaultdict(lambda: -1)
    for _, index, p, o, v in reads:
        at[(p, o)].add(v)
        where[v].add((p, o))
        first_read.setdefault(v, index)
        highest[p] = max(highest[p], o)
    for (p, o), values in sorted(at.items()):
        if len(values) > 1:
            report("inconsistent-offset", min(first_read[v] for v in values), f"{p}/{o} holds {sorted(values)}")
    for v, positions in sorted(where.items()):
        w = writes.get(v)
        if w is None:
            report("inconsistent-offset", first_read[v], f"{v} read at {sorted(positions)} was never sent")
        elif len(positions) > 1:
            report("duplicate", w.txn, f"{v} at {sorted(positions)}")

    def provably_unread(w: _Write) -> bool:
        if w.value in where:
            return False
        if w.offset is not None:
            return highest[w.partition] > w.offset or w.offset < stable.get(w.partition, -1)
        return complete.get(w.partition, False)

    for w in writes.values():
        if w.outcome == "fail" and w.value in where:
            report("aborted-read", w.txn, f"{w.value} of failed txn {w.txn} read at {sorted(where[w.value])}")
        elif w.outcome == "ok" and provably_unread(w):
            report("lost-write", w.txn, f"{w.value} ({w.partition}/{w.offset}) of ok txn {w.txn} never read")
    for index, values in txns.items():
        ws = [writes[v] for v in values]
        if len(ws) < 2 or ws[0].outcome == "fail":
            continue
        seen = [w.value for w in ws if w.value in where]
        missing = [w.value for w in ws if provably_unread(w)]
        if seen and missing:
            report("torn-transaction", index, f"txn {index} ({ws[0].outcome}): read {seen}, never {missing}")

    # Monotonic polls, per process and partition, reset by an assign.
    last: dict[tuple[str, int], int] = {}
    resets = sorted(assigns, key=lambda a: a[1])
    events = sorted([(i, 0, proc, -1, -1) for proc, i in resets] +
                    [(i, 1, proc, p, o) for proc, i, p, o, _ in reads if not proc.endswith("final")])
    for index, is_read, proc, p, o in events:
        if not is_read:
            for key in [k for k in last if k[0] == proc]:
                del last[key]
            continue
        prev = last.get((proc, p))
        if prev is not None and o <= prev:
            report("nonmonotonic-poll", index, f"{proc} read {p}/{o} after {p}/{prev}")
        last[(proc, p)] = o

    result.stats = {"txn-ok": outcomes["ok"], "txn-fail": outcomes["fail"], "txn-info": outcomes["info"],
                    "sends": len(writes), "reads": len(reads),
                    "unseen-ok": sum(1 for w in writes.values()
                                     if w.outcome == "ok" and w.value not in where and not provably_unread(w)),
                    "partitions-stuck": sum(1 for ok in complete.values() if not ok)}
    return result

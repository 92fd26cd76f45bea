"""What the relay decided and saw without commands, in plain values, for the shell to record in batches.

The relay's fast path takes a transactional Produce whose partitions all have local evidence, and a
TxnOffsetCommit whose group has local evidence, without leaving its loop: no `Decided` command, no
`Decision` object. What the general path's `Decided` would have made the shell record (metrics, an
audit record per partition or group) goes into the connection's ledger as one tuple instead, and
every closed check-to-append window (either path's) as an (evidence, milliseconds) pair. The tuple
carries the decision's wall-clock time (the core's clock), so the shell may record it later: it records
the ledger in batches, always before a call's commands and before anything reads what it records, so
records keep the order of the requests (proxy/guard.py, `TransactionGuard.booked`). The shell may give
several connections one ledger.

A TxnOffsetCommit is rarer than a write (one per transaction at most, against many writes), so it has
a list of its own and the Produce tuples stay as they are (the hot case pays nothing for it). Each
offset commit carries its place among the Produce tuples (how many were booked before it), so the
shell records the two kinds in the order they were booked.
"""

from __future__ import annotations

from txnguard.policies.enforcement import Enforcement
from txnguard.verification.audit import ClientInfo
from txnguard.verification.verdicts import Verdict

# A transactional Produce passed on local evidence: (client, transactional id, producer id, producer epoch,
# api version, partitions, the verdict every partition got, mode, inspection ms, verification ms, cpu ms or
# None when not measured, the decision's wall-clock ms). Its `Decision` would have had one "forwarded" record
# per partition.
Passed = tuple[ClientInfo, str, int, int, int, list[tuple[str, int]], Verdict, Enforcement, float, float, float | None,
               int]

# A TxnOffsetCommit (v0-v4) passed on local evidence: as `Passed`, with the group id instead of the partitions
# (its `Decision` would have had one "forwarded" record, target "group:<id>"), then its place: how many
# `Passed` of the same ledger were booked before it.
PassedOffsets = tuple[ClientInfo, str, int, int, int, str, Verdict, Enforcement, float, float, float | None, int, int]


class Ledger:
    __slots__ = ("offsets", "passed", "windows")

    def __init__(self) -> None:
        self.passed: list[Passed] = []
        self.offsets: list[PassedOffsets] = []
        self.windows: list[tuple[str, float]] = []  # (evidence, check-to-append window ms) per answered write

    def __len__(self) -> int:
        """Entries waiting (the shell records them past a bound)."""
        return len(self.passed) + len(self.offsets) + len(self.windows)

    def take(self) -> tuple[list[Passed], list[PassedOffsets], list[tuple[str, float]]]:
        passed, offsets, windows = self.passed, self.offsets, self.windows
        self.passed, self.offsets, self.windows = [], [], []
        return passed, offsets, windows

"""What the relay decided and saw without commands, in plain values, for the shell to record in batches.

The relay's fast path takes a transactional Produce whose partitions all have local evidence, and a
TxnOffsetCommit whose group has local evidence, without leaving its loop: no `Decided` command, no
`Decision` object. What the general path's `Decided` would have made the shell record (metrics, an
audit record per partition or group) goes into the connection's ledger as one named record instead
(`Passed`, `PassedOffsets`: verification/passed.py, made by the rules), and every closed check-to-append
window (either path's) as an (evidence, milliseconds) pair. The record carries the decision's wall-clock
time (the core's clock), so the shell may record it later: it records the ledger in batches, always
before a call's commands and before anything reads what it records, so records keep the order of the
requests (proxy/guard.py, `TransactionGuard.booked`). The shell may give several connections one ledger.

A TxnOffsetCommit is rarer than a write (one per transaction at most, against many writes), so it has
a list of its own and the Produce records stay as they are (the hot case pays nothing for it). Each
offset commit carries its place among the Produce records (how many were booked before it), so the
shell records the two kinds in the order they were booked.
"""

from __future__ import annotations

from txnguard.verification.passed import Passed, PassedOffsets

__all__ = ["Ledger", "Passed", "PassedOffsets"]


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

"""The J1-lite checker (txnguard.testing.jepsen.checker) on small hand-written histories.

Each anomaly class has a history that shows it and must be found; the clean history must give zero.
Without these the integration test's "0 anomalies through the proxy" could not fail.

    w0: txn [send a, send b] ──ok──▶ offsets 0, 1          r0: poll ─▶ 0:a, 1:b        final read ─▶ a, b
"""

from __future__ import annotations

from typing import Any

from txnguard.testing.jepsen.checker import CLASSES, check
from txnguard.testing.jepsen.history import History, Op, of_mode


class H:
    """A tiny history builder: one line per operation, as the workload records them."""

    def __init__(self) -> None:
        self.h = History()

    def txn(self, process: str, outcome: str, *micro: list[Any]) -> H:
        self.h.record(process, "invoke", "txn", [[m[0], m[1], m[2], None] if m[0] == "send" else ["poll", []]
                                                 for m in micro])
        self.h.record(process, outcome, "txn", [list(m) for m in micro])
        return self

    def poll(self, process: str, *records: tuple[int, int, str]) -> H:
        self.h.record(process, "ok", "poll", [list(r) for r in records])
        return self

    def assign(self, process: str) -> H:
        self.h.record(process, "ok", "assign", None)
        return self

    def fault(self, kind: str) -> H:
        self.h.record("nemesis", "info", "nemesis", {"kind": kind, "phase": "start"})
        return self

    def final(self, *partitions: tuple[int, list[tuple[int, str]], int, int]) -> H:
        self.h.record("final", "ok", "final-read", {"partitions": [
            {"partition": p, "records": [list(r) for r in recs], "stable": stable, "end": end}
            for p, recs, stable, end in partitions]})
        return self

    @property
    def ops(self) -> list[Op]:
        return self.h.ops


def clean() -> H:
    return (H().txn("w0", "ok", ["send", 0, "a", 0], ["send", 0, "b", 1])
               .poll("r0", (0, 0, "a"), (0, 1, "b"))
               .final((0, [(0, "a"), (1, "b")], 2, 2)))


def only(counts: dict[str, int], kind: str) -> bool:
    return counts[kind] > 0 and all(n == 0 for k, n in counts.items() if k != kind)


def test_a_clean_history_has_no_anomaly() -> None:
    result = check(clean().ops)
    assert result.valid and result.counts() == dict.fromkeys(CLASSES, 0)
    assert result.stats["txn-ok"] == 1 and result.stats["sends"] == 2


def test_a_value_of_an_aborted_transaction_read_is_an_aborted_read() -> None:
    h = (H().fault("hold-endtxn")
            .txn("w0", "fail", ["send", 0, "x", 0])
            .poll("r0", (0, 0, "x")))
    result = check(h.ops)
    assert only(result.counts(), "aborted-read")
    assert result.by_fault() == {"hold-endtxn": {**dict.fromkeys(CLASSES, 0), "aborted-read": 1}}


def test_a_committed_value_skipped_by_a_reader_that_read_past_it_is_lost() -> None:
    h = (H().txn("w0", "ok", ["send", 0, "a", 0])
            .txn("w1", "ok", ["send", 0, "b", 1])
            .poll("r0", (0, 1, "b")))
    assert only(check(h.ops).counts(), "lost-write")


def test_a_committed_value_missing_from_a_complete_final_read_is_lost() -> None:
    h = H().txn("w0", "ok", ["send", 1, "a", None]).final((1, [], 0, 0))
    assert only(check(h.ops).counts(), "lost-write")


def test_a_committed_value_past_a_stuck_final_read_is_unseen_not_lost() -> None:
    # The last stable offset hangs at 0 (an open transaction): nothing says the value is gone.
    h = H().txn("w0", "ok", ["send", 0, "a", 3]).final((0, [], 0, 4))
    result = check(h.ops)
    assert result.valid
    assert result.stats["unseen-ok"] == 1 and result.stats["partitions-stuck"] == 1


def test_an_indeterminate_transaction_may_or_may_not_have_committed() -> None:
    seen = H().txn("w0", "info", ["send", 0, "a", 0]).final((0, [(0, "a")], 1, 1))
    unseen = H().txn("w0", "info", ["send", 0, "a", None]).final((0, [], 0, 0))
    assert check(seen.ops).valid and check(unseen.ops).valid


def test_an_invocation_never_completed_counts_as_indeterminate() -> None:
    h = H()
    h.h.record("w0", "invoke", "txn", [["send", 0, "a", None]])
    h.final((0, [], 0, 0))
    result = check(h.ops)
    assert result.valid and result.stats["txn-info"] == 1


def test_one_value_at_two_offsets_is_a_duplicate() -> None:
    h = (H().txn("w0", "ok", ["send", 0, "a", 0])
            .poll("r0", (0, 0, "a"), (0, 1, "a")))
    assert only(check(h.ops).counts(), "duplicate")


def test_one_offset_with_two_values_is_inconsistent() -> None:
    h = (H().txn("w0", "ok", ["send", 0, "a", 0]).txn("w1", "ok", ["send", 0, "b", 1])
            .poll("r0", (0, 0, "a"), (0, 1, "b"))
            .poll("r1", (0, 0, "b"), (0, 1, "a")))
    counts = check(h.ops).counts()
    assert counts["inconsistent-offset"] == 2
    assert counts["duplicate"] == 2  # and each value then sits at two offsets


def test_a_committed_transaction_partly_visible_is_torn() -> None:
    # KAFKA-17754's shape: the late commit of T1 ends T2 early, T2's second write never becomes readable.
    h = (H().fault("hold-endtxn")
            .txn("w0", "ok", ["send", 0, "t2-a", 0], ["send", 1, "t2-b", 0])
            .final((0, [(0, "t2-a")], 1, 1), (1, [], 1, 1)))
    counts = check(h.ops).counts()
    assert counts["torn-transaction"] == 1 and counts["lost-write"] == 1
    assert counts["aborted-read"] == counts["duplicate"] == counts["nonmonotonic-poll"] == 0


def test_an_indeterminate_transaction_partly_visible_is_torn() -> None:
    h = (H().txn("w0", "info", ["send", 0, "a", 0], ["send", 1, "b", None])
            .final((0, [(0, "a")], 1, 1), (1, [], 0, 0)))
    assert only(check(h.ops).counts(), "torn-transaction")


def test_a_poll_going_back_without_an_assign_is_nonmonotonic() -> None:
    h = (H().txn("w0", "ok", ["send", 0, "a", 0], ["send", 0, "b", 1])
            .poll("r0", (0, 0, "a"), (0, 1, "b"))
            .poll("r0", (0, 1, "b")))
    assert only(check(h.ops).counts(), "nonmonotonic-poll")


def test_a_poll_going_back_after_an_assign_is_fine() -> None:
    h = (H().txn("w0", "ok", ["send", 0, "a", 0], ["send", 0, "b", 1])
            .poll("r0", (0, 0, "a"), (0, 1, "b"))
            .assign("r0")
            .poll("r0", (0, 0, "a"), (0, 1, "b")))
    assert check(h.ops).valid


def test_polls_inside_a_transaction_count_as_reads() -> None:
    h = (H().txn("w0", "fail", ["send", 0, "x", 0])
            .txn("w1", "ok", ["poll", [[0, 0, "x"]]]))
    assert only(check(h.ops).counts(), "aborted-read")


def test_an_anomaly_is_attributed_to_the_fault_started_last_before_it() -> None:
    h = (H().fault("delay").txn("w0", "ok", ["send", 0, "a", 0])
            .fault("broker-pause").txn("w0", "fail", ["send", 0, "x", 1])
            .poll("r0", (0, 0, "a"), (0, 1, "x")))
    assert set(check(h.ops).by_fault()) == {"broker-pause"}


def test_a_mode_is_its_own_processes_plus_the_shared_nemesis() -> None:
    h = (H().fault("delay").txn("direct/w0", "fail", ["send", 0, "x", 0])
            .txn("proxied/w0", "ok", ["send", 0, "y", 0])
            .poll("direct/r0", (0, 0, "x")).poll("proxied/r0", (0, 0, "y")))
    assert check(of_mode(h.ops, "direct")).counts()["aborted-read"] == 1
    assert check(of_mode(h.ops, "proxied")).valid

"""Hanging transactions after their own timeout (`OwnTimeout`), as sequences of what the brokers answered.

One timeline per test, on a fake clock: `at(s)` is s seconds after the producer's last write on the partition
(DescribeProducers' lastTimestamp). Each test walks a scan: the leader's DescribeProducers answer, the
ListTransactions listing, the coordinator's DescribeTransactions answer, and (for a finding) the leader's
second answer, then what is reported. The rule under test: a partition hangs once its coordinator no longer
lists it and the last write is older than that transaction's own timeout plus the margin (10 s).
"""

from txnguard.verification.hanging import (
    NO_TRANSACTIONAL_ID,
    NOT_IN_TRANSACTION,
    TRANSACTIONAL_ID_NOT_FOUND,
    UNCONFIRMED,
    AskDescriptions,
    AskProducers,
    AskProducersAgain,
    AskTransactionalIds,
    Done,
    Finding,
    HangingScan,
    MaxTimeout,
    OwnTimeout,
    ProducerState,
    Step,
    TransactionView,
    find_hanging,
)

S = 1000
WRITE = 1_700_000_000_000           # the producer's last write on the partition (lastTimestamp)
T, U = ("orders", 0), ("orders", 1)
RULE = OwnTimeout(margin_ms=10 * S)  # the default margin


def at(seconds: float) -> int:
    return WRITE + int(seconds * S)


def open_on(pid: int = 7, start: int = 42, last: int = WRITE) -> ProducerState:
    """The leader's view: producer `pid` has an open transaction on the partition from offset `start`."""
    return ProducerState(pid, 0, last, -1, start)


def closed(pid: int = 7) -> ProducerState:
    """The leader's view after the marker: the producer is known, no transaction open."""
    return ProducerState(pid, 0, WRITE, 3, -1)


def coordinator(state: str, partitions: frozenset[tuple[str, int]] = frozenset(), timeout_s: int = 60,
                pid: int = 7) -> TransactionView:
    return TransactionView("app", state, pid, 0, partitions, timeout_s * S, WRITE - 500)


def ask_coordinator(scan: HangingScan, now: int, leader: dict[tuple[str, int], list[ProducerState]],
                    described: TransactionView | None, listed: bool = True) -> Step:
    """leader -> scan (DescribeProducers at `now`), brokers -> scan (ListTransactions: "app" for pid 7),
    coordinator -> scan (DescribeTransactions "app"): the step after the coordinator answered."""
    assert scan.start() == AskProducers(tuple(sorted(leader)))
    step = scan.producers_answered(leader, now)
    assert isinstance(step, AskTransactionalIds), step
    step = scan.transactional_ids_answered([("app", 7)] if listed else [])
    if isinstance(step, AskDescriptions):
        assert step == AskDescriptions(frozenset({"app"}))
        step = scan.descriptions_answered({"app": described})
    return step


def only(step: Step) -> Finding:
    assert isinstance(step, Done) and len(step.findings) == 1, step
    return step.findings[0]


# -- a hanging transaction: reported once its own timeout and the margin have passed ----------------------------


def test_a_partition_its_coordinator_never_listed_hangs_after_its_own_timeout_plus_the_margin():
    # Producer 7 (timeout 60 s) wrote to T without AddPartitionsToTxn; its coordinator shows no transaction.
    for seconds in (30, 69, 70):  # not yet: the threshold is 60 s + 10 s, and exactly 70 s is not past it
        step = ask_coordinator(HangingScan([T], RULE), at(seconds), {T: [open_on()]}, coordinator("Empty"))
        assert step == Done(()), seconds

    scan = HangingScan([T], RULE)
    step = ask_coordinator(scan, at(70.001), {T: [open_on()]}, coordinator("Empty"))
    assert step == AskProducersAgain((T,))          # the leader is asked again, after the coordinator answered
    f = only(scan.producers_answered_again({T: [open_on()]}))  # still open, same producer, same start offset
    assert (f.topic, f.partition, f.producer_id, f.start_offset) == ("orders", 0, 7, 42)
    assert (f.reason, f.coordinator_state, f.transactional_id) == (NOT_IN_TRANSACTION, "Empty", "app")
    assert (f.threshold_ms, f.transaction_timeout_ms) == (70 * S, 60 * S)


def test_find_hangings_rule_would_wait_fifteen_minutes_for_the_same_transaction():
    scan = HangingScan([T], MaxTimeout())
    scan.start()
    assert scan.producers_answered({T: [open_on()]}, at(71)) == Done(())  # not even a candidate
    assert find_hanging({T: [open_on()]}, at(15 * 60 + 1), MaxTimeout(), [("app", 7)],
                        {"app": coordinator("Empty")})[0].threshold_ms == 15 * 60 * S


def test_a_transaction_that_ended_without_the_partition_hangs():
    # The producer committed (or its transaction was aborted) without ever adding T: no marker will come.
    for state in ("CompleteCommit", "CompleteAbort"):
        scan = HangingScan([T], RULE)
        assert ask_coordinator(scan, at(71), {T: [open_on()]}, coordinator(state)) == AskProducersAgain((T,))
        assert only(scan.producers_answered_again({T: [open_on()]})).coordinator_state == state


def test_a_later_transaction_of_the_producer_that_does_not_list_the_partition_means_it_hangs():
    # 0 s: the write on T (never added). 75 s: the producer's next transaction, on U only.
    scan = HangingScan([T], RULE)
    step = ask_coordinator(scan, at(80), {T: [open_on()]}, coordinator("Ongoing", frozenset({U})))
    assert step == AskProducersAgain((T,))
    assert only(scan.producers_answered_again({T: [open_on()]})).reason == NOT_IN_TRANSACTION


def test_each_transaction_is_judged_by_its_own_timeout():
    # Two producers, neither listed by its coordinator, seen at 100 s: 7 has a 60 s timeout, 8 a 300 s one.
    leader = {T: [open_on(7)], U: [open_on(8, start=9)]}
    found = find_hanging(leader, at(100), RULE, [("app", 7), ("slow", 8)],
                         {"app": coordinator("Empty"), "slow": TransactionView("slow", "Empty", 8, 0, frozenset(),
                                                                               300 * S, -1)})
    assert [(f.partition, f.producer_id) for f in found] == [(0, 7)]
    assert find_hanging(leader, at(311), RULE, [("app", 7), ("slow", 8)],
                        {"app": coordinator("Empty"), "slow": TransactionView("slow", "Empty", 8, 0, frozenset(),
                                                                              300 * S, -1)}) != ()


# -- never a false positive --------------------------------------------------------------------------------------


def test_an_idle_open_transaction_its_coordinator_lists_is_never_reported():
    # Timeout 120 s; the producer wrote to T (added) and has been idle since: at 60 s, and at any age after,
    # while the coordinator lists T its marker is still to come.
    for seconds in (60, 119, 200, 3600):
        step = ask_coordinator(HangingScan([T], RULE), at(seconds), {T: [open_on()]},
                               coordinator("Ongoing", frozenset({T}), timeout_s=120))
        assert step == Done(()), seconds


def test_a_transaction_in_prepare_commit_or_abort_whose_marker_is_still_to_be_written_is_not_reported():
    # EndTxn arrived; the coordinator is writing markers and T's is not written yet (its leader is slow):
    # T stays in the description's partitions until its marker is written, however long that takes.
    for state in ("PrepareCommit", "PrepareAbort", "PrepareEpochFence"):
        for seconds in (71, 600):
            step = ask_coordinator(HangingScan([T], RULE), at(seconds), {T: [open_on()]},
                                   coordinator(state, frozenset({T, U})))
            assert step == Done(()), (state, seconds)


def test_a_marker_written_between_the_leaders_answer_and_the_coordinators_is_not_reported():
    # 80 s: leader -> scan: T open (its marker not written yet).
    # 80 s + a moment: the coordinator writes T's marker and drops T from its PrepareCommit list.
    # coordinator -> scan: PrepareCommit, U still pending, T not listed: it reads like a hanging T...
    scan = HangingScan([T], RULE)
    step = ask_coordinator(scan, at(80), {T: [open_on()]}, coordinator("PrepareCommit", frozenset({U})))
    assert step == AskProducersAgain((T,))
    # ...but the leader, asked again, shows the transaction closed: nothing is reported.
    assert scan.producers_answered_again({T: [closed()]}) == Done(())


def test_the_second_look_needs_the_same_producer_and_start_offset():
    # The producer's transaction at 42 ended meanwhile, and a new one of it started on T at 57.
    scan = HangingScan([T], RULE)
    ask_coordinator(scan, at(80), {T: [open_on()]}, coordinator("CompleteCommit"))
    assert scan.producers_answered_again({T: [open_on(start=57), open_on(pid=9)]}) == Done(())
    # A partition that fails to answer the second time is not reported this time (the next scan asks again).
    scan = HangingScan([T], RULE)
    ask_coordinator(scan, at(80), {T: [open_on()]}, coordinator("CompleteCommit"))
    assert scan.producers_answered_again({}) == Done(())


def test_open_transactions_younger_than_the_margin_are_not_even_asked_about():
    scan = HangingScan([T, U], RULE)
    scan.start()
    assert scan.producers_answered({T: [open_on(last=at(-10))], U: [open_on(8, last=at(-5))]}, at(0)) == Done(())
    assert scan.oldest_open_age_ms == 10 * S and len(scan.open_transactions) == 2


# -- when the coordinator cannot say: the unknown threshold (find-hanging's 15 minutes by default) -------------


def test_without_a_description_the_unknown_threshold_applies():
    for listed, described, reason in ((False, None, NO_TRANSACTIONAL_ID), (True, None, TRANSACTIONAL_ID_NOT_FOUND)):
        assert ask_coordinator(HangingScan([T], RULE), at(600), {T: [open_on()]}, described, listed) == Done(())
        scan = HangingScan([T], RULE)
        assert ask_coordinator(scan, at(15 * 60 + 1), {T: [open_on()]}, described, listed) == AskProducersAgain((T,))
        f = only(scan.producers_answered_again({T: [open_on()]}))
        assert (f.reason, f.threshold_ms, f.transaction_timeout_ms) == (reason, 15 * 60 * S, None)


def test_a_description_without_a_timeout_uses_the_unknown_threshold():
    no_timeout = TransactionView("app", "Empty", 7, 0, frozenset(), -1, -1)
    assert ask_coordinator(HangingScan([T], RULE), at(600), {T: [open_on()]}, no_timeout) == Done(())


def test_brokers_without_list_transactions_report_only_past_the_unknown_threshold_unconfirmed():
    scan = HangingScan([T, U], RULE)
    scan.start()
    scan.producers_answered({T: [open_on(last=at(-100))], U: [open_on(8, last=at(-16 * 60))]}, at(0))
    (f,) = scan.transactional_ids_unavailable().findings
    assert (f.partition, f.reason, f.threshold_ms) == (1, UNCONFIRMED, 15 * 60 * S)

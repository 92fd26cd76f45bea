"""Hanging-transaction judgement under find-hanging's rule (`MaxTimeout`), as sequences of what the brokers
answered (the own-timeout rule: test_hanging_own_timeout.py).

Each test walks a scan step by step: the partitions asked, the DescribeProducers answers, the
ListTransactions listings, the DescribeTransactions descriptions, then the findings. The cases
follow Kafka's own TransactionsCommandTest (testFindHanging*), plus the edges of the threshold.
"""

from txnguard.verification.hanging import (
    NO_TRANSACTIONAL_ID,
    NOT_IN_TRANSACTION,
    TRANSACTIONAL_ID_NOT_FOUND,
    AbortSpec,
    AskDescriptions,
    AskProducers,
    AskTransactionalIds,
    Done,
    Finding,
    FindingTracker,
    HangingScan,
    MaxTimeout,
    ProducerState,
    TransactionView,
    abort_spec,
    find_hanging,
    table,
)

MIN = 60_000
NOW = 1_700_000_000_000
T0, T1 = ("orders", 0), ("orders", 1)
TIMEOUT = 15 * MIN


def open_txn(pid: int, age_ms: int, start: int = 5, epoch: int = 0, coordinator_epoch: int = -1) -> ProducerState:
    return ProducerState(pid, epoch, NOW - age_ms, coordinator_epoch, start)


def test_an_old_open_transaction_with_no_transactional_id_hangs():
    # testFindHangingNoMappedTransactionalId
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    assert scan.start() == AskProducers((T0,))
    step = scan.producers_answered({T0: [open_txn(7, 20 * MIN, start=42)]}, NOW)
    assert step == AskTransactionalIds(frozenset({7}))
    step = scan.transactional_ids_answered([])
    assert isinstance(step, Done)
    (f,) = step.findings
    assert (f.topic, f.partition, f.producer_id, f.start_offset, f.reason) == ("orders", 0, 7, 42, NO_TRANSACTIONAL_ID)
    assert f.transactional_id is None and f.coordinator_epoch == -1
    assert f.duration_min(NOW) == 20


def test_a_transactional_id_the_coordinator_no_longer_knows_hangs():
    # testFindHangingWithNoTransactionDescription: DescribeTransactions answers TRANSACTIONAL_ID_NOT_FOUND
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    scan.start()
    scan.producers_answered({T0: [open_txn(7, 20 * MIN)]}, NOW)
    assert scan.transactional_ids_answered([("app", 7)]) == AskDescriptions(frozenset({"app"}))
    (f,) = scan.descriptions_answered({"app": None}).findings
    assert (f.reason, f.transactional_id) == (TRANSACTIONAL_ID_NOT_FOUND, "app")


def test_a_transaction_that_does_not_list_the_partition_hangs():
    # testFindHangingDoesNotFilterByTransactionInProgressWithDifferentPartitions
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    scan.start()
    scan.producers_answered({T0: [open_txn(7, 20 * MIN)]}, NOW)
    scan.transactional_ids_answered([("app", 7)])
    view = TransactionView("app", "Ongoing", 7, 0, frozenset({T1}))
    (f,) = scan.descriptions_answered({"app": view}).findings
    assert (f.reason, f.coordinator_state) == (NOT_IN_TRANSACTION, "Ongoing")


def test_a_transaction_that_lists_the_partition_does_not_hang():
    # testFindHangingFilterByTransactionInProgressWithSamePartition: the coordinator will write its marker
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    scan.start()
    scan.producers_answered({T0: [open_txn(7, 20 * MIN)]}, NOW)
    scan.transactional_ids_answered([("app", 7)])
    for state in ("Ongoing", "PrepareCommit", "PrepareAbort"):
        view = TransactionView("app", state, 7, 0, frozenset({T0}))
        assert scan.descriptions_answered({"app": view}) == Done(())


def test_the_description_is_not_compared_by_producer_id_or_epoch():
    # The tool checks only the partitions: a description of another producer id listing T0 clears it.
    found = find_hanging({T0: [open_txn(7, 20 * MIN)]}, NOW, MaxTimeout(TIMEOUT), [("app", 7)],
                         {"app": TransactionView("app", "Ongoing", 8, 3, frozenset({T0}))})
    assert found == ()


def test_only_open_transactions_older_than_the_timeout_are_candidates():
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    scan.start()
    step = scan.producers_answered({T0: [
        ProducerState(1, 0, NOW - 60 * MIN, -1, -1),   # no open transaction
        open_txn(2, TIMEOUT),                          # exactly the timeout: not more than it
        open_txn(3, 5 * MIN),                          # young
        open_txn(4, TIMEOUT + 1),                      # 1 ms over
    ]}, NOW)
    assert step == AskTransactionalIds(frozenset({4}))
    assert scan.oldest_open_age_ms == TIMEOUT + 1
    assert {o.producer.producer_id for o in scan.open_transactions} == {2, 3, 4}


def test_no_candidates_ends_the_scan_without_asking_the_coordinators():
    scan = HangingScan([T0, T1], MaxTimeout(TIMEOUT))
    scan.start()
    assert scan.producers_answered({T0: [open_txn(3, MIN)], T1: []}, NOW) == Done(())
    assert scan.oldest_open_age_ms == MIN
    assert scan.described_partitions == 2


def test_a_zero_timeout_makes_every_open_transaction_a_candidate():
    # The tool accepts --max-transaction-timeout 0 (tests use it to find everything open).
    assert len(find_hanging({T0: [open_txn(3, 1)]}, NOW, MaxTimeout(0), [], {})) == 1


def test_partitions_are_described_in_batches_of_500():
    parts = [("t", i) for i in range(1201)]
    scan = HangingScan(parts)
    sizes = []
    step = scan.start()
    while isinstance(step, AskProducers):
        sizes.append(len(step.partitions))
        step = scan.producers_answered({tp: [] for tp in step.partitions}, NOW)
    assert sizes == [500, 500, 201] and step == Done(())


def test_listings_of_producer_ids_not_asked_are_ignored():
    scan = HangingScan([T0], MaxTimeout(TIMEOUT))
    scan.start()
    scan.producers_answered({T0: [open_txn(7, 20 * MIN)]}, NOW)
    step = scan.transactional_ids_answered([("other", 9)])
    assert isinstance(step, Done) and step.findings[0].reason == NO_TRANSACTIONAL_ID


def test_one_producer_on_several_partitions_is_judged_per_partition():
    found = find_hanging({T0: [open_txn(7, 20 * MIN, start=1)], T1: [open_txn(7, 20 * MIN, start=2)]}, NOW,
                         MaxTimeout(TIMEOUT), [("app", 7)],
                         {"app": TransactionView("app", "Ongoing", 7, 0, frozenset({T1}))})
    assert [(f.partition, f.start_offset) for f in found] == [(0, 1)]


def test_a_partition_that_failed_to_answer_is_left_out():
    scan = HangingScan([T0, T1], MaxTimeout(TIMEOUT))
    scan.start()
    assert scan.producers_answered({T1: []}, NOW) == Done(())
    assert scan.described_partitions == 1


def test_the_table_is_the_tools():
    f = Finding("orders", 0, 7, 0, -1, 42, NOW - 20 * MIN - 5, NO_TRANSACTIONAL_ID)
    lines = table([f], NOW).splitlines()
    assert lines[0].split() == ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                                "StartOffset", "LastTimestamp", "Duration(min)"]
    assert lines[1].split() == ["orders", "0", "7", "0", "-1", "42", str(NOW - 20 * MIN - 5), "20"]
    # Every cell padded to its column's width, each followed by a tab (prettyPrintTable).
    assert lines[0] == "Topic \tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\t" \
                       "LastTimestamp\tDuration(min)\t"
    assert lines[1].split("\t")[:3] == ["orders", "0        ", "7         "]
    assert table([], NOW).count("\n") == 1


def test_the_tracker_reports_each_finding_once_and_its_end():
    a = Finding("orders", 0, 7, 0, -1, 42, NOW, NO_TRANSACTIONAL_ID)
    b = Finding("orders", 1, 8, 0, -1, 3, NOW, NO_TRANSACTIONAL_ID)
    t = FindingTracker()
    assert t.update([a]) == ([a], [])
    assert t.update([a, b]) == ([b], [])
    assert t.per_partition() == {T0: 1, T1: 1}
    assert t.update([b]) == ([], [a])
    assert t.update([]) == ([], [b])
    assert t.per_partition() == {}


def test_abort_spec_is_the_producer_whose_transaction_starts_at_the_offset():
    producers = [ProducerState(1, 0, NOW, 4, -1), ProducerState(7, 2, NOW, -1, 42), ProducerState(8, 1, NOW, 3, 50)]
    # A coordinator epoch of -1 (none yet) is sent as 0, as the admin client does.
    assert abort_spec("orders", 0, producers, 42) == AbortSpec("orders", 0, 7, 2, 0)
    assert abort_spec("orders", 0, producers, 50) == AbortSpec("orders", 0, 8, 1, 3)
    assert abort_spec("orders", 0, producers, 43) is None

"""The coordinator's log, as the follower reads it: records in, each id's latest state out, and what the log
may decide about a write (the coordinator's own rules, only a pass before the follower caught up).

The bytes are written by the harness's own encoder (txnguard.testing.transaction_log_writer, from Kafka's schemas); real
brokers' logs (2.8.2, 3.5.2, 4.4.0) are read in tests/integration/test_log_follower.py.
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnguard.codecs.errors import DecodeFailed
from txnguard.codecs.transaction_log import LogRecord, TxnLogValue, UnknownVersion, transaction, transactional_id
from txnguard.testing.transaction_log_writer import key, value
from txnguard.testing.transaction_log_writer import uvarint as _uvarint
from txnguard.verification.transaction_log_view import Applied, LogViewLimits, TransactionLogView
from txnguard.verification.verdicts import Evidence, Outcome

P0, P1 = ("orders", 0), ("orders", 1)


def state(state: str, *partitions: tuple[str, int], epoch: int = 0, pid: int = 7) -> TxnLogValue:
    return TxnLogValue(pid, epoch, 60_000, state, frozenset(partitions), 1000, 900 if partitions else -1)


def fed(*changes: tuple[str, TxnLogValue | None], partition: int = 3) -> TransactionLogView:
    view = TransactionLogView()
    for offset, (txn_id, v) in enumerate(changes):
        view.apply(partition, LogRecord(offset, key(txn_id), None if v is None else value(v)))
    return view


# -- the record formats ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 1])
def test_a_value_of_either_version_reads_back_as_written(version: int) -> None:
    v = state("Ongoing", P0, P1, ("payments", 5))
    assert transaction(value(v, version)) == v
    assert transactional_id(key("app-1")) == "app-1"


def test_tagged_fields_of_a_flexible_value_are_skipped() -> None:
    # 4.x writes PreviousProducerId (tag 0), NextProducerId (1), ClientTransactionVersion (2), NextProducerEpoch (3).
    tags = _uvarint(2) + _uvarint(0) + _uvarint(8) + struct.pack(">q", 41) + _uvarint(2) + _uvarint(2) + b"\x00\x02"
    v = state("CompleteCommit")
    assert transaction(value(v, 1, tags)) == v


@pytest.mark.parametrize("bad, error", [
    (struct.pack(">h", 2) + b"\x00" * 40, UnknownVersion),      # a value version from the future
    (value(state("Ongoing", P0))[:-3], DecodeFailed),            # cut short
    (b"\x00", DecodeFailed),
])
def test_a_value_it_cannot_read_is_an_error_never_a_guess(bad: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        transaction(bad)


def test_an_unknown_status_is_an_unknown_version() -> None:
    raw = bytearray(value(state("Ongoing", P0)))
    raw[16] = 42  # the status byte: version 2, producer id 8, epoch 2, timeout 4
    with pytest.raises(UnknownVersion):
        transaction(bytes(raw))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.booleans())
def test_any_bytes_read_or_raise_a_codec_error(data: bytes, as_key: bool) -> None:
    with contextlib.suppress(DecodeFailed):  # UnknownVersion is one; anything else escapes and fails
        transactional_id(data) if as_key else transaction(data)


# -- the view: latest state per id ---------------------------------------------------------------------------------

def test_each_id_keeps_its_latest_state_and_a_tombstone_removes_it() -> None:
    view = fed(("app", state("Empty")), ("app", state("Ongoing", P0)), ("other", state("Empty")), ("other", None))
    assert view.describe("app").state == "Ongoing"  # type: ignore[union-attr]
    assert view.describe("other") is None
    assert view.positions == {3: 4}
    assert view.counts[Applied.STATE] == 3 and view.counts[Applied.TOMBSTONE] == 1


def test_a_record_it_cannot_read_drops_the_ids_older_state() -> None:
    view = fed(("app", state("Ongoing", P0)))
    view.apply(3, LogRecord(1, key("app"), struct.pack(">h", 9) + b"\x00" * 40))
    assert view.describe("app") is None and view.counts[Applied.UNKNOWN] == 1
    assert view.verdict("app", 7, 0, P0, caught_up=True) is None  # the next source decides


def test_the_view_is_bounded_least_recently_changed_first() -> None:
    view = TransactionLogView(LogViewLimits(max_entries=2))
    for i, txn_id in enumerate(["a", "b", "a", "c"]):
        view.apply(0, LogRecord(i, key(txn_id), value(state("Empty"))))
    assert view.get("b") is None and view.get("a") is not None and view.get("c") is not None
    assert view.evicted == 1


# -- what the log may decide ---------------------------------------------------------------------------------------

def test_an_ongoing_transaction_with_the_partition_passes_at_once() -> None:
    """    coordinator log: app Ongoing {orders-0} (pid 7, epoch 0)
           Produce orders-0 (7, 0) ─▶ passes on the log, even before the follower caught up"""
    view = fed(("app", state("Ongoing", P0)))
    v = view.verdict("app", 7, 0, P0, caught_up=False)
    assert v is not None and v.passed and v.evidence is Evidence.LOG


@pytest.mark.parametrize("logged, write, outcome", [
    (state("CompleteCommit"), (7, 0, P0), Outcome.LATE_WRITE),        # the EndTxn's marker is decided: late
    (state("Ongoing", P1), (7, 0, P0), Outcome.NOT_IN_TRANSACTION),    # never added
    (state("Ongoing", P0, epoch=1), (7, 0, P0), Outcome.FENCED),       # an older epoch
    (state("Ongoing", P0), (8, 0, P0), Outcome.PRODUCER_ID_MAPPING),   # another producer id
    (state("PrepareCommit", P0), (7, 0, P0), Outcome.COORDINATOR_RETRIABLE),  # ending: retriable, as the broker
])
def test_anything_but_a_pass_stands_only_once_the_follower_caught_up(
    logged: TxnLogValue, write: tuple[int, int, tuple[str, int]], outcome: Outcome,
) -> None:
    view = fed(("app", logged))
    assert view.verdict("app", *write, caught_up=False) is None  # a newer record may be on its way
    v = view.verdict("app", *write, caught_up=True)
    assert v is not None and v.outcome is outcome and v.evidence is Evidence.LOG, v


def test_an_id_the_log_does_not_hold_is_never_refused_here() -> None:
    assert fed().verdict("app", 7, 0, P0, caught_up=True) is None


def test_the_ids_partition_is_the_coordinators() -> None:
    view = TransactionLogView()
    assert view.partition_of("app") is None  # not known before the follower learned the partition count
    view.partition_count = 10
    # TransactionStateManager.partitionFor: Utils.abs(id.hashCode) % partitions; a 2.8.2 broker with 10 partitions
    # logged "explore-1" in partition 7 and its own probe "txnguard-harness-probe" in 9
    assert (view.partition_of("explore-1"), view.partition_of("txnguard-harness-probe")) == (7, 9)

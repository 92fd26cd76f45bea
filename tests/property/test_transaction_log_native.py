"""The follower's native record-set decoder (native/src/transaction_log.rs, log_records.rs: `read_decoded`) against the
Python reader it stands beside (codecs/transaction_log.py's `python_decoded`: the fallback without the module): the
same decoded records and the same failure from the same record sets, generated the way the coordinator writes them
(value v0 and v1, several batches, control batches) and mutated."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnguard.codecs import native, transaction_log
from txnguard.codecs.errors import DecodeFailed
from txnguard.codecs.log_fetch import read_log_answer
from txnguard.codecs.transaction_log import (
    LogRecord,
    TxnLogValue,
    UnknownVersion,
    latest,
    python_decoded,
    read_decoded,
    records,
)
from txnguard.testing.fetch_answers import fetch_answer
from txnguard.testing.raw import build_batch
from txnguard.testing.transaction_log_writer import STATUS, key, value
from txnguard.verification.transaction_log_view import Applied, TransactionLogView

# No skip without the native module: it is part of the build (as test_native_data_path.py says).

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_values = st.builds(
    TxnLogValue, st.integers(-1, 2 ** 63 - 1), st.integers(-1, 2 ** 15 - 1), st.integers(0, 2 ** 31 - 1),
    st.sampled_from(sorted(STATUS)),
    st.frozensets(st.tuples(st.sampled_from(["orders", "payments", "ü-topic", ""]), st.integers(0, 2 ** 31 - 1)),
                  max_size=5),
    st.integers(-1, 2 ** 62), st.integers(-1, 2 ** 62))
_records = st.tuples(st.text(max_size=12), st.none() | st.tuples(_values, st.sampled_from([0, 1])))


def _batch(entries: list[tuple[str, tuple[TxnLogValue, int] | None]]) -> bytes:
    return bytes(build_batch([None if v is None else value(v[0], version=v[1]) for _, v in entries],
                             keys=[key(txn_id) for txn_id, _ in entries]))


def _same(data: bytes) -> list[transaction_log.Decoded]:
    """Both readers' records and failure (its kind: the messages differ) on `data`; the records."""
    found, failure = read_decoded(data)
    expected, expected_failure = python_decoded(data)
    assert found == expected
    assert type(failure) is type(expected_failure)
    # Where the set lies in a longer buffer (a view into the Fetch answer), the same.
    found_in, failure_in = read_decoded(memoryview(b"\xff" + data + b"\xff")[1:-1])
    assert (found_in, type(failure_in)) == (found, type(failure))
    # Reduced to what the view applies, from each position on, in the answer the follower reads: the native
    # reduction (read_log_answer) is the Python one's (`latest`).
    frame = fetch_answer(1, [SimpleNamespace(partition_index=3, error_code=0, high_watermark=0, log_start_offset=0,
                                             records=data)])
    for position in {0, 1, *(r[0] for r in expected), *(r[0] + 1 for r in expected)}:
        [part] = read_log_answer(memoryview(frame), {3: position}).partitions
        assert part.read == latest(expected, position)
        assert type(part.failure) is type(expected_failure)
    return found


@SETTINGS
@given(entries=st.lists(_records, min_size=1, max_size=6))
def test_records_decode_as_the_python_reader_decodes_them(entries):
    data = _batch(entries)
    found = _same(data)
    assert [r[1] for r in found] == [transaction_log.TOMBSTONE if v is None else transaction_log.STATE
                                     for _, v in entries]
    assert [(txn_id, v) for _, _, txn_id, v in found] == [(t, None if v is None else v[0]) for t, v in entries]
    assert read_decoded(data)[1] is None


@SETTINGS
@given(sets=st.lists(st.lists(_records, min_size=1, max_size=3), min_size=1, max_size=3), control=st.booleans(),
       cut=st.integers(0, 60))
def test_several_batches_a_control_one_and_a_cut_end_read_as_the_python_reader_reads_them(sets, control, cut):
    batches = [_batch(entries) for entries in sets]
    if control:
        marker = bytearray(bytes(build_batch([b"\x00\x00\x00\x00\x00\x00"], keys=[b"\x00\x00\x00\x00"],
                                             transactional=True)))
        marker[21:23] = (0x30).to_bytes(2, "big")  # transactional and control (the CRC no longer matches: skipped)
        batches.insert(1, bytes(marker))
    data = b"".join(batches)
    data = data[:len(data) - cut]  # Fetch cuts at its byte limit: a partial batch ends the set
    _same(data)


@SETTINGS
@given(entries=st.lists(_records, min_size=1, max_size=3), data=st.data())
def test_a_mutated_record_decodes_as_the_python_reader_decodes_it(entries, data):
    # Keys and values broken inside a batch whose frame is intact: each record's outcome (state, tombstone,
    # unknown, malformed) and fields are the Python reader's.
    raw = []
    for txn_id, v in entries:
        k, val = bytearray(key(txn_id)), None if v is None else bytearray(value(v[0], version=v[1]))
        for field in (k, val):
            if field and data.draw(st.booleans()):
                field[data.draw(st.integers(0, len(field) - 1))] = data.draw(st.integers(0, 255))
        if val is not None and data.draw(st.booleans()):
            val = val[:data.draw(st.integers(0, len(val)))]
        raw.append((bytes(k), None if val is None else bytes(val)))
    batch = bytes(build_batch([v for _, v in raw], keys=[k for k, _ in raw]))
    _same(batch)


@SETTINGS
@given(entries=st.lists(_records, min_size=1, max_size=3), data=st.data())
def test_a_broken_batch_is_refused_or_read_as_the_python_reader_reads_it(entries, data):
    batch = bytearray(_batch(entries))
    for _ in range(data.draw(st.integers(1, 3))):
        batch[data.draw(st.integers(0, len(batch) - 1))] = data.draw(st.integers(0, 255))
    mutated = bytes(batch[:data.draw(st.integers(0, len(batch)))])
    _same(mutated)


def test_a_batch_shorter_than_its_header_or_of_another_magic_stops_the_set_after_the_records_before_it():
    good = _batch([("a", None)])
    short = (0).to_bytes(8, "big") + (20).to_bytes(4, "big") + bytes(20)
    found, failure = read_decoded(good + short)
    assert [r[2] for r in found] == ["a"] and type(failure) is DecodeFailed
    other_magic = bytearray(good)
    other_magic[16] = 1
    found, failure = read_decoded(good + bytes(other_magic))
    assert [r[2] for r in found] == ["a"] and type(failure) is UnknownVersion
    assert python_decoded(good + bytes(other_magic))[0] == found


def test_the_decoders_index_of_each_outcome_is_the_views():
    indexes = (transaction_log.STATE, transaction_log.TOMBSTONE, transaction_log.UNKNOWN, transaction_log.MALFORMED)
    by_index = [list(Applied)[i] for i in indexes]
    assert by_index == [Applied.STATE, Applied.TOMBSTONE, Applied.UNKNOWN, Applied.MALFORMED]


def test_the_view_fed_native_records_is_the_view_fed_python_ones():
    assert native.AVAILABLE
    state = TxnLogValue(7, 0, 60_000, "Ongoing", frozenset({("orders", 1)}), 5, 4)
    bad_status = bytearray(value(state))
    bad_status[16] = 9  # the status byte: unknown
    batch = bytes(build_batch([value(state), None, bytes(bad_status), b"\x00"],
                              keys=[key("a"), key("b"), key("c"), key("d")]))
    by_native, by_python = TransactionLogView(), TransactionLogView()
    by_python.apply(0, LogRecord(0, key("c"), value(state)))
    by_native.apply(0, LogRecord(0, key("c"), value(state)))
    found, failure = read_decoded(batch)
    assert failure is None
    for r in found:
        by_native.apply_decoded(0, r)
    for r in records(batch):
        by_python.apply(0, r)
    assert list(by_native.items()) == list(by_python.items())
    assert [txn_id for txn_id, _ in by_native.items()] == ["a"]  # c's unknown status removed its older state
    assert by_native.counts == by_python.counts
    assert by_native.counts[Applied.UNKNOWN] == 1 and by_native.counts[Applied.MALFORMED] == 1

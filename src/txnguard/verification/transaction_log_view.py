"""What the coordinator's own log says of each transactional id, as this proxy's follower read it. Pure.

The follower (proxy/log_follower.py) feeds every record of `__transaction_state` in; this view keeps
each transactional id's latest state (a tombstone removes it), where it read up to in each partition,
and answers one question: what would the coordinator's own verification say of this write, as of the
records read? The answer goes through the same rules as a DescribeTransactions answer
(judge.judge_description), with the evidence `log`.

The race, and the rule that bounds it (docs/concepts/verification.md, "The coordinator's log"):

* a write the log lets pass (Ongoing, this producer and epoch, the partition added) passes at once. The
  record that ends the transaction may be appended and not read yet: the window is the follower's lag,
  beside the check-to-append window every other source has;
* anything else (not there yet, another state, another epoch) is decided only once the follower has
  read up to the log end offset as of the write's arrival (`caught_up`): a refusal rests on the records
  that were there when the write came, never on a record not yet read; until then nothing is decided
  (the shell waits, bounded, then asks the next source);
* an id whose latest record could not be read (a version this reader does not know) has no entry
  until a record it can read: never a guess from an older state;
* an id the log does not hold is not a refusal (the view is bounded, and the follower may have started
  late): the next source decides.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.groups import coordinator_partition_for
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.codecs.transaction_log import Decoded, LogRecord, PartitionRead, TxnLogValue, decode
from txnguard.verification.judge import judge_description
from txnguard.verification.verdicts import Evidence, Verdict


class Applied(enum.Enum):
    """What one record did to the view (a metric label)."""

    STATE = "state"            # an id's new latest state
    TOMBSTONE = "tombstone"    # an id removed (expired by the coordinator)
    UNKNOWN = "unknown_version"  # a version or status this reader does not know: the id's entry dropped
    MALFORMED = "malformed"    # bytes that do not decode: likewise

    __hash__ = object.__hash__  # identity, as equality is: Enum's own is a Python call, and these key `counts`


# By codecs/transaction_log.py's index of each (STATE, TOMBSTONE, UNKNOWN, MALFORMED).
APPLIED_BY_KIND = _STATE, _TOMBSTONE, _UNKNOWN, _MALFORMED = (Applied.STATE, Applied.TOMBSTONE, Applied.UNKNOWN,
                                                             Applied.MALFORMED)


class Logged(NamedTuple):
    value: TxnLogValue
    partition: int
    offset: int


# A NamedTuple built without its generated __new__ (a Python call, once per record the follower applies).
_new_logged = tuple.__new__


@dataclass(frozen=True)
class LogViewLimits:
    # Transactional ids kept at most (the least recently changed go first). A cluster's live ids are
    # bounded by transactional.id.expiration.ms (7 days by default); this bounds the proxy's memory.
    max_entries: int = 1_000_000


class TransactionLogView:
    def __init__(self, limits: LogViewLimits | None = None) -> None:
        self.limits = limits or LogViewLimits()
        self._ids: OrderedDict[str, Logged] = OrderedDict()
        self.positions: dict[int, int] = {}  # partition -> the next offset to read
        self.partition_count: int | None = None  # __transaction_state's, once the follower learned it
        self.counts: dict[Applied, int] = dict.fromkeys(Applied, 0)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._ids)

    def items(self) -> Iterator[tuple[str, Logged]]:
        """Every id held and its latest state, the least recently changed first."""
        return iter(self._ids.items())

    def get(self, txn_id: str) -> Logged | None:
        return self._ids.get(txn_id)

    def partition_of(self, txn_id: str) -> int | None:
        return None if self.partition_count is None else coordinator_partition_for(txn_id, self.partition_count)

    def apply(self, partition: int, record: LogRecord) -> Applied:
        """One record, in offset order within its partition."""
        return self.apply_decoded(partition, decode(record))

    def apply_decoded(self, partition: int, record: Decoded) -> Applied:
        """One record decoded (codecs/transaction_log.py: `decode`, `decoded_records`), in offset order within its
        partition: a state replaces the id's; a tombstone removes it; a value that is unknown or does not decode
        removes it too (its latest state is not known: no older one stands in for it); a key that does not
        decode names no id."""
        offset, kind, txn_id, value = record
        self.positions[partition] = offset + 1
        applied = APPLIED_BY_KIND[kind]
        self.counts[applied] += 1
        if txn_id is not None:
            self._keep(txn_id, value, partition, offset)
        return applied

    def apply_read(self, partition: int, read: PartitionRead) -> None:
        """One partition's records of a read (codecs/transaction_log.py's `latest`: each id's last record, every
        record that could not be read), as `apply_decoded` applies each record: below the bound, the view then
        holds what applying every record one by one leaves (an id is kept by its last record), in the same order
        of change. At the bound it holds at least those ids (an id set and removed within one read pushes no other
        out on its way; the read's removals go first), each with its latest state; the eviction count may differ
        (tests/property/test_log_reads.py)."""
        if read.next_offset is None:
            return
        self.positions[partition] = read.next_offset
        counts = self.counts
        state, tombstone, unknown, malformed = read.counts
        counts[_STATE] += state
        if tombstone or unknown or malformed:
            counts[_TOMBSTONE] += tombstone
            counts[_UNKNOWN] += unknown
            counts[_MALFORMED] += malformed
        keep, kept = self._keep, read.kept
        # Removals first. Applied one by one, an id whose last record here removes it may have gone before later
        # states came (its earlier tombstone reduced away); kept until its last record, it would hold a place at
        # the bound and push out an id the one-by-one view keeps. Removals and sets of different ids commute, and
        # an id's last record is its only one kept but for records not read, which remove it too: below the bound
        # the view ends the same.
        for offset, _, txn_id, value in kept:
            if txn_id is not None and value is None:
                keep(txn_id, value, partition, offset)
        for offset, _, txn_id, value in kept:
            if txn_id is not None and value is not None:
                keep(txn_id, value, partition, offset)

    def _keep(self, txn_id: str, value: TxnLogValue | None, partition: int, offset: int) -> None:
        """The id's latest record: its state (None: removed, a tombstone or a value not read)."""
        ids = self._ids
        if value is None:
            ids.pop(txn_id, None)
            return
        ids[txn_id] = _new_logged(Logged, (value, partition, offset))
        ids.move_to_end(txn_id)
        while len(ids) > self.limits.max_entries:
            ids.popitem(last=False)
            self.evicted += 1

    def describe(self, txn_id: str) -> DescribedTransaction | None:
        """The log's latest state of the id, as DescribeTransactions would give it; None when not held."""
        logged = self._ids.get(txn_id)
        if logged is None:
            return None
        v = logged.value
        return DescribedTransaction(0, txn_id, v.state, v.timeout_ms, v.start_ms, v.producer_id, v.producer_epoch,
                                    v.partitions)

    def verdict(self, txn_id: str, producer_id: int, epoch: int, tp: TopicPartition, *,
                caught_up: bool) -> Verdict | None:
        """The coordinator's rules applied to the log's latest state of the id; None: not decided here yet.

        `caught_up`: the follower has read the id's partition up to its end as of the write's arrival. Only
        then does anything but a pass stand (see the module's rule)."""
        desc = self.describe(txn_id)
        if desc is None:
            return None
        v = judge_description(desc, producer_id, epoch, tp, Evidence.LOG)
        if v.passed or caught_up:
            return v
        return None

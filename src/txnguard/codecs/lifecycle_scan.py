"""The transaction life cycle read in place: what the registry learns from InitProducerId, AddPartitionsToTxn
(v0-3), AddOffsetsToTxn and EndTxn requests, from the answers it reads, and from TxnOffsetCommit (v0-4).

Every client transaction passes an AddPartitionsToTxn or AddOffsetsToTxn and an EndTxn, each a request and an answer
the proxy reads; decoding them with kio (after the bounds check kio needs) was most of the proxy's CPU per short
transaction. The native data path reads the few fields the rules use (native/src/lifecycle.rs), every length checked
against the bytes as it goes; whatever it cannot read plainly (a size past the end, a tagged field, trailing bytes,
a version it does not know) it leaves to kio (`from_kio_*`), which judges it: both give the same `TxnRequest` /
`TxnResponse` (the property tests hold them to each other). A `TxnRequest` is one type per API
(`InitProducerIdSeen`, `AddPartitionsSeen`, `AddOffsetsSeen`, `EndTxnSeen`), each with only the fields that request
has: the rules match on the type. They and `TxnResponse` are NamedTuples: one is built per life-cycle frame, and a
frozen dataclass's __init__ costs four times a tuple's (the fields set one by one). Without the native module every
frame goes to kio. kio still decodes a request the proxy must answer itself (synthesis.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, NamedTuple

from txnguard.codecs import native
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.header import RequestHead

INIT_PRODUCER_ID, END_TXN, TXN_OFFSET_COMMIT = ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT
ADD_PARTITIONS, ADD_OFFSETS = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN
CONCURRENT_TRANSACTIONS = 51
_KNOWN_ERRORS = native.KNOWN_ERRORS  # kio refuses an answer with any other


class InitProducerIdSeen(NamedTuple):
    """What the rules read of an InitProducerId (v0-2 carry no producer id and epoch: -1)."""

    transactional_id: str | None                       # None: an idempotent producer's
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int


class AddPartitionsSeen(NamedTuple):
    """What the rules read of an AddPartitionsToTxn (v0-3: one transaction, the client's shape)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]            # in request order


class AddOffsetsSeen(NamedTuple):
    """What the rules read of an AddOffsetsToTxn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


class EndTxnSeen(NamedTuple):
    """What the rules read of an EndTxn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool


TxnRequest = InitProducerIdSeen | AddPartitionsSeen | AddOffsetsSeen | EndTxnSeen


class TxnResponse(NamedTuple):
    """What the rules read of a life-cycle answer."""

    error_code: int = 0                                # all but AddPartitionsToTxn
    producer_id: int = -1                              # InitProducerId
    producer_epoch: int = -1
    accepted: frozenset[tuple[str, int]] = frozenset()  # AddPartitionsToTxn: the partitions without error
    # The whole request refused with CONCURRENT_TRANSACTIONS (AddPartitionsToTxn: every partition, at least one).
    all_concurrent: bool = False


def read_txn_request(body: bytes | memoryview, head: RequestHead, start: int = 0, stop: int | None = None,
                     ) -> TxnRequest | None:
    """A life-cycle request (`body[start:stop]`: the frame without its length prefix), or None for kio to read."""
    key = head.api_key
    found = _read_request(body, start, len(body) if stop is None else stop, key, head.api_version)
    if found is None:
        return None
    if key == END_TXN:
        return _new(EndTxnSeen, found)  # the reader's 4-tuple is the record's fields, in order
    if key == ADD_PARTITIONS:
        txn_id, pid, epoch, rest = found
        return _new(AddPartitionsSeen, (txn_id, pid, epoch, tuple(rest)))
    if key == ADD_OFFSETS:
        return _new(AddOffsetsSeen, found)
    return _new(InitProducerIdSeen, found)


# A NamedTuple built without its generated __new__ (a Python call): the fields in their order.
_new = tuple.__new__
_NONE_ACCEPTED: frozenset[tuple[str, int]] = frozenset()


def read_txn_response(body: bytes | memoryview, key: int, version: int, start: int = 0, stop: int | None = None,
                      ) -> TxnResponse | None:
    """A life-cycle answer (`body[start:stop]`: from its correlation id), or None for kio to read."""
    found = _read_response(body, start, len(body) if stop is None else stop, key, version)
    if found is None:
        return None
    error, pid, epoch, accepted, all_concurrent = found
    if key == ADD_PARTITIONS:
        return _new(TxnResponse, (0, -1, -1, frozenset(accepted), all_concurrent))
    if key == INIT_PRODUCER_ID:
        return _new(TxnResponse, (error, pid, epoch, _NONE_ACCEPTED, all_concurrent))
    return _ERROR_ANSWERS[error]  # an error code alone: built once (a frozen dataclass costs more than the read)


if native.AVAILABLE:  # the native observers (native/src/py_observe.rs) build these records as read_txn_request does
    native.observe_setup(InitProducerIdSeen, AddPartitionsSeen, AddOffsetsSeen, tuple.__new__)

_ERROR_ANSWERS = {code: TxnResponse(code, all_concurrent=code == CONCURRENT_TRANSACTIONS) for code in _KNOWN_ERRORS}


def _absent(*_: Any) -> None:
    return None  # no native module: kio reads every life-cycle frame


_read_request = native.read_txn_request if native.AVAILABLE else _absent
_read_response = native.read_txn_response if native.AVAILABLE else _absent
_read_txn_offset_commit = native.read_txn_offset_commit if native.AVAILABLE else _absent


def from_kio_request(key: int, req: Any) -> TxnRequest:
    """The same as `read_txn_request` gives, from kio's decoded request."""
    if key == INIT_PRODUCER_ID:
        return InitProducerIdSeen(None if req.transactional_id is None else str(req.transactional_id),
                                  int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1)),
                                  # exact milliseconds (total_seconds() * 1000 made 1001 ms 1000)
                                  req.transaction_timeout // datetime.timedelta(milliseconds=1))
    if key == ADD_PARTITIONS:
        return AddPartitionsSeen(str(req.v3_and_below_transactional_id), int(req.v3_and_below_producer_id),
                                 int(req.v3_and_below_producer_epoch),
                                 tuple((str(t.name), int(p)) for t in req.v3_and_below_topics for p in t.partitions))
    if key == ADD_OFFSETS:
        return AddOffsetsSeen(str(req.transactional_id), int(req.producer_id), int(req.producer_epoch),
                              str(req.group_id))
    if key == END_TXN:
        return EndTxnSeen(str(req.transactional_id), int(req.producer_id), int(req.producer_epoch),
                          bool(req.committed))
    raise ValueError(f"not a life-cycle request: API key {key}")


def from_kio_response(key: int, resp: Any) -> TxnResponse:
    """The same as `read_txn_response` gives, from kio's decoded answer."""
    if key == ADD_PARTITIONS:
        codes = [(str(t.name), int(p.partition_index), int(p.partition_error_code))
                 for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]
        return TxnResponse(accepted=frozenset((t, i) for t, i, code in codes if code == 0),
                           all_concurrent=bool(codes) and all(c == CONCURRENT_TRANSACTIONS for _, _, c in codes))
    error = int(resp.error_code)
    if key == INIT_PRODUCER_ID:
        return TxnResponse(error, int(resp.producer_id), int(resp.producer_epoch),
                           all_concurrent=error == CONCURRENT_TRANSACTIONS)
    return TxnResponse(error, all_concurrent=error == CONCURRENT_TRANSACTIONS)

# -- TxnOffsetCommit (v0-4: KIP-890 part 1) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnOffsetCommit:
    """What the rules read of a TxnOffsetCommit: whose, and for which group."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int


def read_txn_offset_commit(body: bytes | memoryview, head: RequestHead, start: int = 0, stop: int | None = None,
                           ) -> TxnOffsetCommit | None:
    """A TxnOffsetCommit read whole and in place (`body[start:stop]`: the frame without its length prefix; every
    size checked, as kio's decode after the bounds check would); None for kio to read (and judge) instead. kio
    decodes it only to answer it (a rejection)."""
    if head.api_key != TXN_OFFSET_COMMIT:
        return None
    found = _read_txn_offset_commit(body, start, len(body) if stop is None else stop, head.api_version)
    return None if found is None else TxnOffsetCommit(*found)

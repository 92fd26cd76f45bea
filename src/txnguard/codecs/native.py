"""The native data path (txnguard._native, built from native/ in Rust): whether this install has it.

The relay's fast path reads frames in place with it. Without it (an install built without cargo, a wheel for
another platform) nothing is read in place: the general path (kio) takes every frame, correct and slower, and
the proxy says so at start (a log line, `txnguard_native_data_path`, `/readyz`'s detail).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

# (transactional id, producer id, producer epoch, [(topic, partition)], acks): a plain transactional Produce
TransactionalWrite = tuple[str, int, int, list[tuple[str, int]], int]

MISSING: str | None
_native: ModuleType | None
try:
    from txnguard import _native
except ImportError as e:  # exercised by the test that hides the module
    _native, MISSING = None, f"txnguard._native cannot be imported: {e}"
else:
    MISSING = None

AVAILABLE = _native is not None
VERSION: str | None = getattr(_native, "__version__", None)


def _absent(data: bytes | bytearray | memoryview, start: int, stop: int, flexible: bool, /,
            ) -> TransactionalWrite | None:
    raise RuntimeError(MISSING)  # never called: the fast path is off without the native module


# The error codes kio knows (a contiguous range): the native readers decline an answer with any other, as kio
# refuses it.
# (Should a kio release leave a gap, no answer is read natively: an empty range, kio reads them all.)
KNOWN_ERRORS = frozenset(int(code) for code in ErrorCode)
_LOW, _HIGH = min(KNOWN_ERRORS), max(KNOWN_ERRORS)
if _native is not None:
    _native.set_known_errors(*((_LOW, _HIGH) if len(KNOWN_ERRORS) == _HIGH - _LOW + 1 else (0, -1)))

# `scan_transactional(data, start, stop, flexible)`: the Produce from its transactional id at `start` to the frame's
# end at `stop`, read in place in `data`; None when the general path must judge it (native/src/produce.rs).
scan_transactional = _native.scan_transactional if _native is not None else _absent


class _NeverRaised(BaseException):
    """Stands for PanicException where there is no native module (nothing can raise it then)."""


# What a Rust panic becomes in Python (a BaseException): the core catches it and closes only that connection.
PanicException: type[BaseException] = getattr(_native, "PanicException", _NeverRaised)

# The life-cycle readers (native/src/lifecycle.rs), each on `data[start:stop]`; None for kio to read. Only called
# where AVAILABLE (lifecycle_scan.py goes to kio without the module).
# read_txn_request(data, start, stop, key, version) -> (transactional id, producer id, epoch, X) | None
read_txn_request: Any = getattr(_native, "read_txn_request", None)
# read_txn_response(data, start, stop, key, version) -> (error, producer id, epoch, accepted, all concurrent) | None
read_txn_response: Any = getattr(_native, "read_txn_response", None)
# read_txn_offset_commit(data, start, stop, version) -> (transactional id, group id, producer id, epoch) | None
read_txn_offset_commit: Any = getattr(_native, "read_txn_offset_commit", None)
# endpoints_absent(data, start, stop, key, version) -> bool (native/src/endpoints.rs)
endpoints_absent: Any = getattr(_native, "endpoints_absent", None)
# The transaction log follower's readers and writer, only called where AVAILABLE (kio and Python without the module):
# read_log_answer(data, start, stop, positions) -> (error, session id, [(partition, error, high watermark, log start
# offset, (each id's last record and every unreadable one as read_log_records gives records, counts by kind, next
# offset | None, ended ids) | None, failure)]) | None: a Fetch v12 answer and its record sets in one call, reduced
# from each partition's position on (native/src/fetch.rs, transaction_log.rs; codecs/log_fetch.py's read_log_answer);
# read_log_records(data, start, stop) -> ([(offset, applied, transactional id | None, value fields | None)], failure):
# a record set of __transaction_state, each record decoded as the follower's view applies it, in one call
# (codecs/transaction_log.py's read_decoded);
# read_batch_records(data, start, stop) -> [(offset, key, value)] | None: one uncompressed v2 batch
# (native/src/log_records.rs; the Python reader's);
# fetch_request(correlation id, client id, topic, [(partition, leader epoch, offset, max bytes)], max wait, min bytes,
# max bytes, session id, session epoch) -> bytes: the follower's Fetch v12 frame (codecs/log_fetch.py's).
read_log_answer: Any = getattr(_native, "read_log_answer", None)
read_log_records: Any = getattr(_native, "read_log_records", None)
read_batch_records: Any = getattr(_native, "read_batch_records", None)
fetch_request: Any = getattr(_native, "fetch_request", None)

# The rules of a life-cycle frame on the relay's fast path in one call each, the native registry and EndTxn ledger
# asked directly (native/src/py_observe.rs; verification/decisions.py's `observe_request_in_place` and
# `observe_response_in_place` call them when both are the native ones, else run the same rules in Python):
# observe_request(data, start, stop, key, version, now_ms, connection_id, registry, ledger | None, hold, absorb)
#   -> (what the request is seen as, whether its bytes are kept to ask again) | None;
# observe_response(data, start, stop, key, version, request, now_ms, absorbable, registry, ledger | None) -> bool.
observe_request: Any = getattr(_native, "observe_request", None)
observe_setup: Any = getattr(_native, "observe_setup", None)
observe_response: Any = getattr(_native, "observe_response", None)


class _NoNativeState:
    """Stands for the native state's classes where there is no native module: nothing is an instance of it."""


# The native state's classes, to tell it from the Python fallbacks'.
RegistryCore: type = getattr(_native, "RegistryCore", _NoNativeState)
EndTxnLedgerCore: type = getattr(_native, "EndTxnLedgerCore", _NoNativeState)

# The relay's book and the traffic arrays (native/src/book.rs, traffic.rs; connection/relay.py and traffic.py use
# them where AVAILABLE): new_traffic(rtt bounds) -> Traffic; new_book(traffic) -> Book, whose
# push(correlation id, key, version, action, sent at[, evidence, evidence at, observed, request]) books a request
# the fast path forwarded, responses(conn, data, now) -> bytes booked passes the answers that need no reading,
# spill() -> every entry as a tuple, oldest first, taken out.
new_traffic: Any = getattr(_native, "Traffic", None)
new_book: Any = getattr(_native, "Book", None)

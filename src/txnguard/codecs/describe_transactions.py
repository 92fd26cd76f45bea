"""DescribeTransactions v0 responses, read by hand.

kio 0.6.5 types TransactionStartTimeMs as a timestamp and refuses the -1 a
coordinator sends for a transaction with no start (state Empty): exactly the
answer verification most needs to read. This reader keeps the raw integer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import DecodeFailed, TruncatedFrame
from txnguard.codecs.header import read_uvarint
from txnguard.codecs.schemas import check_response_body

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    error_code: int
    transactional_id: str
    state: str
    timeout_ms: int
    start_time_ms: int
    producer_id: int
    producer_epoch: int
    partitions: frozenset[tuple[str, int]]


class _Reader:
    def __init__(self, data: bytes | memoryview, pos: int) -> None:
        self.data, self.pos = data, pos

    def fixed(self, s: struct.Struct) -> int:
        (v,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(v)

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.data, self.pos)
        return value

    def string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            return ""
        s = bytes(self.data[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def read_describe_transactions_v0(body: bytes | memoryview) -> list[DescribedTransaction]:
    """Parse a response body (header already removed)."""
    check_response_body(body, ApiKey.DESCRIBE_TRANSACTIONS, 0)  # the same size rules as every decoded frame
    try:
        r = _Reader(body, 0)
        r.fixed(_I32)  # throttle time
        out = []
        for _ in range(r.uvarint() - 1):
            error_code = r.fixed(_I16)
            txn_id = r.string()
            state = r.string()
            timeout = r.fixed(_I32)
            start = r.fixed(_I64)
            pid = r.fixed(_I64)
            epoch = r.fixed(_I16)
            parts: set[tuple[str, int]] = set()
            for _ in range(r.uvarint() - 1):
                topic = r.string()
                for _ in range(r.uvarint() - 1):
                    parts.add((topic, r.fixed(_I32)))
                r.skip_tags()
            r.skip_tags()
            out.append(DescribedTransaction(error_code, txn_id, state, timeout, start, pid, epoch, frozenset(parts)))
        r.skip_tags()
    except (struct.error, IndexError, UnicodeDecodeError, TruncatedFrame) as e:
        raise DecodeFailed(f"DescribeTransactions response: {e!r}") from None
    return out

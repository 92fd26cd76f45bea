"""`__transaction_state` records written the way the coordinator writes them, for tests and benchmarks.

An encoder of the test harness's own, from Kafka's TransactionLogKey/TransactionLogValue schemas (value v0:
Kafka 2.8 and later; v1, flexible: what 4.x brokers write), kept apart from the reader it checks
(txnguard.codecs.transaction_log)."""

from __future__ import annotations

import struct

from txnguard.codecs.transaction_log import TxnLogValue

STATUS = {"Empty": 0, "Ongoing": 1, "PrepareCommit": 2, "PrepareAbort": 3, "CompleteCommit": 4, "CompleteAbort": 5,
          "Dead": 6, "PrepareEpochFence": 7}


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(txn_id: str) -> bytes:
    raw = txn_id.encode()
    return struct.pack(">hh", 0, len(raw)) + raw


def value(v: TxnLogValue, version: int = 0, tags: bytes = b"\x00") -> bytes:
    flexible = version >= 1
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(p)
    out = struct.pack(">hqhib", version, v.producer_id, v.producer_epoch, v.timeout_ms, STATUS[v.state])
    out += uvarint(len(by_topic) + 1) if flexible else struct.pack(">i", len(by_topic))
    for topic, ps in by_topic.items():
        raw = topic.encode()
        out += (uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw
        out += uvarint(len(ps) + 1) if flexible else struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
        out += b"\x00" if flexible else b""
    out += struct.pack(">qq", v.last_update_ms, v.start_ms)
    return out + (tags if flexible else b"")

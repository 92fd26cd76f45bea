"""What one client connection showed of itself: the client inventory's raw material (pure).

A session feeds it a few facts as requests pass (each Produce and transactional request, read
in place, never decoded) and the audit log turns it into a `connection` record when the
connection closes. The client id and KIP-511 software name and version the session keeps itself.
"""

from __future__ import annotations

import struct

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import RequestHead, read_uvarint, request_body_offset
from txnguard.codecs.schemas import request_header_version

PRODUCE, INIT_PRODUCER_ID, TXN_OFFSET_COMMIT = ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.TXN_OFFSET_COMMIT
ADD_PARTITIONS, ADD_OFFSETS, END_TXN = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN
# Requests whose body starts with the transactional id, up to the last version that does
# (AddPartitionsToTxn v4+ is the broker-to-coordinator batch: a list of transactions first).
_TXN_ID_FIRST: dict[int, int | None] = {INIT_PRODUCER_ID: None, ADD_PARTITIONS: 3, ADD_OFFSETS: None, END_TXN: None,
                 TXN_OFFSET_COMMIT: None}
_INT16 = struct.Struct(">h")


class ConnectionInventory:
    __slots__ = ("client_address", "connected_ms", "first_transactional_id", "produce_versions",
                 "txn_offset_commit_versions", "used_transactions")

    def __init__(self, client_address: str, connected_ms: int) -> None:
        self.client_address = client_address
        self.connected_ms = connected_ms
        self.first_transactional_id: str | None = None
        self.used_transactions = False
        self.produce_versions: set[int] = set()
        self.txn_offset_commit_versions: set[int] = set()

    def produce(self, head: RequestHead, body: bytes | memoryview, transactional: bool) -> None:
        """Every Produce; the session has already read whether it carries a transactional id."""
        self.produce_versions.add(head.api_version)
        if transactional:
            self.used_transactions = True
            if self.first_transactional_id is None:
                self.first_transactional_id = transactional_id(head, body)

    def transactional_write(self, version: int, txn_id: str) -> None:
        """A transactional Produce whose id the relay's fast path has read already, noted as `produce` notes one."""
        self.produce_versions.add(version)
        self.used_transactions = True
        if self.first_transactional_id is None:
            self.first_transactional_id = txn_id

    def request(self, head: RequestHead, body: bytes | memoryview, start: int = 0, stop: int | None = None) -> None:
        """Every request (`body[start:stop]`: the frame without its length prefix); only the transactional ones
        (not Produce) leave a trace."""
        key = head.api_key
        if key not in _TXN_ID_FIRST:
            return
        if key == TXN_OFFSET_COMMIT:
            self.txn_offset_commit_versions.add(head.api_version)
        if key != INIT_PRODUCER_ID:  # the others exist only in transactions; an idempotent producer
            self.used_transactions = True  # sends InitProducerId too, with a null transactional id
        if self.first_transactional_id is None:  # once per connection: the slice is taken only then
            found = transactional_id(head, body if start == 0 and stop is None else memoryview(body)[start:stop])
            if found is not None:
                self.first_transactional_id = found
                self.used_transactions = True


def transactional_id(head: RequestHead, body: bytes | memoryview) -> str | None:
    """The transactional id a request starts with, read in place; None if it has none or is unreadable.

    Never raises: a request the inventory cannot read is the broker's business, not a reason to
    close the client's connection.
    """
    key, version = head.api_key, head.api_version
    if key == PRODUCE:
        if version < 3:
            return None
    elif key not in _TXN_ID_FIRST:
        return None
    else:
        last = _TXN_ID_FIRST[key]
        if last is not None and version > last:
            return None
    try:
        pos = request_body_offset(body, head)
        if request_header_version(key, version) >= 2:  # flexible: compact string, uvarint length + 1
            length_plus_one, pos = read_uvarint(body, pos)
            n = length_plus_one - 1
        else:
            (n,) = _INT16.unpack_from(body, pos)
            pos += 2
        if n < 0 or pos + n > len(body):
            return None
        return bytes(body[pos:pos + n]).decode("utf-8")
    except (CodecError, struct.error, UnicodeDecodeError):
        return None

"""What the connection core asks the verification side, in one place: the rules decide, the core relays.

The core never reaches into the registry, the policy or the absorption settings: each question it has is
one method here, answered by `TransactionRules` (verification/decisions.py), which every connection of a
proxy shares. mypy holds the core to this list.
"""

from __future__ import annotations

from typing import Protocol

from txnguard.codecs.header import RequestHead
from txnguard.verification.audit import ClientInfo
from txnguard.verification.checks import Answer
from txnguard.verification.decisions import Clock, Decision, Observed, PendingCheck
from txnguard.verification.passed import Passed, PassedOffsets, Unchecked


class Rules(Protocol):
    # -- who the client is
    def family(self, software_name: str | None, client_id: str | None, listener: str | None) -> str: ...

    # -- which requests are checked, and checking them (the general path): a decision, or a question
    def wants(self, key: int, version: int) -> bool: ...
    def wants_lifecycle(self, key: int, version: int) -> bool: ...
    def check_produce(self, frame: memoryview, version: int, client: ClientInfo,
                      clock: Clock) -> Decision | PendingCheck: ...
    def check_txn_offset_commit(self, frame: memoryview, version: int, client: ClientInfo,
                                clock: Clock) -> Decision | PendingCheck: ...
    def check_lifecycle(self, frame: memoryview, version: int, client: ClientInfo,
                        clock: Clock) -> Decision | PendingCheck: ...
    def resume(self, check: PendingCheck, answer: Answer, clock: Clock) -> Decision | PendingCheck: ...

    # -- passing on local evidence (the relay's fast path): the ledger's record, or None for the general path
    def pass_produce_locally(self, data: bytes | memoryview, start: int, stop: int, version: int,
                             client: ClientInfo, clock: Clock) -> Passed | None: ...
    def pass_offset_commit_locally(
        self, data: bytes | memoryview, head: RequestHead, start: int, stop: int, client: ClientInfo, clock: Clock,
        place: int) -> PassedOffsets | Unchecked | None: ...

    # -- the transaction life cycle: requests observed, their answers learned from
    def observe_request(self, key: int, version: int, body: memoryview, now_ms: int,
                        connection_id: int = 0) -> Observed | None: ...
    def observe_request_in_place(self, head: RequestHead, data: bytes | memoryview, start: int, stop: int,
                                 clock: Clock, connection_id: int) -> tuple[Observed | None, bool] | None: ...
    def observe_response(self, key: int, version: int, request: Observed | None, body: memoryview,
                         now_ms: int) -> bool: ...
    def observe_response_in_place(self, key: int, version: int, request: Observed | None, data: bytes | memoryview,
                                  start: int, stop: int, now_ms: int, absorbable: bool) -> bool: ...

    # -- CONCURRENT_TRANSACTIONS absorbed (verification/concurrent.py)
    def absorbs(self, key: int, observed: Observed | None) -> bool: ...
    def retry_delay_ms(self, retries: int, waited_ms: float) -> float | None: ...

    # -- the KAFKA-17754 defence (verification/in_doubt.py)
    def end_txn_hold(self, key: int, version: int, frame: memoryview, request: Observed, client: ClientInfo,
                     connection_id: int, clock: Clock) -> PendingCheck | None: ...
    def end_txn_orphaned(self, observed: Observed, now_ms: int) -> None: ...

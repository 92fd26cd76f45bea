"""Requests held behind one that is not settled yet: one mechanism for every reason.

A write waiting for the verifier's answer, a request opening a transaction while an EndTxn of its producer
is in doubt (also a question to the verifier), and a life-cycle request the coordinator refused with
CONCURRENT_TRANSACTIONS and that the core asks again all mean the same for the connection: the client's
later requests queue behind it, in their order, and reading the client pauses (its cause is the hold's
reason, as the shell logs and labels it). They go on once no hold is left.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from txnguard.verification.decisions import PendingCheck

if TYPE_CHECKING:
    from txnguard.connection.in_flight import InFlight


class Pause(enum.Enum):
    """Why the core stops reading the client (the cause the shell logs and labels)."""

    VERIFICATION = "verification"  # a question to the verifier: a check, or the EndTxn hold
    CONCURRENT_TRANSACTIONS = "concurrent_transactions"  # asking the coordinator again (KIP-609 idea)
    MAX_IN_FLIGHT = "max_in_flight"
    DRAINING = "draining"


class Hold:
    """One request later requests wait behind. `id` names what settles it: the `Ask` (check id) of a
    question, or the `StartTimer` (token) of an absorption's next attempt (a new id per timer)."""

    __slots__ = ("check", "entry", "expect_response", "id", "reason")

    def __init__(self, reason: Pause, hold_id: int, entry: InFlight, check: PendingCheck | None,
                 expect_response: bool) -> None:
        self.reason = reason
        self.id = hold_id
        self.entry = entry
        self.check = check                    # the question, while the verifier is asked
        self.expect_response = expect_response  # False: an acks=0 write (no response, not in the queue)


class Holds:
    """The connection's holds and the requests queued behind them (at most one hold per reason)."""

    __slots__ = ("_active", "_ids", "queued")

    def __init__(self) -> None:
        self._active: list[Hold] = []
        self._ids = 0
        self.queued: list[memoryview] = []  # whole frames read while held, in the client's order

    def __bool__(self) -> bool:
        return bool(self._active)

    def start(self, reason: Pause, entry: InFlight, check: PendingCheck | None = None,
              expect_response: bool = True) -> Hold:
        hold = Hold(reason, self.next_id(), entry, check, expect_response)
        self._active.append(hold)
        return hold

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def of(self, reason: Pause) -> Hold | None:
        for hold in self._active:
            if hold.reason is reason:
                return hold
        return None

    def find(self, hold_id: int, reason: Pause) -> Hold | None:
        for hold in self._active:
            if hold.id == hold_id and hold.reason is reason:
                return hold
        return None

    def end(self, hold: Hold) -> None:
        self._active.remove(hold)

    def take_queued(self) -> list[memoryview]:
        queued, self.queued = self.queued, []
        return queued

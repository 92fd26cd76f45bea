"""One request the connection has forwarded and not yet answered, and what it needs to answer it.

Its own module so that the holds (connection/holds.py), which queue requests behind a pending one, and the
core share the type without importing each other.
"""

from __future__ import annotations

from txnguard.connection.apis import ResponseAction
from txnguard.connection.commands import Chunk
from txnguard.verification.decisions import Decision, Observed


class InFlight:
    __slots__ = ("action", "api_key", "api_version", "correlation_id", "evidence", "evidence_at", "merge", "observed",
                 "refused_at", "request", "response", "retries", "sent_at")

    def __init__(self, correlation_id: int, api_key: int, api_version: int, action: ResponseAction,
                 sent_at: float) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.action = action
        self.sent_at = sent_at
        self.response: list[Chunk] | None = None   # complete and waiting its turn
        # OBSERVE: the life-cycle request as read, or its EndTxn in doubt (SentEndTxn), for its answer.
        self.observed: Observed | None = None
        self.merge: Decision | None = None          # MERGE_PRODUCE: the decision whose rejections join the answer
        # A verified write: its answer closes the check-to-append window opened at evidence_at (Clock.perf).
        self.evidence: str | None = None
        self.evidence_at = 0.0
        self.request: bytes | None = None           # kept to ask again after CONCURRENT_TRANSACTIONS
        self.retries = 0                            # times sent again
        self.refused_at: float | None = None        # the first CONCURRENT_TRANSACTIONS answer

"""What the connection core asks its shell to do (commands) and tells it (facts).

Commands change the world: bytes to a side, a question to the verifier, a
close, reading paused or resumed. Facts only inform: the shell logs them and
counts them. Both come out of the core in one list, in the order they happened.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txnguard.verification.decisions import Decision, Question


class Side(enum.Enum):
    CLIENT = "client"
    BROKER = "upstream"


class Direction(enum.Enum):
    CLIENT_TO_BROKER = "client_to_broker"
    BROKER_TO_CLIENT = "broker_to_client"


Chunk = bytes | memoryview

# -- commands ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class SendToClient:
    data: list[Chunk]        # written in order; one write of many buffers (writev), never joined here


@dataclass(slots=True)
class SendToBroker:
    data: list[Chunk]


@dataclass(frozen=True, slots=True)
class Ask:
    """A blocking question: the shell answers it with `Connection.answered(check_id, Answer)`."""

    check_id: int
    question: Question


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Call `Connection.timer_fired(token)` after `delay_s` (the core has no clock of its own). `transactional_id`:
    the transaction whose end the retry waits for (an absorption of CONCURRENT_TRANSACTIONS); the shell may fire
    the timer early once the coordinator's log shows that transaction ended (proxy/log_follower.py)."""

    token: int
    delay_s: float
    transactional_id: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    reason: str              # the connection_closes_total label
    detail: str = ""
    level: str = "info"      # how loud the shell should log it
    frame_error: Direction | None = None  # also a frame refused in this direction


@dataclass(frozen=True, slots=True)
class PauseReading:
    side: Side
    cause: str


@dataclass(frozen=True, slots=True)
class ResumeReading:
    side: Side
    cause: str


# -- facts --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientIdentified:
    client_id: str


@dataclass(frozen=True, slots=True)
class ClientSoftware:
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class AnsweredLocally:
    api_key: int
    api_version: int
    correlation_id: int
    reason: str              # "unsupported_version", "verification"


@dataclass(frozen=True, slots=True)
class Rewritten:
    api_key: int
    kind: str                # "addresses", "intersect"


@dataclass(frozen=True, slots=True)
class Decided:
    """A verification's decision, for the audit log, metrics and logs."""

    decision: Decision


@dataclass(frozen=True, slots=True)
class ConcurrentAbsorbed:
    """The coordinator said CONCURRENT_TRANSACTIONS and the core asked again itself (KIP-609 idea)."""

    api_key: int
    retries: int             # how many times the request was sent again
    waited_ms: float         # from the first CONCURRENT_TRANSACTIONS to the answer the client got
    # "absorbed": the client got another answer; "budget_spent": it got 51 after all; "behind_another":
    # it got 51 at once, refused while another request of its connection was being asked again
    ending: str


@dataclass(frozen=True, slots=True)
class RequestSeen:
    """Only when the core was built with `debug`: one per request."""

    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class RawMode:
    reason: str


@dataclass(frozen=True, slots=True)
class Authenticated:
    pass


Command = (SendToClient | SendToBroker | Ask | StartTimer | Close | PauseReading | ResumeReading | ClientIdentified
           | ClientSoftware | AnsweredLocally | Rewritten | Decided | ConcurrentAbsorbed | RequestSeen
           | RawMode | Authenticated)



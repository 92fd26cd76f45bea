"""What a connection knows, and the moves every part of it makes (connection/core.py puts them together).

`ConnectionBase` holds the state of one client connection and its broker connection: the frame splitter
and the response reader, the in-order queue of requests awaiting responses (`_order`, and `_forwarded`,
the subset sent to the broker; with the native module, what the relay's fast path forwarded after them is
in its native book until the general path needs it: `_spill`), the holds, the mode, who the client is.
`Settings` and the shell's view of the cluster (`Cluster`) are what a connection is made with.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from txnguard.codecs import api_versions, native
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import FrameSplitter
from txnguard.connection.apis import ResponseAction
from txnguard.connection.commands import (
    Close,
    Command,
    Direction,
    PauseReading,
    ResumeReading,
    Side,
)
from txnguard.connection.holds import Hold, Holds, Pause
from txnguard.connection.in_flight import InFlight
from txnguard.connection.ledger import Ledger
from txnguard.connection.modes import Event, Mode, next_mode
from txnguard.connection.reader import ResponseReader
from txnguard.connection.rules import Rules
from txnguard.connection.traffic import TrafficCounters, make_traffic
from txnguard.verification.audit import ClientInfo
from txnguard.verification.decisions import Clock, PendingCheck
from txnguard.verification.inventory import ConnectionInventory

if TYPE_CHECKING:  # the module may be missing at run time (codecs/native.py); its stub is not
    from txnguard._native import Book

_CLOSED, _LINGERING, _RELAY, _HOLDING = Mode.CLOSED, Mode.LINGERING, Mode.RELAY, Mode.HOLDING
# The book's action codes (native/src/book.rs), by value; the plain ones (a request forwarded as it is whose answer
# needs nothing but the entry's head) by their member.
BOOK_ACTIONS = (ResponseAction.PASS, ResponseAction.OBSERVE, ResponseAction.REWRITE_ADDRESSES)
BOOK_CODES = {action: code for code, action in enumerate(BOOK_ACTIONS)}
_PLAIN_CODES = {action: BOOK_CODES[action] for action in (ResponseAction.PASS, ResponseAction.REWRITE_ADDRESSES)}


@dataclass(frozen=True, slots=True)
class Settings:
    connection_id: int
    listener: str
    max_frame_bytes: int
    pre_auth_max_frame_bytes: int | None   # the limit until SASL completes; None: no SASL expected
    max_in_flight: int
    partial_frame_timeout_s: float
    idle_timeout_s: float
    debug: bool = False                    # a RequestSeen fact per request
    fast_path: bool = True                 # relay frames that need no reading without the general path's helpers


class Cluster(Protocol):
    """The shell's view of the cluster, consulted synchronously (addresses, ApiVersions)."""

    version_policy: api_versions.VersionPolicy

    # May raise AddressUnavailable (no listener of ours for that broker): the connection closes with its reason.
    def client_address_for(self, node_id: int, host: str, port: int) -> tuple[str, int]: ...
    def learn_brokers(self, found: list[tuple[int, str, int]]) -> None: ...
    def remember_broker_api_versions(self, body: Any) -> None: ...
    def advertised_api_versions(self) -> list[tuple[int, int, int]]: ...


class ResponseOutOfOrder(CodecError):
    reason = "response_out_of_order"


class ConnectionBase:
    """What a connection knows (its state) and the few moves every part of it makes: who the client is, the
    mode's changes, pausing and closing, holds beginning and ending. connection/core.py builds `Connection`
    on it: the response side (responses.py), the request side (requests.py), the relay's fast paths
    (relay.py), and the events in."""

    def __init__(self, settings: Settings, rules: Rules, cluster: Cluster, clock: Clock,
                 traffic: TrafficCounters | None = None, inventory: ConnectionInventory | None = None) -> None:
        self.settings = settings
        self.inventory = inventory  # what the client showed of itself, for the audit's connection record
        self.rules = rules
        self.cluster = cluster
        self.clock = clock
        self.traffic = traffic or make_traffic()
        self.ledger = Ledger()  # what the shell records without commands (connection/ledger.py)
        self._info: ClientInfo | None = None
        limit = settings.pre_auth_max_frame_bytes or settings.max_frame_bytes
        self.requests = FrameSplitter(limit)
        # debug wants a RequestSeen per request; without the native readers nothing is read in place (native.py)
        self._fast = settings.fast_path and not settings.debug and native.AVAILABLE
        self._panicked: str | None = None  # a native reader's panic: this connection closes (receive_from_client)
        self._order: deque[InFlight] = deque()      # every request awaiting its response, in request order
        self._forwarded: deque[InFlight] = deque()  # the subset sent to the broker, to pair its responses
        # What the fast path forwarded after those, in native memory (native/src/book.rs): None without the module.
        self._book: Book | None = native.new_book(self.traffic) if native.AVAILABLE else None
        # A verification, the EndTxn hold, an absorption: later requests queue behind them (connection/holds.py).
        self.holds = Holds()
        self._paused: set[Pause] = set()
        self.mode = Mode.RELAY  # what the connection does; changed only through the table in connection/modes.py
        self.client_id: str | None = None
        self.software_name: str | None = None
        self.software_version: str | None = None
        self._family: str | None = None
        self.last_activity = clock.perf()
        self.partial_since: float | None = None
        self._now = self.last_activity
        self.responses = ResponseReader()
        self._answering: InFlight | None = None  # the request of the response being read

    # -- who the client is ----------------------------------------------------------------------------

    @property
    def family(self) -> str:
        if self._family is None:
            self._family = self.rules.family(self.software_name, self.client_id, self.settings.listener)
        return self._family

    def forget_family(self) -> None:
        """A new policy may classify the client differently."""
        self._family = None
        self._info = None

    def client_info(self) -> ClientInfo:
        """Who the client is, as decisions and audit records name it (kept until any part of it changes)."""
        info = self._info
        if info is None:
            info = self._info = ClientInfo(self.client_id, self.software_name, self.software_version, self.family,
                                           self.settings.listener, self.settings.connection_id)
        return info

    # -- the mode (connection/modes.py) ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.mode is _CLOSED

    @property
    def lingering(self) -> bool:
        return self.mode is _LINGERING

    def _to(self, event: Event) -> None:
        self.mode = mode = next_mode(self.mode, event)
        if mode is not _RELAY and mode is not _HOLDING:
            self._spill()  # the fast paths run only in those: whatever reads the queue now reads it in Python

    @property
    def in_flight(self) -> int:
        book = self._book
        return len(self._order) + (len(book) if book is not None else 0)

    def _enqueue(self, entry: InFlight, forwarded: bool = True) -> None:
        """Queue `entry` behind every request before it (the book's move onto the Python queue first); `forwarded`:
        sent to the broker now, so its answer comes in this order."""
        self._spill()
        self._order.append(entry)
        if forwarded:
            self._forwarded.append(entry)

    def _enqueue_plain(self, correlation_id: int, key: int, version: int, action: ResponseAction) -> None:
        """A request the general path forwards as it is, whose answer needs nothing but the entry's head (PASS,
        REWRITE_ADDRESSES): into the book while relaying with nothing waiting in the Python queue (its answer
        then takes the native path), else queued as `_enqueue` does."""
        book = self._book
        code = _PLAIN_CODES.get(action)
        if book is not None and code is not None and not self._order and self.mode is _RELAY:
            book.push(correlation_id, key, version, code, self._now)
            return
        self._enqueue(InFlight(correlation_id, key, version, action, self._now))

    def _spill(self) -> None:
        """The book's entries onto the Python queues, in order: the general path is about to read or add to them.
        The book holds only what was forwarded after every Python entry (native/src/book.rs says why)."""
        book = self._book
        if book is None or not len(book):
            return
        order, forwarded = self._order, self._forwarded
        for correlation_id, key, version, action, sent_at, evidence, evidence_at, observed, request in book.spill():
            entry = InFlight(correlation_id, key, version, BOOK_ACTIONS[action], sent_at)
            entry.evidence, entry.evidence_at, entry.observed, entry.request = evidence, evidence_at, observed, request
            order.append(entry)
            forwarded.append(entry)

    # -- holds (connection/holds.py): later requests queue, reading the client pauses ------------------

    def _hold(self, reason: Pause, entry: InFlight, out: list[Command], check: PendingCheck | None = None,
              expect_response: bool = True) -> Hold:
        """Later requests queue behind `entry` until the hold ends; reading the client pauses for `reason`."""
        hold = self.holds.start(reason, entry, check, expect_response)
        self._to(Event.HOLD)
        self._pause(reason, out)
        return hold

    def _end_hold(self, hold: Hold, out: list[Command]) -> None:
        self.holds.end(hold)
        if self.holds.of(hold.reason) is None:
            self._resume(hold.reason, out)
        if not self.holds:
            self._to(Event.RELEASE)

    # -- pausing and closing --------------------------------------------------------------------------

    def _pause(self, cause: Pause, out: list[Command]) -> None:
        if cause not in self._paused:
            self._paused.add(cause)
            out.append(PauseReading(Side.CLIENT, cause.value))

    def _resume(self, cause: Pause, out: list[Command]) -> None:
        if cause in self._paused:
            self._paused.discard(cause)
            out.append(ResumeReading(Side.CLIENT, cause.value))

    def _close(self, reason: str, detail: str, level: str = "info", frame_error: Direction | None = None) -> Close:
        self._to(Event.CLOSE)
        return Close(reason, detail, level, frame_error)

    def _close_on(self, error: CodecError, direction: Direction, prefix: str = "") -> Close:
        return self._close(error.reason, f"{prefix}{error}", "warning", direction)

"""Client -> broker, the general path: requests framed whole, peeked, book-kept, checked, forwarded.

Requests are framed whole (`FrameSplitter`), peeked, book-kept and forwarded as their original bytes.
Kafka answers a connection's requests in order, so an in-order queue (`_order`) pairs every response with
its request; requests the proxy answers itself sit in the same queue and leave in turn. acks=0 Produce gets
no response and never enters the queue. The relay's fast path (connection/relay.py) takes the frames that
need none of this first.
"""

from __future__ import annotations

from txnguard.codecs import addresses, api_versions, schemas
from txnguard.codecs.errors import CodecError
from txnguard.codecs.header import (
    RequestHead,
    peek_client_id,
    peek_request,
    produce_acks_and_txn_id_null,
)
from txnguard.codecs.synthesis import api_versions_unsupported
from txnguard.connection.apis import ACTION_BY_KEY, ApiKey, ResponseAction
from txnguard.connection.commands import (
    AnsweredLocally,
    Ask,
    Chunk,
    ClientIdentified,
    ClientSoftware,
    Command,
    Decided,
    Direction,
    RequestSeen,
    SendToBroker,
)
from txnguard.connection.holds import Pause
from txnguard.connection.in_flight import InFlight
from txnguard.connection.modes import Mode
from txnguard.connection.responses import ResponseSide
from txnguard.verification.decisions import Decision, PendingCheck

# A request at least this large that the proxy need not read (a Produce it does not verify) is
# forwarded as its bytes arrive: assembling 100 MiB first cost a copy that stalled every connection.
CUT_THROUGH_REQUESTS_ABOVE = 1024 * 1024
_PASS = ResponseAction.PASS
_PRODUCE, _TXN_OFFSET_COMMIT = ApiKey.PRODUCE.value, ApiKey.TXN_OFFSET_COMMIT.value
_SASL_HANDSHAKE, _API_VERSIONS = ApiKey.SASL_HANDSHAKE.value, ApiKey.API_VERSIONS.value
_LIFECYCLE = frozenset({ApiKey.END_TXN.value, ApiKey.INIT_PRODUCER_ID.value})  # checked for coordinator timeouts
_OPENS_TRANSACTION = frozenset({ApiKey.ADD_PARTITIONS_TO_TXN.value, ApiKey.ADD_OFFSETS_TO_TXN.value})
_RELAY, _CLOSED = Mode.RELAY, Mode.CLOSED


class RequestSide(ResponseSide):
    """Client -> broker on the general path: each whole request peeked, counted, checked by the rules when
    they want it (a decision now, or a question and a hold), answered here, or forwarded; a large request
    that needs no reading cut through; held requests released once no hold is left."""

    def _requests(self, frames: list[memoryview], out: list[Command], to_broker: list[Chunk]) -> None:
        for i, frame in enumerate(frames):
            if self.holds:
                self.holds.queued.extend(frames[i:])
                return
            try:
                forward = self._request(frame, out)
            except CodecError as e:
                out.append(self._close_on(e, Direction.CLIENT_TO_BROKER))
                return
            if self.mode is _CLOSED:
                return
            if forward is not None:
                to_broker.append(forward)

    def _after_requests(self, out: list[Command], to_broker: list[Chunk]) -> None:
        if self.mode is _CLOSED:
            return
        if to_broker:
            out.append(SendToBroker(to_broker))
        if self.in_flight >= self.settings.max_in_flight:
            self._pause(Pause.MAX_IN_FLIGHT, out)
        to_client: list[Chunk] = []
        self._take_ready(to_client)
        self._after_responses(out, to_client)

    def _note_request(self, head: RequestHead, body: memoryview, size: int, out: list[Command]) -> None:
        """Count a request and learn who the client is (its header and first bytes are enough)."""
        key = head.api_key
        self.traffic.count_in(key, size)
        if self.inventory is not None:
            self.inventory.request(head, body)
        if self.client_id is None and key != _SASL_HANDSHAKE:
            self.client_id = peek_client_id(body) or ""
            self._family = self._info = None
            out.append(ClientIdentified(self.client_id))
        if self.settings.debug:
            out.append(RequestSeen(key, head.api_version, head.correlation_id))

    def _cut_through(self, out: list[Command]) -> None:
        """Forward a large request that needs no reading as its bytes arrive, instead of assembling it.

        Only a Produce the proxy does not verify qualifies (verification reads every batch header),
        and only when nothing is held: requests reach the broker in the client's order.
        """
        if self.mode is not _RELAY or self.holds.queued:
            return
        found = self.requests.incomplete()
        if found is None:
            return
        size, first = found
        body = memoryview(first)[4:]
        try:
            head = peek_request(body)
            if head.api_key != _PRODUCE:
                return
            acks, txn_id_null = produce_acks_and_txn_id_null(body, head)
        except CodecError:
            return  # the header has not all arrived (or is broken: the whole frame will be judged)
        if not txn_id_null and self.rules.wants(_PRODUCE, head.api_version):
            return
        parts = self.requests.cut_through()
        self.partial_since = None
        self._note_request(head, body, size, out)
        if self.inventory is not None:
            self.inventory.produce(head, body, not txn_id_null)
        if acks != 0:
            action = self._classify(body, head, out) or _PASS
            self._enqueue_plain(head.correlation_id, head.api_key, head.api_version, action)
        out.append(SendToBroker(parts))
        if self.in_flight >= self.settings.max_in_flight:
            self._pause(Pause.MAX_IN_FLIGHT, out)

    def _request(self, frame: memoryview, out: list[Command]) -> Chunk | None:
        """Book-keep one request; what to forward (the frame, or a reduced one), None if nothing."""
        body = frame[4:]
        head = peek_request(body)
        key, version, correlation_id = head.api_key, head.api_version, head.correlation_id
        self._note_request(head, body, len(frame), out)
        if key == _PRODUCE:
            acks, txn_id_null = produce_acks_and_txn_id_null(body, head)
            if self.inventory is not None:
                self.inventory.produce(head, body, not txn_id_null)
            if not txn_id_null and self.rules.wants(key, version):
                return self._check(head, self.rules.check_produce(frame, version, self.client_info(), self.clock),
                                   acks != 0, out)
            if acks == 0:
                return frame  # no response will come, so it never enters the queue
        elif key == _TXN_OFFSET_COMMIT and self.rules.wants(key, version):
            return self._check(head, self.rules.check_txn_offset_commit(frame, version, self.client_info(),
                                                                         self.clock), True, out)
        elif key in _LIFECYCLE and self.rules.wants_lifecycle(key, version):
            return self._check(head, self.rules.check_lifecycle(frame, version, self.client_info(), self.clock),
                               True, out)
        action = self._classify(body, head, out)
        if action is None:
            return None  # answered here
        if action is not ResponseAction.OBSERVE:
            self._enqueue_plain(correlation_id, key, version, action)
            return frame
        entry = InFlight(correlation_id, key, version, action, self._now)
        entry.observed = self.rules.observe_request(key, version, body, self.clock.wall_ms(),
                                                    self.settings.connection_id)
        if self.rules.absorbs(key, entry.observed):
            entry.request = bytes(frame)  # a few hundred bytes, kept until the answer
        if key in _OPENS_TRANSACTION and self._hold_for_end_txn(entry, frame, out):
            return None  # held: forwarded (or answered) when the doubt ends
        self._enqueue(entry)
        return frame

    def _classify(self, body: memoryview, head: RequestHead, out: list[Command]) -> ResponseAction | None:
        """What to do with a request's response, or None if the proxy answered the request itself."""
        key, version = head.api_key, head.api_version
        action = ACTION_BY_KEY.get(key)
        if action is not None:
            return action
        if key == _API_VERSIONS:
            if version > api_versions.proxy_api_versions_range()[1]:
                # A broker answers a too-new ApiVersions with v0 and UNSUPPORTED_VERSION (KIP-511).
                response = api_versions_unsupported(head.correlation_id, self.cluster.advertised_api_versions())
                self._answer(head, response, "unsupported_version", out)
                return None
            self._note_client_software(body, version, out)
            return ResponseAction.REWRITE_API_VERSIONS
        if addresses.carries_addresses(key, version):
            return ResponseAction.REWRITE_ADDRESSES
        return _PASS

    # -- checked requests: a decision now, or a question and a hold ----------------------------------

    def _check(self, head: RequestHead, result: Decision | PendingCheck, expect_response: bool,
               out: list[Command]) -> Chunk | None:
        """A checked request: apply the decision now, or ask and hold the connection until the answer."""
        entry = InFlight(head.correlation_id, head.api_key, head.api_version, _PASS, self._now)
        if expect_response:
            self._enqueue(entry, forwarded=False)  # forwarded once decided (`_apply`)
        if isinstance(result, Decision):
            return self._apply(result, entry, expect_response, out)
        self._wait_for(result, entry, expect_response, out)
        return None

    def _wait_for(self, check: PendingCheck, entry: InFlight, expect_response: bool, out: list[Command]) -> None:
        """Ask the verifier and hold the connection (later requests queue) until `answered`."""
        hold = self._hold(Pause.VERIFICATION, entry, out, check, expect_response)
        out.append(Ask(hold.id, check.question))

    def _apply(self, decision: Decision, entry: InFlight, expect_response: bool,
               out: list[Command]) -> Chunk | None:
        """Book-keep a decision; what to forward (None: answered here, or the connection closed)."""
        if decision.context is not None:
            out.append(Decided(decision))
        if decision.rejections and not expect_response:
            # acks=0 has no response to carry an error: the broker closes the connection instead.
            out.append(self._close("rejected_without_response", "a transactional acks=0 write failed verification",
                                   "warning"))
            return None
        if decision.forward is None:
            if expect_response:
                entry.response = [decision.local_response or b""]
                out.append(AnsweredLocally(entry.api_key, entry.api_version, entry.correlation_id,
                                           decision.local_reason))
            return None
        entry.sent_at = self._now
        if decision.observe is not None:  # a checked life-cycle request: its answer still feeds the registry
            entry.action = ResponseAction.OBSERVE
            entry.observed = decision.observe
        elif decision.rejections:
            entry.action = ResponseAction.MERGE_PRODUCE
            entry.merge = decision
        elif addresses.carries_addresses(entry.api_key, entry.api_version):
            entry.action = ResponseAction.REWRITE_ADDRESSES
        if decision.evidence_at is not None and decision.evidence is not None:
            entry.evidence, entry.evidence_at = decision.evidence, decision.evidence_at
        if expect_response:
            self._forwarded.append(entry)
        return decision.forward

    def _hold_for_end_txn(self, entry: InFlight, frame: memoryview, out: list[Command]) -> bool:
        """An AddPartitionsToTxn/AddOffsetsToTxn that would open a transaction while an EndTxn of the
        same producer is in doubt waits (as a verification does: later requests queue behind it)."""
        if entry.observed is None:
            return False
        check = self.rules.end_txn_hold(entry.api_key, entry.api_version, frame, entry.observed,
                                        self.client_info(), self.settings.connection_id, self.clock)
        if check is None:
            return False
        self._enqueue(entry, forwarded=False)
        self._wait_for(check, entry, True, out)
        return True

    def _release_held(self, out: list[Command], to_broker: list[Chunk] | None = None) -> None:
        """Requests queued behind holds go on once no hold is left."""
        to_broker = [] if to_broker is None else to_broker
        if not self.holds:
            held = self.holds.take_queued()
            if held:
                self._requests(held, out, to_broker)
        if self.mode is not _CLOSED:
            self._after_requests(out, to_broker)

    # -- answered here ----------------------------------------------------------------------------------

    def _note_client_software(self, body: memoryview, version: int, out: list[Command]) -> None:
        if version < 3:
            return
        try:
            _, req = schemas.decode_request(body)
        except CodecError:
            return  # the broker will judge the request; we only wanted names for the logs
        self.software_name = str(req.client_software_name)
        self.software_version = str(req.client_software_version)
        self._family = self._info = None
        out.append(ClientSoftware(self.software_name, self.software_version))

    def _answer(self, head: RequestHead, response: bytes, reason: str, out: list[Command]) -> None:
        entry = InFlight(head.correlation_id, head.api_key, head.api_version, _PASS, self._now)
        entry.response = [response]
        self._enqueue(entry, forwarded=False)
        out.append(AnsweredLocally(head.api_key, head.api_version, head.correlation_id, reason))

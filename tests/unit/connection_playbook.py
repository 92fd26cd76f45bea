"""A playbook for the connection core: real Kafka frames in, commands out, no event loop.

Frames are built with kio's own encoders (`schemas.encode_request`, the raw client's
batch writer); the helpers read what the core emitted back as bytes per side.

Every command counts, as in mitmproxy's playbook: each list the playbook's connection returns is an
`Emitted`, which remembers which of its commands the test looked at (compared the whole list, unpacked it,
indexed one, or read them with `to_broker`, `to_client` or `of_type`). After the test, a command nobody
asserted fails it (tests/unit/conftest.py), so an unexpected extra `Close` or `Ask` cannot pass unnoticed.
"""

from __future__ import annotations

import datetime
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, SupportsIndex, TypeVar, overload

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.api_versions import VersionPolicy
from txnguard.connection.commands import (
    ClientIdentified,
    ClientSoftware,
    Command,
    RequestSeen,
    SendToBroker,
    SendToClient,
)
from txnguard.connection.core import Connection, Settings
from txnguard.connection.traffic import make_traffic
from txnguard.policies.policy import policy_from_config
from txnguard.testing.raw import build_batch
from txnguard.verification.concurrent import ConcurrentRetry
from txnguard.verification.decisions import TransactionRules
from txnguard.verification.registry import Registry

TXN, PID, EPOCH = "app", 7, 0
T0, T1 = ("orders", 0), ("orders", 1)


def request_module(api_key: int, version: int) -> Any:
    return sys.modules[schemas.request_schema(api_key, version).__module__]


def response_module(api_key: int, version: int) -> Any:
    return sys.modules[schemas.response_schema(api_key, version).__module__]


def request(payload: Any, correlation_id: int) -> bytes:
    return schemas.encode_request(payload, correlation_id, "playbook-client")


def response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    return schemas.encode(schemas.response_header_for(api_key, version, correlation_id), body)


# -- requests ----------------------------------------------------------------------------------------------


def produce(correlation_id: int, partitions: list[tuple[str, int]], *, transactional: bool = True,
            acks: int = -1, version: int = 9, value: bytes = b"v", timeout_ms: int = 30_000) -> bytes:
    m = request_module(ApiKey.PRODUCE, version)
    by_topic: dict[str, list[Any]] = {}
    for topic, p in partitions:
        records = build_batch([value], producer_id=PID if transactional else -1,
                              producer_epoch=EPOCH if transactional else -1, base_sequence=0,
                              transactional=transactional,
                              timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
        by_topic.setdefault(topic, []).append(m.PartitionProduceData(index=i32(p), records=records))
    return request(m.ProduceRequest(
        transactional_id=TXN if transactional else None, acks=i16(acks),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(m.TopicProduceData(name=t, partition_data=tuple(ps)) for t, ps in by_topic.items()),
    ), correlation_id)


def heartbeat(correlation_id: int) -> bytes:
    m = request_module(12, 4)
    return request(m.HeartbeatRequest(group_id="g", generation_id=i32(1), member_id="m", group_instance_id=None),
                   correlation_id)


def api_versions_request(correlation_id: int, version: int = 3) -> bytes:
    """ApiVersions of any version: a newer one than kio knows is written as v3 with the version patched."""
    m = request_module(ApiKey.API_VERSIONS, 3)
    frame = bytearray(request(m.ApiVersionsRequest(client_software_name="playbook",
                                                   client_software_version="1.0"), correlation_id))
    struct.pack_into(">h", frame, 6, version)
    return bytes(frame)


def sasl_handshake(correlation_id: int, version: int = 0) -> bytes:
    m = request_module(ApiKey.SASL_HANDSHAKE, version)
    return request(m.SaslHandshakeRequest(mechanism="PLAIN"), correlation_id)


def sasl_authenticate(correlation_id: int, token: bytes = b"\0user\0secret") -> bytes:
    m = request_module(ApiKey.SASL_AUTHENTICATE, 2)
    return request(m.SaslAuthenticateRequest(auth_bytes=token), correlation_id)


def init_producer_id(correlation_id: int) -> bytes:
    m = request_module(ApiKey.INIT_PRODUCER_ID, 3)
    return request(m.InitProducerIdRequest(transactional_id=TXN, transaction_timeout=datetime.timedelta(minutes=1),
                                           producer_id=i64(-1), producer_epoch=i16(-1)), correlation_id)


def add_partitions(correlation_id: int, partitions: list[tuple[str, int]]) -> bytes:
    m = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    return request(m.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TXN, v3_and_below_producer_id=i64(PID), v3_and_below_producer_epoch=i16(EPOCH),
        v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(name=t, partitions=tuple(i32(p) for p in ps))
                                  for t, ps in topics.items())), correlation_id)


def end_txn(correlation_id: int, committed: bool = True) -> bytes:
    m = request_module(ApiKey.END_TXN, 3)
    return request(m.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                   committed=committed), correlation_id)


def txn_offset_commit(correlation_id: int, group: str = "g", version: int = 3, epoch: int = EPOCH,
                      offsets: dict[tuple[str, int], int] | None = None) -> bytes:
    """A TxnOffsetCommit (v0-v5) committing `offsets` (partition -> offset; one of "orders" by default)."""
    m = request_module(ApiKey.TXN_OFFSET_COMMIT, version)
    topics: dict[str, list[tuple[int, int]]] = {}
    for (t, p), offset in (offsets or {("orders", 0): 5}).items():
        topics.setdefault(t, []).append((p, offset))
    later = {"generation_id": i32(-1), "member_id": "", "group_instance_id": None} if version >= 3 else {}
    epochs = {"committed_leader_epoch": i32(-1)} if version >= 2 else {}
    return request(m.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id=group, producer_id=i64(PID), producer_epoch=i16(epoch), **later,
        topics=tuple(m.TxnOffsetCommitRequestTopic(name=t, partitions=tuple(m.TxnOffsetCommitRequestPartition(
            partition_index=i32(p), committed_offset=i64(o), committed_metadata="", **epochs) for p, o in ps))
            for t, ps in topics.items())), correlation_id)


# -- responses ---------------------------------------------------------------------------------------------


def produce_response(correlation_id: int, partitions: list[tuple[str, int]], version: int = 9,
                     error: ErrorCode = ErrorCode.none) -> bytes:
    m = response_module(ApiKey.PRODUCE, version)
    by_topic: dict[str, list[Any]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(m.PartitionProduceResponse(
            index=i32(p), error_code=error, base_offset=i64(100 + p), log_append_time=None,
            log_start_offset=i64(0), record_errors=(), error_message=None))
    return response(ApiKey.PRODUCE, version, correlation_id, m.ProduceResponse(
        responses=tuple(m.TopicProduceResponse(name=t, partition_responses=tuple(ps)) for t, ps in by_topic.items()),
        throttle_time=datetime.timedelta(0)))


def heartbeat_response(correlation_id: int) -> bytes:
    m = response_module(12, 4)
    return response(12, 4, correlation_id, m.HeartbeatResponse(throttle_time=datetime.timedelta(0),
                                                               error_code=ErrorCode.none))


def fetch_response(correlation_id: int, records: bytes) -> bytes:
    m = response_module(ApiKey.FETCH, 11)
    return response(ApiKey.FETCH, 11, correlation_id, m.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
        responses=(m.FetchableTopicResponse(topic="orders", partitions=(m.PartitionData(
            partition_index=i32(0), error_code=ErrorCode.none, high_watermark=i64(1), last_stable_offset=i64(1),
            log_start_offset=i64(0), aborted_transactions=None, preferred_read_replica=i32(-1), records=records),)),)))


def fetch_request(correlation_id: int) -> bytes:
    m = request_module(ApiKey.FETCH, 11)
    return request(m.FetchRequest(
        replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
        max_bytes=i32(50 << 20), isolation_level=i16(0), session_id=i32(0), session_epoch=i32(-1), topics=(),
        forgotten_topics_data=(), rack_id=""), correlation_id)


def sasl_handshake_response(correlation_id: int, version: int = 0) -> bytes:
    m = response_module(ApiKey.SASL_HANDSHAKE, version)
    return response(ApiKey.SASL_HANDSHAKE, version, correlation_id, m.SaslHandshakeResponse(error_code=ErrorCode.none,
                                                                         mechanisms=("PLAIN",)))


def sasl_authenticate_response(correlation_id: int) -> bytes:
    m = response_module(ApiKey.SASL_AUTHENTICATE, 2)
    return response(ApiKey.SASL_AUTHENTICATE, 2, correlation_id, m.SaslAuthenticateResponse(
        error_code=ErrorCode.none, error_message=None, auth_bytes=b"", session_lifetime=datetime.timedelta(0)))


def init_producer_id_response(correlation_id: int) -> bytes:
    m = response_module(ApiKey.INIT_PRODUCER_ID, 3)
    return response(ApiKey.INIT_PRODUCER_ID, 3, correlation_id, m.InitProducerIdResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, producer_id=i64(PID),
        producer_epoch=i16(EPOCH)))


def add_partitions_response(correlation_id: int, partitions: list[tuple[str, int]],
                            errors: dict[tuple[str, int], ErrorCode] | None = None,
                            error: ErrorCode = ErrorCode.none) -> bytes:
    """Every partition answered `error`, unless `errors` names its own."""
    m = response_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    return response(ApiKey.ADD_PARTITIONS_TO_TXN, 3, correlation_id, m.AddPartitionsToTxnResponse(
        throttle_time=datetime.timedelta(0),
        results_by_topic_v3_and_below=tuple(m.AddPartitionsToTxnTopicResult(name=t, results_by_partition=tuple(
            m.AddPartitionsToTxnPartitionResult(partition_index=i32(p),
                                                partition_error_code=(errors or {}).get((t, p), error))
            for p in ps)) for t, ps in topics.items())))


def add_offsets(correlation_id: int, group: str = "g") -> bytes:
    m = request_module(ApiKey.ADD_OFFSETS_TO_TXN, 3)
    return request(m.AddOffsetsToTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                            group_id=group), correlation_id)


def add_offsets_response(correlation_id: int, error: ErrorCode = ErrorCode.none) -> bytes:
    m = response_module(ApiKey.ADD_OFFSETS_TO_TXN, 3)
    return response(ApiKey.ADD_OFFSETS_TO_TXN, 3, correlation_id,
                    m.AddOffsetsToTxnResponse(throttle_time=datetime.timedelta(0),
                                                                      error_code=error))


def txn_offset_commit_response(correlation_id: int, version: int = 3,
                               partitions: tuple[tuple[str, int], ...] = (("orders", 0),)) -> bytes:
    m = response_module(ApiKey.TXN_OFFSET_COMMIT, version)
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    return response(ApiKey.TXN_OFFSET_COMMIT, version, correlation_id, m.TxnOffsetCommitResponse(
        throttle_time=datetime.timedelta(0), topics=tuple(m.TxnOffsetCommitResponseTopic(name=t, partitions=tuple(
            m.TxnOffsetCommitResponsePartition(partition_index=i32(p), error_code=ErrorCode.none) for p in ps))
            for t, ps in topics.items())))


def end_txn_response(correlation_id: int, error: ErrorCode = ErrorCode.none) -> bytes:
    m = response_module(ApiKey.END_TXN, 3)
    return response(ApiKey.END_TXN, 3, correlation_id, m.EndTxnResponse(throttle_time=datetime.timedelta(0),
                                                                        error_code=error))


def decode_produce_response(frame: bytes, version: int = 9) -> list[tuple[str, int, int, str | None]]:
    """(topic, partition, error code, message) in the order the response lists them."""
    _, body = schemas.decode_response(frame[4:], ApiKey.PRODUCE, version)
    return [(str(t.name), int(p.index), int(p.error_code), p.error_message)
            for t in body.responses for p in t.partition_responses]


def correlation_ids(stream: bytes) -> list[int]:
    """The correlation ids of a stream of response frames."""
    out, pos = [], 0
    while pos < len(stream):
        size, cid = struct.unpack_from(">ii", stream, pos)
        out.append(cid)
        pos += 4 + size
    return out


# -- the parts around the core -----------------------------------------------------------------------------


@dataclass
class FakeClock:
    seconds: float = 1000.0

    def wall_ms(self) -> int:
        return int(self.seconds * 1000)

    def perf(self) -> float:
        return self.seconds

    def cpu(self) -> float:
        return 0.0


@dataclass
class FakeCluster:
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    learned: list[tuple[int, str, int]] = field(default_factory=list)

    def client_address_for(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return "proxy.local", 19100 + node_id

    def learn_brokers(self, found: list[tuple[int, str, int]]) -> None:
        self.learned.extend(found)

    def remember_broker_api_versions(self, body: Any) -> None:
        pass

    def advertised_api_versions(self) -> list[tuple[int, int, int]]:
        return [(0, 3, 9), (18, 0, 3)]


C = TypeVar("C")


class Emitted(list[Command]):
    """What one call into the core emitted, and which of it the test has asserted."""

    def __init__(self, commands: list[Command], step: str) -> None:
        super().__init__(commands)
        self.step = step
        self.seen = [False] * len(commands)

    @overload
    def see(self, kind: None = None) -> list[Command]: ...
    @overload
    def see(self, kind: type[C]) -> list[C]: ...
    def see(self, kind: type | None = None) -> list[Any]:
        """The commands of `kind` (all when None), now asserted."""
        found = []
        for i in range(len(self)):
            command = list.__getitem__(self, i)
            if kind is None or isinstance(command, kind):
                self.seen[i] = True
                found.append(command)
        return found

    def unasserted(self, facts: bool) -> list[Command]:
        return [c for i, seen in enumerate(self.seen) if not seen
                and (facts or not isinstance(c := list.__getitem__(self, i), FACTS))]

    def __eq__(self, other: object) -> bool:  # the whole list compared
        self.see()
        return list.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    # Walking or unpacking the list (`for c in e`, `a, b = e`, `list(e)`) asserts nothing: a test that walks
    # it to find one command has looked at that one only. It says what it asserted with `see(Kind)`, `==`
    # or an index.

    @overload
    def __getitem__(self, i: SupportsIndex) -> Command: ...
    @overload
    def __getitem__(self, i: slice) -> list[Command]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Command | list[Command]:
        for j in range(len(self))[i] if isinstance(i, slice) else [range(len(self))[i]]:
            self.seen[j] = True
        return list.__getitem__(self, i)


# Facts only inform the shell's logs and counters (commands.py); like mitmproxy's log commands they need
# asserting only in a playbook made with facts=True. Commands proper (bytes to a side, Ask, StartTimer,
# Close, pause/resume) always do.
FACTS = (ClientIdentified, ClientSoftware, RequestSeen)

# Every recorder made in the current test, for the after-test check in conftest.py.
RECORDERS: list[Recorder] = []
TRACKED = ("receive_from_client", "receive_from_broker", "answered", "timer_fired", "verification_failed", "drain",
           "tick", "client_gone")


class Recorder:
    """What tracked connections emitted in one test."""

    def __init__(self, facts: bool = False) -> None:
        self.facts = facts
        self.emitted: list[Emitted] = []
        RECORDERS.append(self)

    def unasserted(self) -> list[tuple[str, Command]]:
        """(the call, the command) for every command no test line looked at."""
        return [(e.step, c) for e in self.emitted for c in e.unasserted(self.facts)]


def track(conn: Connection, recorder: Recorder | None = None) -> Connection:
    """Make the connection's command-returning methods (`TRACKED`) return `Emitted` lists, checked after the test."""
    rec = recorder or Recorder()
    for name in TRACKED:
        setattr(conn, name, _tracked(rec, name, getattr(conn, name)))
    return conn


def _tracked(rec: Recorder, name: str, method: Callable[..., list[Command]]) -> Callable[..., Emitted]:
    def call(*args: Any) -> Emitted:
        emitted = Emitted(method(*args), f"{name}{args!r:.120}")
        rec.emitted.append(emitted)
        return emitted
    return call


class Playbook:
    """One connection core with its registry, policy, clock and cluster. The core's command-returning
    methods (`TRACKED`) return `Emitted` lists: every command in them must be asserted."""

    def __init__(self, *, max_in_flight: int = 100, policy: dict[str, Any] | None = None,
                 pre_auth_max_frame_bytes: int | None = None, max_frame_bytes: int = 100 << 20,
                 concurrent: ConcurrentRetry | None = None, facts: bool = False) -> None:
        self.clock = FakeClock()
        self.cluster = FakeCluster()
        self.registry = Registry()
        self.rules = TransactionRules(self.registry, policy_from_config(policy or {}), concurrent=concurrent)
        self.traffic = make_traffic()
        self.conn = Connection(
            Settings(connection_id=1, listener="bootstrap", max_frame_bytes=max_frame_bytes,
                     pre_auth_max_frame_bytes=pre_auth_max_frame_bytes, max_in_flight=max_in_flight,
                     partial_frame_timeout_s=30.0, idle_timeout_s=600.0),
            self.rules, self.cluster, self.clock, self.traffic)
        self.recorder = Recorder(facts)
        track(self.conn, self.recorder)

    def transaction_with(self, *partitions: tuple[str, int]) -> None:
        """The proxy saw InitProducerId and AddPartitionsToTxn for these partitions (local evidence)."""
        now = self.clock.wall_ms()
        self.registry.init_producer_id(TXN, PID, EPOCH, 60_000, now)
        self.registry.added(TXN, PID, EPOCH, now, partitions=set(partitions))

    def client_sends(self, *frames: bytes) -> list[Command]:
        return self.conn.receive_from_client(b"".join(frames))

    def broker_answers(self, *frames: bytes) -> list[Command]:
        return self.conn.receive_from_broker(b"".join(frames))

    def relays(self, *frames: bytes) -> None:
        """The client sends `frames` and the core forwards them as they are, and does nothing else."""
        out = self.client_sends(*frames)
        assert only(out, SendToBroker) == b"".join(frames)

    def delivers(self, *frames: bytes) -> None:
        """The broker answers `frames` and the core passes them to the client as they are, and nothing else."""
        out = self.broker_answers(*frames)
        assert only(out, SendToClient) == b"".join(frames)


def _select(commands: list[Command], kind: type) -> list[Any]:
    if isinstance(commands, Emitted):
        return commands.see(kind)
    return [c for c in commands if isinstance(c, kind)]


def to_broker(commands: list[Command]) -> bytes:
    """The bytes sent to the broker (every SendToBroker now asserted)."""
    return b"".join(bytes(c) for cmd in _select(commands, SendToBroker) for c in cmd.data)


def to_client(commands: list[Command]) -> bytes:
    """The bytes sent to the client (every SendToClient now asserted)."""
    return b"".join(bytes(c) for cmd in _select(commands, SendToClient) for c in cmd.data)


class Like:
    """In a whole-list compare, equal to any command of `kind` whose named fields are equal (a placeholder)."""

    def __init__(self, kind: type, **fields: Any) -> None:
        self.kind = kind
        self.fields = fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.kind) and all(getattr(other, k) == v for k, v in self.fields.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Like({self.kind.__name__}, {self.fields})"


def steps(commands: list[Command]) -> list[Any]:
    """The whole list, asserted, as a test states it: the bytes of a send joined into one chunk, facts left out."""
    whole = commands.see() if isinstance(commands, Emitted) else list(commands)
    return [type(c)([b"".join(bytes(x) for x in c.data)]) if isinstance(c, SendToBroker | SendToClient) else c
            for c in whole if not isinstance(c, FACTS)]


def only(commands: list[Command], kind: type[SendToBroker | SendToClient]) -> bytes:
    """The bytes of a list that holds nothing but sends to one side (facts aside): the whole list asserted."""
    others = [c for c in (commands.see() if isinstance(commands, Emitted) else commands)
              if not isinstance(c, (kind, *FACTS))]
    assert others == [], f"besides {kind.__name__}: {others}"
    return b"".join(bytes(c) for cmd in commands if isinstance(cmd, kind) for c in cmd.data)


def of_type(commands: list[Command], kind: type) -> list[Any]:
    """The commands of one kind (now asserted); the others still have to be."""
    return _select(commands, kind)

"""Transactional request sequences with the raw client, the way old clients produce them by accident.

`TxnActor` speaks to whatever bootstrap it is given (a broker or a txnguard
proxy) and routes each request where a client would: transaction requests to
the coordinator FindCoordinator names, Produce to the leader Metadata names.
So the same scenario runs directly against brokers and through the proxy.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.testing.raw import ProducerIdentity, RawClient, build_batch, coordinator_for


@dataclass
class ProduceResult:
    error_code: int
    error_message: str | None
    base_offset: int


@dataclass
class TxnActor:
    bootstrap: str
    transactional_id: str
    timeout_ms: int = 60000
    producer: ProducerIdentity | None = None
    request_timeout_ms: int = 30000  # a Produce's TimeoutMs (clients send their request timeout)
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)
    client_id: str = "txnguard-scenario"
    sasl: tuple[str, str] | None = None  # (user, password): SCRAM-SHA-512 on every connection

    def _client(self, host: str, port: int) -> RawClient:
        return RawClient(host, port, client_id=self.client_id, sasl=self.sasl)

    def _coordinator(self) -> RawClient:
        _, host, port = coordinator_for(self.bootstrap, self.transactional_id, key_type=1, sasl=self.sasl)
        return self._client(host, port)

    def _leader(self, topic: str, partition: int) -> RawClient:
        host, _, port = self.bootstrap.split(",")[0].rpartition(":")
        with self._client(host, int(port)) as c:
            md = c.metadata([topic])
        brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in md.brokers}
        for p in md.topics[0].partitions:
            if int(p.partition_index) == partition:
                return self._client(*brokers[int(p.leader_id)])
        raise RuntimeError(f"no leader for {topic}-{partition}")

    # -- the transaction life cycle ----------------------------------------------------------------

    def init(self) -> ProducerIdentity:
        r = _retrying(lambda: self._with_coordinator(
            lambda c: c.init_producer_id(self.transactional_id, self.timeout_ms)), lambda r: r.error_code)
        if r.error_code != ErrorCode.none:
            raise RuntimeError(f"InitProducerId: {r.error_code.name}")
        self.producer = ProducerIdentity(int(r.producer_id), int(r.producer_epoch))
        self.sequences.clear()
        return self.producer

    def add_partitions(self, topic: str, *partitions: int) -> dict[int, int]:
        assert self.producer is not None
        producer = self.producer
        r = _retrying(lambda: self._with_coordinator(
            lambda c: c.add_partitions_to_txn(self.transactional_id, producer, {topic: list(partitions)})),
            lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)
        return {int(p.partition_index): int(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    def add_offsets(self, group: str) -> int:
        assert self.producer is not None
        producer = self.producer
        r = _retrying(lambda: self._with_coordinator(
            lambda c: c.add_offsets_to_txn(self.transactional_id, producer, group)), lambda r: r.error_code)
        return int(r.error_code)

    def end(self, commit: bool) -> int:
        assert self.producer is not None
        producer = self.producer
        r = _retrying(lambda: self._with_coordinator(
            lambda c: c.end_txn(self.transactional_id, producer, commit)), lambda r: r.error_code)
        return int(r.error_code)

    def _with_coordinator(self, call: Callable[[RawClient], Any]) -> Any:
        with self._coordinator() as c:
            return call(c)

    def produce(self, topic: str, partition: int, values: list[bytes], *, sequence: int | None = None,
                timestamp: datetime.datetime | None = None, version: int = 9) -> ProduceResult:
        """A transactional batch; `sequence` replays an old one (a late write) instead of the next."""
        assert self.producer is not None
        tp = (topic, partition)
        seq = self.sequences.get(tp, 0) if sequence is None else sequence
        batch = build_batch(values, producer_id=self.producer.producer_id,
                            producer_epoch=self.producer.producer_epoch, base_sequence=seq, transactional=True,
                            timestamp=timestamp)
        with self._leader(topic, partition) as c:
            r = c.produce({tp: batch}, transactional_id=self.transactional_id, version=version,
                          timeout_ms=self.request_timeout_ms)
        p = r.responses[0].partition_responses[0]
        if p.error_code == ErrorCode.none and sequence is None:
            self.sequences[tp] = seq + len(values)
        return ProduceResult(int(p.error_code), getattr(p, "error_message", None), int(p.base_offset))

    def commit_offsets(self, group: str, offsets: dict[str, dict[int, int]], version: int = 3) -> list[int]:
        assert self.producer is not None
        _, host, port = coordinator_for(self.bootstrap, group, key_type=0, sasl=self.sasl)
        with self._client(host, port) as c:
            r = c.txn_offset_commit(self.transactional_id, self.producer, group, offsets, version=version)
        return [int(p.error_code) for t in r.topics for p in t.partitions]


# What a client retries on transaction requests (coordinator moving or loading, markers in flight).
RETRIABLE = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator,
                       ErrorCode.coordinator_not_available, ErrorCode.concurrent_transactions})


def _retrying(call: Callable[[], Any], code_of: Callable[[Any], int], attempts: int = 100,
              deadline_s: float = 60.0) -> Any:
    """Retry retriable answers, and no answer at all (a request timeout, a closed connection), as
    clients do: each attempt finds the coordinator again. A coordinator that has just come back from
    a freeze can hold a request past the raw client's timeout until it learns it was replaced."""
    end = time.monotonic() + deadline_s
    r: Any = None
    for _ in range(attempts):
        try:
            r = call()
        except OSError:  # TimeoutError and ConnectionError included
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
            continue
        if code_of(r) not in RETRIABLE:
            return r
        time.sleep(0.1)
    return r


def offsets(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset) of a partition, read from its leader."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    with RawClient(host, int(port)) as c:
        md = c.metadata([topic])
    brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in md.brokers}
    leader = next(int(p.leader_id) for p in md.topics[0].partitions if int(p.partition_index) == partition)
    with RawClient(*brokers[leader]) as c:
        return (c.list_offsets(topic, partition, read_committed=False),
                c.list_offsets(topic, partition, read_committed=True))


def wait_stable(bootstrap: str, topic: str, partition: int = 0, deadline_s: float = 10.0) -> None:
    """Wait until the last stable offset reaches the high watermark.

    EndTxn returns before the coordinator's markers reach the partitions; a scenario that
    wants a write *after* the markers (a late write) must wait for them.
    """
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        hw, lso = offsets(bootstrap, topic, partition)
        if hw == lso:
            return
        time.sleep(0.05)
    raise AssertionError(f"{topic}-{partition}: last stable offset still below the high watermark")


def error_name(code: int) -> str:
    return ErrorCode(code).name.upper()



# -- S5 straight to the brokers: offsets no marker will ever end -----------------------------------------

OFFSETS_TOPIC = "__consumer_offsets"
RETRIABLE_COMMIT = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                              ErrorCode.coordinator_not_available})


def offsets_partition(group_id: str, partitions: int = 10) -> int:
    """The __consumer_offsets partition that holds a group's offsets, as Kafka picks it:
    Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions (10 in the harness), where Utils.abs is
    Math.abs with Integer.MIN_VALUE taken to 0, and hashCode is Java's over UTF-16 units (ASCII here)."""
    h = 0
    for ch in group_id:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def commit_offsets_retrying(actor: TxnActor, group: str, offsets_: dict[str, dict[int, int]],
                            attempts: int = 50) -> list[int]:
    """TxnOffsetCommit as clients send it: a group coordinator still loading is asked again."""
    codes = actor.commit_offsets(group, offsets_)
    for _ in range(attempts):
        if not set(codes) & RETRIABLE_COMMIT:
            break
        time.sleep(0.2)
        codes = actor.commit_offsets(group, offsets_)
    return codes


@dataclass(frozen=True)
class PendingOffsets:
    """S5 done straight to the brokers: where the group's offsets partition stopped."""

    group: str
    partition: int  # of __consumer_offsets
    commit_error: int  # the group coordinator's answer to the TxnOffsetCommit
    end_error: int  # the transaction coordinator's answer to EndTxn(commit)
    before: int  # the partition's high watermark before the commit
    high_watermark: int
    last_stable: int

    @property
    def hangs(self) -> bool:
        """The last stable offset stopped at the offsets' batch (or before it), below the high watermark."""
        return self.before <= self.last_stable < self.high_watermark


def s5_offsets_never_ended(actor: TxnActor, topic: str, group_name: Callable[[], str]) -> PendingOffsets:
    """S5 without a proxy: with `topic`-0 added to the actor's transaction, TxnOffsetCommit for a group never
    added (no AddOffsetsToTxn), then EndTxn(commit).

    A broker without KIP-890 takes the offsets into the producer's transaction (its group coordinator
    appends them as a transactional batch to the group's __consumer_offsets partition), but the
    transaction coordinator never learned that partition, so no marker ever ends the batch: the
    partition's last stable offset stops below its high watermark and the group's offsets never
    become visible. The group is one whose offsets partition has no open transaction before (names from
    `group_name` are tried), so the stop is this batch's. `release_pending_offsets` ends it afterwards.
    """
    assert actor.producer is not None
    for _ in range(30):
        group = group_name()
        partition = offsets_partition(group)
        hw, lso = offsets(actor.bootstrap, OFFSETS_TOPIC, partition)
        if hw == lso:
            break
    else:
        raise AssertionError("every __consumer_offsets partition tried has an open transaction")
    (commit_error,) = commit_offsets_retrying(actor, group, {topic: {0: 1}})
    end_error = actor.end(commit=True)
    # The commit is complete once its marker is on the partition that was added; none is coming for the group's.
    wait_stable(actor.bootstrap, topic)
    after_hw, after_lso = offsets(actor.bootstrap, OFFSETS_TOPIC, partition)
    return PendingOffsets(group, partition, commit_error, end_error, hw, after_hw, after_lso)


def release_pending_offsets(actor: TxnActor, pending: PendingOffsets) -> None:
    """End what S5 left open: the same producer adds the group to a transaction and aborts it, so the
    coordinator writes an abort marker to that partition (the shared cluster's offsets partition is
    stable again, and the group's pending offsets are dropped)."""
    assert actor.add_offsets(pending.group) == ErrorCode.none
    assert actor.end(commit=False) == ErrorCode.none
    wait_stable(actor.bootstrap, OFFSETS_TOPIC, pending.partition)

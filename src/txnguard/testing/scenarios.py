"""Transactional request sequences with the raw client, the way old clients produce them by accident.

`TxnActor` speaks to whatever bootstrap it is given (a broker or a txnguard
proxy) and routes each request where a client would: transaction requests to
the coordinator FindCoordinator names, Produce to the leader Metadata names.
So the same scenario runs directly against brokers and through the proxy.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

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
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)
    client_id: str = "txnguard-scenario"

    def _client(self, host: str, port: int) -> RawClient:
        return RawClient(host, port, client_id=self.client_id)

    def _coordinator(self) -> RawClient:
        _, host, port = coordinator_for(self.bootstrap, self.transactional_id, key_type=1)
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
        with self._coordinator() as c:
            r = c.init_producer_id(self.transactional_id, self.timeout_ms)
        if r.error_code != ErrorCode.none:
            raise RuntimeError(f"InitProducerId: {r.error_code.name}")
        self.producer = ProducerIdentity(int(r.producer_id), int(r.producer_epoch))
        self.sequences.clear()
        return self.producer

    def add_partitions(self, topic: str, *partitions: int) -> dict[int, int]:
        assert self.producer is not None
        with self._coordinator() as c:
            r = c.add_partitions_to_txn(self.transactional_id, self.producer, {topic: list(partitions)})
        return {int(p.partition_index): int(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    def add_offsets(self, group: str) -> int:
        assert self.producer is not None
        with self._coordinator() as c:
            return int(c.add_offsets_to_txn(self.transactional_id, self.producer, group).error_code)

    def end(self, commit: bool) -> int:
        assert self.producer is not None
        with self._coordinator() as c:
            return int(c.end_txn(self.transactional_id, self.producer, commit).error_code)

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
            r = c.produce({tp: batch}, transactional_id=self.transactional_id, version=version)
        p = r.responses[0].partition_responses[0]
        if p.error_code == ErrorCode.none and sequence is None:
            self.sequences[tp] = seq + len(values)
        return ProduceResult(int(p.error_code), getattr(p, "error_message", None), int(p.base_offset))

    def commit_offsets(self, group: str, offsets: dict[str, dict[int, int]], version: int = 3) -> list[int]:
        assert self.producer is not None
        _, host, port = coordinator_for(self.bootstrap, group, key_type=0)
        with self._client(host, port) as c:
            r = c.txn_offset_commit(self.transactional_id, self.producer, group, offsets, version=version)
        return [int(p.error_code) for t in r.topics for p in t.partitions]


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


def error_name(code: int) -> str:
    return ErrorCode(code).name.upper()


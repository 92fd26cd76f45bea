"""Produce and TxnOffsetCommit bodies as the verification sees them, and their partial rejection.

When some partitions of a Produce fail verification, the proxy forwards a
request without them and merges the broker's answer with its own rejections,
in the request's order; when all fail, it answers alone. Each rejected
partition looks exactly as a broker shapes it: base offset -1, log start
offset -1, and on v8+ an error message.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.batches import BatchHead, batch_heads
from txnguard.codecs.errors import DecodeFailed
from txnguard.codecs.schemas import response_schema
from txnguard.codecs.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class Rejection:
    error_code: int
    message: str | None


@dataclass(frozen=True, slots=True)
class ProducePartition:
    topic: str
    partition: int
    heads: list[BatchHead]
    invalid: str | None = None  # why its record batches cannot be read (the broker answers INVALID_RECORD)

    @property
    def transactional_heads(self) -> list[BatchHead]:
        return [h for h in self.heads if h.transactional and h.producer_id >= 0]


def produce_partitions(body: Any) -> list[ProducePartition]:
    return [partition_of(str(t.name), int(p.index), p.records) for t in body.topic_data for p in t.partition_data]


def partition_of(topic: str, index: int, records: bytes | memoryview | None) -> ProducePartition:
    try:
        return ProducePartition(topic, index, batch_heads(records))
    except DecodeFailed as e:
        # One partition's broken batch costs that partition, as on the broker, not the connection.
        return ProducePartition(topic, index, [], invalid=str(e))


def without_partitions(body: Any, rejected: Mapping[TopicPartition, Rejection]) -> Any:
    """The request minus the rejected partitions (topics left empty disappear)."""
    topics = []
    for t in body.topic_data:
        kept = tuple(p for p in t.partition_data if (str(t.name), int(p.index)) not in rejected)
        if kept:
            topics.append(dataclasses.replace(t, partition_data=kept))
    return dataclasses.replace(body, topic_data=tuple(topics))


def _response_module(api_key: int, version: int) -> Any:
    return sys.modules[response_schema(api_key, version).__module__]


def _rejected_partition(m: Any, version: int, index: int, r: Rejection) -> Any:
    kw: dict[str, Any] = {"index": index, "error_code": ErrorCode(r.error_code), "base_offset": -1}
    if version >= 8:
        kw["record_errors"] = ()
        kw["error_message"] = r.message
    return m.PartitionProduceResponse(**kw)


def merged_produce_response(
    request: Any, version: int, broker: Any | None, rejected: Mapping[TopicPartition, Rejection]
) -> Any:
    """One ProduceResponse in request order: the broker's answers plus the proxy's rejections."""
    m = _response_module(ApiKey.PRODUCE, version)
    answered: dict[TopicPartition, Any] = {}
    if broker is not None:
        for t in broker.responses:
            for p in t.partition_responses:
                answered[(str(t.name), int(p.index))] = p
    topics = []
    for t in request.topic_data:
        parts = []
        for p in t.partition_data:
            tp = (str(t.name), int(p.index))
            parts.append(_rejected_partition(m, version, int(p.index), rejected[tp]) if tp in rejected
                         else answered[tp])
        topics.append(m.TopicProduceResponse(name=t.name, partition_responses=tuple(parts)))
    kw: dict[str, Any] = {"responses": tuple(topics)}
    if broker is not None:
        kw["throttle_time"] = broker.throttle_time
        if version >= 10:
            kw["node_endpoints"] = broker.node_endpoints
    return m.ProduceResponse(**kw)


def txn_offset_commit_rejection(request: Any, version: int, error_code: int) -> Any:
    """The same error on every partition of the request, as the group coordinator answers."""
    m = _response_module(ApiKey.TXN_OFFSET_COMMIT, version)
    import datetime

    return m.TxnOffsetCommitResponse(
        throttle_time=datetime.timedelta(0),
        topics=tuple(
            m.TxnOffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.TxnOffsetCommitResponsePartition(partition_index=p.partition_index,
                                                       error_code=ErrorCode(error_code))
                    for p in t.partitions
                ),
            )
            for t in request.topics
        ),
    )

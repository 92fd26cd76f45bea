"""Fetch v12 answers as a broker writes them (encoded with kio), for tests of the log follower.

The follower packs its Fetch by hand and reads the answer's bytes in place (codecs/log_fetch.py); a test's fake
leader answers in plain values, and `FetchesAsBytes` turns its request and answer into the bytes the follower
sends and reads, so the follower's own reader runs in the test, not a stand-in for it."""

from __future__ import annotations

import asyncio
import datetime
import io
from collections.abc import Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as fetch_v12
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import Records, i32, i32Timedelta, i64

from txnguard.codecs import schemas
from txnguard.codecs.transaction_log import TOPIC


def fetch_answer(correlation_id: int, partitions: Iterable[Any], topic: str = TOPIC) -> bytes:
    """The answer's frame without its length prefix. Each of `partitions` has partition_index, error_code,
    high_watermark, log_start_offset and records (bytes or None)."""
    answer = fetch_v12.FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)), error_code=ErrorCode.none, session_id=i32(0),
        responses=(fetch_v12.FetchableTopicResponse(topic=TopicName(topic), partitions=tuple(
            fetch_v12.PartitionData(
                partition_index=i32(int(p.partition_index)), error_code=ErrorCode(int(p.error_code)),
                high_watermark=i64(int(p.high_watermark)), last_stable_offset=i64(int(p.high_watermark)),
                log_start_offset=i64(int(p.log_start_offset)),
                diverging_epoch=fetch_v12.EpochEndOffset(epoch=i32(-1), end_offset=i64(-1)),
                current_leader=fetch_v12.LeaderIdAndEpoch(leader_id=BrokerId(-1), leader_epoch=i32(-1)),
                snapshot_id=fetch_v12.SnapshotId(end_offset=i64(-1), epoch=i32(-1)),
                aborted_transactions=None, preferred_read_replica=BrokerId(-1),
                records=None if p.records is None else Records(bytes(p.records)))
            for p in partitions)),))
    buf = io.BytesIO()
    entity_writer(ResponseHeader)(buf, ResponseHeader(correlation_id=i32(correlation_id)))
    entity_writer(fetch_v12.FetchResponse)(buf, answer)
    return buf.getvalue()


_SENT: set[asyncio.Task[None]] = set()


class FetchesAsBytes:
    """Mixed into a fake broker connection whose `request(payload, timeout)` answers a FetchRequest with an object
    of `responses[].partitions[]`: the follower's hand-packed Fetch is decoded with kio for it, and its answer
    encoded back into the bytes a broker would send."""

    async def request(self, payload: Any, timeout: float) -> Any:
        raise NotImplementedError

    def ready(self, address: Any) -> Any:
        """As `BrokerConnections.ready`: these fakes are their own (always open) connection."""
        return self

    async def get(self, address: Any) -> Any:
        """As `BrokerConnections.get`: the fake itself, whatever the address."""
        return self

    def drop(self, address: Any) -> None:
        """As `BrokerConnections.drop`: nothing to drop."""

    def close(self) -> None:
        """As `BrokerConnections.close`: nothing to close."""

    is_open = True

    async def request_encoded(self, api_key: int, version: int, encode: Callable[[int], bytes],
                              timeout: float = 10.0) -> memoryview:
        _, payload = schemas.decode_request(memoryview(encode(1))[4:])
        answer = await self.request(payload, timeout)
        return memoryview(fetch_answer(1, [p for t in answer.responses for p in t.partitions]))

    def send_encoded(self, api_key: int, version: int, encode: Callable[[int], bytes], timeout: float,
                     handler: Callable[[memoryview | None, Exception | None], None]) -> None:
        """As `BrokerConnection.send_encoded` with a callback: `request_encoded`'s answer or error, to `handler`."""
        async def answer() -> None:
            try:
                body = await self.request_encoded(api_key, version, encode, timeout)
            except Exception as e:  # noqa: BLE001 - to the handler, as the connection hands it its errors
                handler(None, e)
                return
            handler(body, None)

        task = asyncio.get_running_loop().create_task(answer())
        _SENT.add(task)  # held until done (the loop keeps only weak references to tasks)
        task.add_done_callback(_SENT.discard)

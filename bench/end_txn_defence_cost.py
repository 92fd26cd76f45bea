"""What does the KAFKA-17754 defence cost on the normal path? The connection core alone, defence on vs off.

Run: `.venv/bin/python bench/end_txn_defence_cost.py [--transactions 20000] [--rounds 5]`

One connection core (no sockets, no event loop) plays a client's transactions as the broker would answer
them: AddPartitionsToTxn (2 partitions) and its answer, one transactional Produce per partition (local
evidence) and its answer, EndTxn(COMMIT) and its answer. Each EndTxn is answered before the next
transaction starts, as every client does, so nothing is ever held: what is measured is the book-keeping
(an EndTxn written down and crossed out, a lookup per AddPartitionsToTxn). Rounds alternate on and off;
prints microseconds per transaction for each and the ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from typing import Any

from core_harness import DirectCluster
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection.core import Connection, Settings
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.guard import SystemClock
from txnguard.testing.raw import build_batch
from txnguard.verification.decisions import TransactionRules
from txnguard.verification.in_doubt import EndTxnLedger
from txnguard.verification.registry import Registry

TXN, PID, EPOCH, TOPIC = "bench", 7, 0, "orders"
PARTS = ((TOPIC, 0), (TOPIC, 1))


def _mod(cls: Any) -> Any:
    import sys
    return sys.modules[cls.__module__]


def _request(payload: Any, cid: int) -> bytes:
    return schemas.encode_request(payload, cid, "bench")


def _response(key: int, version: int, cid: int, body: Any) -> bytes:
    return schemas.encode(schemas.response_header_for(key, version, cid), body)


def frames() -> list[tuple[bytes, bytes]]:
    """One transaction: (request, response) pairs with correlation ids 1..4."""
    ap = _mod(schemas.request_schema(ApiKey.ADD_PARTITIONS_TO_TXN, 3))
    apr = _mod(schemas.response_schema(ApiKey.ADD_PARTITIONS_TO_TXN, 3))
    add = _request(ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TXN, v3_and_below_producer_id=i64(PID), v3_and_below_producer_epoch=i16(EPOCH),
        v3_and_below_topics=(ap.AddPartitionsToTxnTopic(name=TOPIC, partitions=(i32(0), i32(1))),)), 1)
    add_r = _response(ApiKey.ADD_PARTITIONS_TO_TXN, 3, 1, apr.AddPartitionsToTxnResponse(
        throttle_time=datetime.timedelta(0), results_by_topic_v3_and_below=(apr.AddPartitionsToTxnTopicResult(
            name=TOPIC, results_by_partition=tuple(apr.AddPartitionsToTxnPartitionResult(
                partition_index=i32(p), partition_error_code=ErrorCode.none) for p in (0, 1))),)))
    pm = _mod(schemas.request_schema(ApiKey.PRODUCE, 9))
    pr = _mod(schemas.response_schema(ApiKey.PRODUCE, 9))
    out = [(add, add_r)]
    for cid, (topic, p) in enumerate(PARTS, start=2):
        batch = build_batch([b"v" * 100], producer_id=PID, producer_epoch=EPOCH, base_sequence=0, transactional=True,
                            timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
        req = _request(pm.ProduceRequest(transactional_id=TXN, acks=i16(-1), timeout=datetime.timedelta(seconds=30),
                                         topic_data=(pm.TopicProduceData(name=topic, partition_data=(
                                             pm.PartitionProduceData(index=i32(p), records=batch),)),)), cid)
        resp = _response(ApiKey.PRODUCE, 9, cid, pr.ProduceResponse(responses=(pr.TopicProduceResponse(
            name=topic, partition_responses=(pr.PartitionProduceResponse(
                index=i32(p), error_code=ErrorCode.none, base_offset=i64(0), log_append_time=None,
                log_start_offset=i64(0), record_errors=(), error_message=None),)),),
            throttle_time=datetime.timedelta(0)))
        out.append((req, resp))
    em = _mod(schemas.request_schema(ApiKey.END_TXN, 3))
    er = _mod(schemas.response_schema(ApiKey.END_TXN, 3))
    out.append((_request(em.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID), producer_epoch=i16(EPOCH),
                                          committed=True), 4),
                _response(ApiKey.END_TXN, 3, 4, er.EndTxnResponse(throttle_time=datetime.timedelta(0),
                                                                  error_code=ErrorCode.none))))
    return out


def run(defence: bool, transactions: int, pairs: list[tuple[bytes, bytes]]) -> float:
    """Seconds of thread CPU per transaction."""
    registry = Registry()
    registry.init_producer_id(TXN, PID, EPOCH, 60_000, int(time.time() * 1000))
    rules = TransactionRules(registry, policy_from_config({}), in_doubt=EndTxnLedger() if defence else None)
    conn = Connection(Settings(connection_id=1, listener="b", max_frame_bytes=1 << 20, pre_auth_max_frame_bytes=None,
                               max_in_flight=100, partial_frame_timeout_s=30.0, idle_timeout_s=600.0),
                      rules, DirectCluster(), SystemClock())
    started = time.thread_time()
    for _ in range(transactions):
        for req, resp in pairs:
            conn.receive_from_client(req)
            conn.receive_from_broker(resp)
    assert not conn.closed and conn.in_flight == 0
    return (time.thread_time() - started) / transactions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    pairs = frames()
    results: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.rounds):
        for defence in ((False, True) if i % 2 == 0 else (True, False)):
            results[defence].append(run(defence, args.transactions, pairs))
    off, on = statistics.median(results[False]) * 1e6, statistics.median(results[True]) * 1e6
    print(f"{args.transactions} transactions x {args.rounds} rounds (AddPartitionsToTxn, 2 Produce, EndTxn), "
          "thread CPU, median of rounds:")
    print(f"  defence off: {off:.1f} us per transaction")
    print(f"  defence on:  {on:.1f} us per transaction")
    print(f"  on / off:    {on / off:.3f}")


if __name__ == "__main__":
    main()

"""Why the connection core costs several times more live than in a warm loop: its fast path, warm and with the
CPU caches evicted before every call, side by side in one run.

Run: `.venv/bin/python bench/cold_cache.py [--transactions 600] [--rounds 5] [--evict-mib 16]`

One connection core (the gateway's rules, local evidence) plays a one-record transaction loop as the shell
calls it: per transaction an AddPartitionsToTxn and its answer, a transactional Produce v9 of one 512-byte
record and its answer, an EndTxn and its answer, each through `relay_requests` / `relay_responses` (all six
take the fast path). "warm" times the calls back to back; "cold" first writes one byte every 64 of an
`--evict-mib` buffer before each call, which pushes the interpreter's code and objects out of the caches, as
the brokers' and clients' JVMs sharing this machine's two cores do between a proxy's reads. Prints the median
thread CPU per call and per transaction, and the cold/warm ratio; nothing is asserted.

Live, under a one-record transaction loop (confluent-kafka, 1,000 transactions, thread CPU accounted around
the shell's callbacks; measured before the in-place readers' fixed-offset branches), `relay_from_client` cost
~96 us a call and `relay_from_broker` ~62 us: between the two figures this prints, nearer the cold one.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from typing import Any

from core_harness import DirectCluster
from core_txn_produce import EPOCH, PID, TOPIC, TXN, pair
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection.core import Connection, Settings
from txnguard.connection.relay import relay_requests, relay_responses
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import SystemClock, TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.in_doubt import PythonEndTxnLedger
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.registry import PythonRegistry


def _module(schema: type) -> Any:
    return sys.modules[schema.__module__]


def _lifecycle(cid: int) -> list[tuple[bytes, bytes]]:
    """AddPartitionsToTxn v3, Produce v9, EndTxn v3 and their answers: one transaction's six frames."""
    add_key = ApiKey.ADD_PARTITIONS_TO_TXN
    aq, ar = _module(schemas.request_schema(add_key, 3)), _module(schemas.response_schema(add_key, 3))
    add = schemas.encode_request(aq.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TXN, v3_and_below_producer_id=i64(PID), v3_and_below_producer_epoch=i16(EPOCH),
        v3_and_below_topics=(aq.AddPartitionsToTxnTopic(name=TOPIC, partitions=(i32(0),)),)), cid, "bench")
    added = schemas.encode(schemas.response_header_for(ApiKey.ADD_PARTITIONS_TO_TXN, 3, cid),
                           ar.AddPartitionsToTxnResponse(
        throttle_time=datetime.timedelta(0), results_by_topic_v3_and_below=(ar.AddPartitionsToTxnTopicResult(
            name=TOPIC, results_by_partition=(ar.AddPartitionsToTxnPartitionResult(
                partition_index=i32(0), partition_error_code=ErrorCode.none),)),)))
    eq, er = _module(schemas.request_schema(ApiKey.END_TXN, 3)), _module(schemas.response_schema(ApiKey.END_TXN, 3))
    end = schemas.encode_request(eq.EndTxnRequest(transactional_id=TXN, producer_id=i64(PID),
                                                  producer_epoch=i16(EPOCH), committed=True), cid + 2, "bench")
    ended = schemas.encode(schemas.response_header_for(ApiKey.END_TXN, 3, cid + 2),
                           er.EndTxnResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none))
    return [(add, added), pair(cid + 1, 1), (end, ended)]


def _nothing(conn: Connection, frame: bytes) -> int:
    return len(frame)


def run(transactions: int, evict: bytearray | None, python_registry: bool = False,
        python_ledger: bool = False) -> list[float]:
    """Thread CPU seconds of each of the six calls of a transaction, summed over `transactions`; the seventh: the
    measuring's own cost, a call that does nothing timed the same way (`time.thread_time` is a system call)."""
    metrics = ProxyMetrics()
    guard = TransactionGuard(ProxyConfig(upstream=(HostPort("127.0.0.1", 9),)), metrics, policy_from_config({}), None)
    if python_registry:  # the registry where the native module is missing, in place of the native one
        guard.registry = guard.rules.registry = PythonRegistry(guard.registry.limits)
    if python_ledger:  # the EndTxn ledger where the native module is missing, in place of the native one
        guard.in_doubt = guard.rules.in_doubt = PythonEndTxnLedger(guard.in_doubt.limits, guard._in_doubt_ended)
    now = int(time.time() * 1000)
    guard.registry.init_producer_id(TXN, PID, EPOCH, 60_000, now)
    guard.registry.added(TXN, PID, EPOCH, now, partitions={(TOPIC, 0)})  # the first write passes locally too
    conn = Connection(Settings(connection_id=1, listener="b", max_frame_bytes=1 << 20, pre_auth_max_frame_bytes=None,
                               max_in_flight=100, partial_frame_timeout_s=30.0, idle_timeout_s=600.0),
                      guard.rules, DirectCluster(), SystemClock(), metrics.traffic, ConnectionInventory("c", now))
    first, answer = pair(0, 1)  # the first request names the client (the general path)
    conn.receive_from_client(first)
    conn.receive_from_broker(answer)
    sums = [0.0] * 7
    zeros = bytes(len(evict) // 64) if evict is not None else b""
    frames = [_lifecycle(3 + 3 * t) for t in range(transactions)]  # built first: kio's encoder is not timed
    for transaction in frames:
        for i, (request, response) in enumerate(transaction):
            for j, (call, frame) in enumerate(((relay_requests, request), (relay_responses, response))):
                if evict is not None:
                    evict[::64] = zeros
                started = time.thread_time()
                done = call(conn, frame)  # as the shell calls them (proxy/session.py)
                sums[2 * i + j] += time.thread_time() - started
                assert done == len(frame), f"call {2 * i + j} left the fast path"
            if evict is not None:
                evict[::64] = zeros
            started = time.thread_time()
            _nothing(conn, request)
            # One empty call per request and answer pair: the mean of three, so that sums[6] / transactions is the
            # floor of one call, as sums[0..5] / transactions is each call's cost.
            sums[6] += (time.thread_time() - started) / len(transaction)
        conn.ledger.take()  # the shell's recording is not timed here
    assert not conn.closed and conn.in_flight == 0
    return sums


CALLS = ("AddPartitionsToTxn", "its answer", "Produce", "its answer", "EndTxn", "its answer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--evict-mib", type=int, default=16)
    ap.add_argument("--python-registry", action="store_true",
                    help="the Python registry (verification/registry.py's PythonRegistry) instead of the native one")
    ap.add_argument("--python-ledger", action="store_true",
                    help="the Python EndTxn ledger (verification/in_doubt.py's PythonEndTxnLedger) instead of the "
                         "native one")
    args = ap.parse_args()
    evict = bytearray(args.evict_mib << 20)
    results: dict[str, list[list[float]]] = {"warm": [], "cold": []}
    for _ in range(args.rounds):  # the two kinds alternate, so drift on the machine hits both
        results["warm"].append(run(args.transactions, None, args.python_registry, args.python_ledger))
        results["cold"].append(run(args.transactions, evict, args.python_registry, args.python_ledger))
    print(f"one-record transactions through the core's fast path ({'Python' if args.python_registry else 'native'} "
          f"registry, {'Python' if args.python_ledger else 'native'} EndTxn ledger), {args.transactions} x "
          f"{args.rounds} rounds, "
          f"thread CPU per call (us), median of rounds; cold: {args.evict_mib} MiB written before each call")
    per_txn = {}
    for kind, rounds in results.items():
        per_call = [statistics.median(r[k] for r in rounds) / args.transactions * 1e6 for k in range(7)]
        floor = per_call[6]
        per_txn[kind] = statistics.median(sum(r[:6]) for r in rounds) / args.transactions * 1e6
        print(f"  {kind}  " + "  ".join(f"{name} {us:6.1f}" for name, us in zip(CALLS, per_call, strict=False))
              + f"  | per transaction {per_txn[kind]:7.1f}")
        print(f"  {kind}  net of the measuring's own cost ({floor:.2f} us a call: an empty call timed alike): "
              + "  ".join(f"{name} {us - floor:6.1f}" for name, us in zip(CALLS, per_call, strict=False)))
    print(f"  cold/warm per transaction: x{per_txn['cold'] / per_txn['warm']:.2f}")


if __name__ == "__main__":
    main()

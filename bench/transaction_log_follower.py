"""What following the coordinator's log costs: memory per transactional id, time to read it, catch-up from Kafka.

Run: `.venv/bin/python bench/transaction_log_follower.py [--ids 100000] [--kafka]`

* pure: the view fed `--ids` ids, each with the records a transaction leaves (InitProducerId's Empty, an
  AddPartitionsToTxn's Ongoing with two partitions, the EndTxn's PrepareCommit and CompleteCommit), as the
  coordinator writes them (txnguard.testing.transaction_log_writer); prints the records read per second and the
  view's memory (tracemalloc, after the records are gone) per id;
* `--race N`: a 1-node Kafka 3.5.2 and a gateway following its log; N transactions ended directly at the
  broker (EndTxn answered), and for each the time until the follower's view shows it ended (PrepareCommit
  or later): the window in which a late write would still pass on the log. Beside it, one DescribeTransactions
  round trip to the same broker (what the coordinator's answer costs, and its own answer-to-append window);
* `--kafka`: a 1-node Kafka 3.5.2, `--ids` InitProducerId requests (each one record in __transaction_state),
  then a gateway started on it: the time from its start to /readyz 200 (the follower read the log once) and
  the ids it holds.

Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

from txnguard.codecs.transaction_log import LogRecord, TxnLogValue
from txnguard.testing import kafka
from txnguard.testing.bounce import free_port
from txnguard.testing.proxy import ProxyThread
from txnguard.testing.transaction_log_writer import key, value
from txnguard.verification.transaction_log_view import TransactionLogView


def pure(ids: int) -> None:
    states = [("Empty", frozenset()), ("Ongoing", frozenset({("orders", 1), ("payments", 7)})),
              ("PrepareCommit", frozenset({("orders", 1), ("payments", 7)})), ("CompleteCommit", frozenset())]
    records = []
    for i in range(ids):
        k = key(f"app-{i:08d}")
        for n, (state, parts) in enumerate(states):
            v = TxnLogValue(1000 + i, 0, 60_000, state, parts, 1_700_000_000_000 + n, 1_700_000_000_000)
            records.append((i % 50, LogRecord(i * 4 + n, k, value(v))))
    gc.collect()
    view = TransactionLogView()
    started = time.perf_counter()
    for partition, record in records:
        view.apply(partition, record)
    elapsed = time.perf_counter() - started
    # Memory in a second pass: tracemalloc slows every allocation down, so it stays out of the timing.
    del view
    gc.collect()
    tracemalloc.start()
    view = TransactionLogView()
    for partition, record in records:
        view.apply(partition, record)
    del records
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"pure: {ids} ids, {ids * 4} records read in {elapsed:.2f} s ({ids * 4 / elapsed:,.0f} records/s); "
          f"the view holds {len(view)} ids in {current / 2**20:.1f} MiB ({current / ids:.0f} bytes per id)")


async def _init_ids(bootstrap: str, ids: int) -> None:
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i16, i32Timedelta

    from txnguard.proxy.kafka_client import BrokerConnection

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    conn = await BrokerConnection.open(host, int(port), timeout=10)
    await conn.learn_api_versions(10)
    import datetime

    timeout = i32Timedelta.parse(datetime.timedelta(seconds=60))
    for start in range(0, ids, 500):
        await asyncio.gather(*(conn.request(InitProducerIdRequest(
            transactional_id=TransactionalId(f"bench-{i:08d}"), transaction_timeout=timeout,
            producer_id=ProducerId(-1), producer_epoch=i16(-1)), 60) for i in range(start, min(start + 500, ids))))
    conn.close()


def with_kafka(ids: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="txnguard-logbench-"))
    cluster = kafka.up("3.5.2", 1, tmp / "kafka")
    try:
        started = time.perf_counter()
        asyncio.run(_init_ids(cluster.bootstrap_servers, ids))
        print(f"kafka: {ids} InitProducerId in {time.perf_counter() - started:.1f} s")
        admin = free_port()
        started = time.perf_counter()
        proxy = ProxyThread.from_settings(mode="gateway", upstream=cluster.bootstrap_servers,
                                          admin=f"127.0.0.1:{admin}", log_level="warning").start()
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.HTTPError, OSError):
                    pass
                time.sleep(0.05)
            ready = time.perf_counter() - started
            print(f"kafka: a gateway started on it was ready (the log read once) after {ready:.1f} s, holding "
                  f"{proxy.metric('txnguard_transaction_log_transactional_ids'):.0f} ids, "
                  f"{proxy.metric('txnguard_transaction_log_records_total', {'outcome': 'state'}):.0f} records read")
        finally:
            proxy.stop()
    finally:
        cluster.down()


def race(transactions: int) -> None:
    from txnguard.testing.fixtures import fresh_topic
    from txnguard.testing.raw import RawClient, coordinator_for
    from txnguard.testing.scenarios import TxnActor

    tmp = Path(tempfile.mkdtemp(prefix="txnguard-racebench-"))
    cluster = kafka.up("3.5.2", 1, tmp / "kafka")
    proxy = ProxyThread.from_settings(mode="gateway", upstream=cluster.bootstrap_servers, log_level="warning").start()
    try:
        follower = proxy.proxy.guard.follower if proxy.proxy else None
        assert follower is not None
        topic = fresh_topic(cluster, "race")
        lags: list[float] = []
        round_trips: list[float] = []
        for i in range(transactions):
            actor = TxnActor(cluster.bootstrap_servers, f"race-{i}")
            actor.init()
            actor.add_partitions(topic, 0)
            actor.produce(topic, 0, [b"x"])
            assert actor.end(commit=True) == 0
            answered = time.perf_counter()
            while True:
                desc = follower.view.describe(actor.transactional_id)
                if desc is not None and desc.state != "Ongoing":
                    break
                time.sleep(0.0002)
            lags.append((time.perf_counter() - answered) * 1000)
            _, host, port = coordinator_for(cluster.bootstrap_servers, actor.transactional_id, key_type=1)
            with RawClient(host, port) as c:
                started = time.perf_counter()
                c.describe_transactions(actor.transactional_id)
                round_trips.append((time.perf_counter() - started) * 1000)
        lags.sort()
        round_trips.sort()

        def q(v: list[float], x: float) -> float:
            return v[min(len(v) - 1, int(x * len(v)))]

        print(f"race: {transactions} transactions; EndTxn answered -> the follower's view shows it ended: "
              f"p50 {q(lags, 0.5):.2f} ms, p99 {q(lags, 0.99):.2f} ms, max {lags[-1]:.2f} ms; one DescribeTransactions "
              f"round trip: p50 {q(round_trips, 0.5):.2f} ms, p99 {q(round_trips, 0.99):.2f} ms")
    finally:
        proxy.stop()
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--kafka", action="store_true", help="also catch up from a real Kafka 3.5.2")
    parser.add_argument("--race", type=int, default=0, help="measure the follower's lag over this many transactions")
    parser.add_argument("--no-pure", action="store_true")
    args = parser.parse_args()
    if args.race:
        race(args.race)
    if not args.no_pure:
        pure(args.ids)
    if args.kafka:
        with_kafka(args.ids)


if __name__ == "__main__":
    main()

"""Client-side reproductions of known client bugs that our scenarios must route around.

librdkafka #5511 / #5456 (open in 2.16.0, the version confluent-kafka 2.16.1 bundles):
`send_offsets_to_transaction()` blocks forever, ignoring its timeout, when the broker cached as
the group's coordinator has left the Metadata (librdkafka >= 2.10 then "decommissions" its
broker thread, and the coordinator lookup waits for a state change of a thread that is gone).
A SIGKILLed broker leaves the Metadata about 9 s later (KRaft fences it), so an exactly-once
loop whose group coordinator is killed can hang, with or without a proxy in between.

The client runs in its own process: a stuck librdkafka handle cannot be closed, only abandoned.

    python -m txnguard.testing.client_bugs --bootstrap B --group G --transactional-id T \\
        --source S --sink K --coordinator H:P
    child:  consume S in G; transaction 1 with send_offsets (caches G's coordinator X) → prints READY
    parent: SIGKILL X, wait until X is out of the Metadata → writes GO
    child:  Metadata refresh, transaction 2, send_offsets_to_transaction(timeout 10 s)
            → prints {"returned": false, "waited_s": 30} when it is still blocked after 30 s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

SEND_OFFSETS_TIMEOUT_S = 10.0
WAIT_S = 30.0  # three times the call's own timeout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--bootstrap", "--group", "--transactional-id", "--source", "--sink", "--coordinator"):
        ap.add_argument(name, required=True)
    args = ap.parse_args()
    try:
        print(json.dumps(_reproduce(args)), flush=True)
    finally:
        os._exit(0)  # a hung librdkafka thread would block a normal exit


def _reproduce(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer

    from txnguard.testing.raw import RawClient

    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.subscribe([args.source])
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.5)
    for _ in range(20):
        consumer.poll(0.1)
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id})
    producer.init_transactions(30)

    def send_offsets(timeout_s: float) -> None:
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), timeout_s)

    producer.begin_transaction()
    producer.produce(args.sink, value=b"first", partition=0)
    producer.flush(30)
    send_offsets(30)
    producer.commit_transaction(30)
    # Let the markers land before the parent kills a broker (a transaction left in PrepareCommit
    # would fail the next one with CONCURRENT_TRANSACTIONS: another effect than the one shown here).
    host, _, port = args.coordinator.rpartition(":")
    for _ in range(100):
        with RawClient(host, int(port)) as c:
            if c.describe_transactions(args.transactional_id).transaction_states[0].transaction_state == \
                    "CompleteCommit":
                break
        time.sleep(0.1)
    print("READY", flush=True)
    sys.stdin.readline()  # GO: the group coordinator is dead and out of the Metadata

    producer.list_topics(timeout=10)  # the Metadata without it: librdkafka decommissions the broker
    producer.begin_transaction()
    producer.produce(args.sink, value=b"second", partition=0)
    producer.flush(30)
    outcome: dict[str, Any] = {}

    def call() -> None:
        started = time.monotonic()
        try:
            send_offsets(SEND_OFFSETS_TIMEOUT_S)
            outcome["result"] = "ok"
        except Exception as e:  # noqa: BLE001 - any return at all is the news
            outcome["result"] = repr(e)
        outcome["after_s"] = round(time.monotonic() - started, 2)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(WAIT_S)
    return {"returned": not worker.is_alive(), "waited_s": WAIT_S, "timeout_s": SEND_OFFSETS_TIMEOUT_S, **outcome}


if __name__ == "__main__":
    main()

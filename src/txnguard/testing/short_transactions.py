"""Short-transaction loops per client family, and a tap that counts what the client was told.

Issue 11 (KIP-609 idea): one record to one partition per transaction, as fast as the
client goes, is where CONCURRENT_TRANSACTIONS costs most: every transaction's first
AddPartitionsToTxn can meet the previous transaction's markers still being written.

Every loop runs in a process of its own (the Java client through our
`testing/java/ShortTransactions.java`, compiled once per version, the Python clients through
`python -m txnguard.testing.short_transactions`), so a proxy or tap in the test's
process never shares an interpreter lock with the client it measures. Each prints
one JSON line: {"transactions": N, "seconds": S}.

The tap is a FaultRelay with no fault, on the port the broker advertises (the
sidecar layout): clients reach the broker or the proxy through it, and it counts the
AddPartitionsToTxn/AddOffsetsToTxn answers that carried CONCURRENT_TRANSACTIONS to the
client, the same way direct and proxied.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import java_programs
from txnguard.testing.faults import Direction, FaultRelay

CONCURRENT_TRANSACTIONS = 51
ADD_PARTITIONS, ADD_OFFSETS = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN
FAMILIES = ("java-3.5.2", "confluent-kafka", "kafka-python")


@dataclass(frozen=True)
class LoopResult:
    family: str
    transactions: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.transactions / self.seconds if self.seconds > 0 else 0.0


def loop_command(family: str, bootstrap: str, topic: str, transactional_id: str, transactions: int) -> list[str]:
    args = [bootstrap, topic, transactional_id, str(transactions)]
    if family.startswith("java-"):
        return java_programs.command("ShortTransactions", family.removeprefix("java-"), *args, quick_start=False)
    if family in ("confluent-kafka", "kafka-python"):
        return [sys.executable, "-m", "txnguard.testing.short_transactions", family, *args]
    raise ValueError(f"no short-transaction loop for {family}")


def run_loop(family: str, bootstrap: str, topic: str, transactional_id: str, transactions: int,
             timeout_s: float = 300.0) -> LoopResult:
    cmd = loop_command(family, bootstrap, topic, transactional_id, transactions)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"{family} loop failed (exit {run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    out = json.loads(lines[-1])
    return LoopResult(family, int(out["transactions"]), float(out["seconds"]))


class ConcurrentTap:
    """A no-fault relay that counts CONCURRENT_TRANSACTIONS answers on their way to the client."""

    def __init__(self, target: tuple[str, int], port: int) -> None:
        self.relay = FaultRelay(target, port=port)
        self.relay.observers.append(self._observe)
        self.seen: Counter[str] = Counter()  # "add_partitions_to_txn" / "add_offsets_to_txn" -> answers with 51
        self._lock = threading.Lock()

    def _observe(self, direction: Direction, api_key: int, version: int, frame: bytes) -> None:
        if direction is not Direction.RESPONSE or api_key not in (ADD_PARTITIONS, ADD_OFFSETS) or version < 0:
            return
        if _refused_busy(api_key, version, frame):
            with self._lock:
                self.seen[schemas.api_name(api_key)] += 1

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self.seen.values())

    def __enter__(self) -> ConcurrentTap:
        self.relay.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.relay.stop()


def _refused_busy(api_key: int, version: int, frame: bytes) -> bool:
    _, body = schemas.decode_response(memoryview(frame)[4:], api_key, version)
    if api_key == ADD_OFFSETS:
        return int(body.error_code) == CONCURRENT_TRANSACTIONS
    return any(int(p.partition_error_code) == CONCURRENT_TRANSACTIONS
               for t in body.results_by_topic_v3_and_below for p in t.results_by_partition)


# -- the Python loops (run as `python -m txnguard.testing.short_transactions FAMILY ...`) -------------------


def _confluent(bootstrap: str, topic: str, transactional_id: str, transactions: int) -> float:
    import time

    from confluent_kafka import KafkaException, Producer

    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(60)
    start = time.perf_counter()
    for i in range(transactions):
        producer.begin_transaction()
        producer.produce(topic, f"v{i}".encode(), partition=0,
                         on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
        producer.commit_transaction(60)
        if errors:
            raise KafkaException(errors[0])
    return time.perf_counter() - start


def _kafka_python(bootstrap: str, topic: str, transactional_id: str, transactions: int) -> float:
    import time

    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, max_block_ms=60_000)
    try:
        producer.init_transactions()
        start = time.perf_counter()
        for i in range(transactions):
            producer.begin_transaction()
            producer.send(topic, value=f"v{i}".encode(), partition=0)
            producer.commit_transaction()
        return time.perf_counter() - start
    finally:
        producer.close(timeout=10)


def main(argv: list[str]) -> int:
    family, bootstrap, topic, transactional_id, count = argv
    loop = {"confluent-kafka": _confluent, "kafka-python": _kafka_python}[family]
    seconds = loop(bootstrap, topic, transactional_id, int(count))
    print(json.dumps({"transactions": int(count), "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

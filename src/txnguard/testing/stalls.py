"""A transactional producer that outlives its transaction.timeout.ms, per client family (KIP-588).

Every runner does the same, with a real client: init, begin, write one record to partition 0,
sleep past the transaction timeout (the coordinator aborts the transaction and bumps the epoch),
then either send one more record and commit (`send`) or commit at once (`commit`). On an error it
does what an application should: abort, then try one more transaction. The steps it took and how
each ended are the result: `Stall.outcome` is "committed" (the timeout went unnoticed),
"recovered" (the next transaction committed), or "failed" (the producer is unusable).

The Java runner is StallTxn.java (java/), run with the JDK's source launcher on the Kafka tools'
classpath of the version asked for.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txnguard.testing import java_programs


@dataclass
class Stall:
    client: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step, "ok" or "ErrorClass: message")
    outcome: str = "failed"

    def ok(self, step: str) -> None:
        self.steps.append((step, "ok"))

    def error(self, step: str, e: BaseException) -> None:
        self.steps.append((step, f"{type(e).__name__}: {e}"))

    def first_error(self) -> tuple[str, str] | None:
        return next(((s, r) for s, r in self.steps if r != "ok"), None)


def java(version: str, bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str,
         *, limit_s: float = 90.0) -> Stall:
    command = java_programs.command("StallTxn", version, bootstrap, topic, txn_id, str(timeout_ms), str(stall_ms),
                                    mode)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, check=False)
    stall = Stall(f"java-{version}")
    for line in proc.stdout.splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "STEP":
            stall.steps.append((parts[1], "ok" if parts[2] == "ok" else parts[3].replace(" ", ": ", 1)))
        elif parts[0] == "RESULT":
            stall.outcome = "failed" if parts[1] in ("fatal", "unrecovered") else parts[1]
    if not stall.steps:
        raise RuntimeError(f"StallTxn printed nothing (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return stall


def confluent(bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str,
              meanwhile: Callable[[], None] | None = None) -> Stall:
    """`meanwhile` runs after the stall, before the send or commit (a second producer, say)."""
    from confluent_kafka import KafkaException, Producer

    stall = Stall("confluent-kafka")
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": timeout_ms,
                  "message.timeout.ms": timeout_ms, "linger.ms": 0})

    def send(value: str) -> None:
        failed: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        p.produce(topic, value.encode(), partition=0, on_delivery=delivered)
        try:
            p.flush(20)
        except SystemError as e:  # a fatal error raised inside flush() while it ran our callback
            raise KafkaException(e.__cause__ or e) from e
        if failed:
            raise KafkaException(failed[0])

    def attempt(step: str, fn: Any) -> bool:
        try:
            fn()
        except (KafkaException, RuntimeError) as e:
            stall.error(step, e)
            return False
        stall.ok(step)
        return True

    p.init_transactions(20)
    p.begin_transaction()
    send("before-stall")
    stall.ok("first-send")
    time.sleep(stall_ms / 1000)
    if meanwhile is not None:
        meanwhile()
    if (mode != "send" or attempt("send-after-stall", lambda: send("after-stall"))) \
            and attempt("commit", lambda: p.commit_transaction(20)):
        stall.outcome = "committed"
        return stall
    def next_transaction() -> None:
        p.begin_transaction()
        send("recovered")
        p.commit_transaction(20)

    if attempt("abort", lambda: p.abort_transaction(20)) and attempt("next-transaction", next_transaction):
        stall.outcome = "recovered"
    return stall


def kafka_python(bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str) -> Stall:
    from kafka import KafkaProducer

    stall = Stall("kafka-python")
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                      request_timeout_ms=10000, max_block_ms=20000)

    def attempt(step: str, fn: Any) -> bool:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the client's own error classes are what we record
            stall.error(step, e)
            return False
        stall.ok(step)
        return True

    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"before-stall", partition=0).get(20)
        stall.ok("first-send")
        time.sleep(stall_ms / 1000)
        if (mode != "send" or attempt("send-after-stall", lambda: p.send(topic, b"after-stall", partition=0).get(20))) \
                and attempt("commit", p.commit_transaction):
            stall.outcome = "committed"
            return stall
        def next_transaction() -> None:
            p.begin_transaction()
            p.send(topic, b"recovered", partition=0).get(20)
            p.commit_transaction()

        # kafka-python 3.0 bumps the epoch by itself after INVALID_PRODUCER_EPOCH on a Produce
        # (state BUMPING_PRODUCER_EPOCH, then READY): an abort meanwhile is refused as an invalid
        # transition, and the application goes on with a new transaction.
        attempt("abort", p.abort_transaction)
        for _ in range(100):  # begin_transaction is refused as well until the bump is done
            if attempt("next-transaction", next_transaction):
                stall.outcome = "recovered"
                break
            if "BUMPING_PRODUCER_EPOCH" not in stall.steps[-1][1]:
                break
            stall.steps.pop()
            time.sleep(0.1)
        return stall
    finally:
        p.close(timeout=5)


def aiokafka(bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str) -> Stall:
    from aiokafka import AIOKafkaProducer

    stall = Stall("aiokafka")

    async def attempt(step: str, fn: Any) -> bool:
        try:
            await fn()
        except Exception as e:  # noqa: BLE001
            stall.error(step, e)
            return False
        stall.ok(step)
        return True

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                             request_timeout_ms=10000)
        await p.start()
        try:
            await p.begin_transaction()
            await p.send_and_wait(topic, b"before-stall", partition=0)
            stall.ok("first-send")
            await asyncio.sleep(stall_ms / 1000)

            async def next_txn() -> None:
                await p.begin_transaction()
                await p.send_and_wait(topic, b"recovered", partition=0)
                await p.commit_transaction()

            if (mode != "send" or await attempt("send-after-stall",
                                                lambda: p.send_and_wait(topic, b"after-stall", partition=0))) \
                    and await attempt("commit", p.commit_transaction):
                stall.outcome = "committed"
                return
            if await attempt("abort", p.abort_transaction) and await attempt("next-transaction", next_txn):
                stall.outcome = "recovered"
        finally:
            await asyncio.wait_for(p.stop(), 10)

    asyncio.run(main())
    return stall


RUNNERS = {"confluent-kafka": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka}


def sarama(bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str,
           *, limit_s: float = 60.0) -> Stall:
    """IBM/sarama through sarama-paced (tools/sarama-paced): one transaction, stalled after its first
    record's acknowledgement. `send`: two records, the second after the stall; `commit`: one record,
    then the commit after the stall. sarama-paced aborts on an abortable error and runs the
    transaction again (its next transaction); a fatal error ends it."""
    import json

    from txnguard.testing.clients import SARAMA_PACED

    per_transaction = 2 if mode == "send" else 1
    proc = subprocess.Popen([SARAMA_PACED, "--bootstrap", bootstrap, "--topic", topic, "--transactional-id", txn_id,
                             "--per-transaction", str(per_transaction), "--ack-handshake", "--quiet",
                             "--transaction-timeout-ms", str(timeout_ms), "--timeout-s", str(limit_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    stall = Stall("sarama")
    last = ""
    try:
        for line in proc.stdout:
            last = line
            if line.startswith("ACK "):
                if line.strip() == "ACK 0 0" and not stall.steps:
                    stall.ok("first-send")
                    time.sleep(stall_ms / 1000)
                proc.stdin.write("\n")
                proc.stdin.flush()
        proc.wait(limit_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    res = json.loads(last)
    for e in res["errors"]:
        stall.steps.append(("transaction", e))
    if res["fatal"]:
        stall.steps.append(("fatal", res["fatal"]))
    elif res["committed"]:
        stall.outcome = "recovered" if res["aborted"] else "committed"
    return stall


RUNNERS["sarama"] = sarama


def _run(family: str, bootstrap: str, topic: str, txn_id: str, timeout_ms: int, stall_ms: int, mode: str) -> Stall:
    if family.startswith("java-"):
        return java(family.removeprefix("java-"), bootstrap, topic, txn_id, timeout_ms, stall_ms, mode)
    return RUNNERS[family](bootstrap, topic, txn_id, timeout_ms, stall_ms, mode)


def _cell(stall: Stall) -> str:
    steps = "; ".join(f"{step}: {result.split(':')[0] if result != 'ok' else 'ok'}" for step, result in stall.steps
                      if step != "first-send")
    return f"**{stall.outcome}** ({steps})"


def main(argv: list[str] | None = None) -> None:
    """The KIP-588 table of docs/concepts/timeout-recovery.md: every family, direct / through the gateway without
    and with policy.timeout_recovery, `send` and `commit` after a stall past the transaction timeout.

        python -m txnguard.testing.stalls --bootstrap 127.0.0.1:9092 --topic t [--families java-3.5.2,...]

    The cluster must scan for timed-out transactions often
    (transaction.abort.timed.out.transaction.cleanup.interval.ms, the harness's brokers: 1000)."""
    import argparse
    import json
    import uuid

    from txnguard.testing.proxy import ProxyThread

    ap = argparse.ArgumentParser(prog="python -m txnguard.testing.stalls")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--families", default="java-3.5.2,java-2.8.2,confluent-kafka,kafka-python,aiokafka,sarama")
    ap.add_argument("--modes", default="send,commit")
    ap.add_argument("--timeout-ms", type=int, default=2000)
    ap.add_argument("--stall-ms", type=int, default=4000)
    a = ap.parse_args(argv)
    families, modes = a.families.split(","), a.modes.split(",")
    proxies = {setting: ProxyThread.from_settings(upstream=a.bootstrap, mode="gateway", log_level="warning",
                                                  policy={"timeout_recovery": setting == "with"}).start()
               for setting in ("without", "with")}
    try:
        for family in families:
            for mode in modes:
                cells = []
                for where in ("direct", "without", "with"):
                    bootstrap = a.bootstrap if where == "direct" else proxies[where].bootstrap
                    stall = _run(family, bootstrap, a.topic, f"kip588-{family}-{uuid.uuid4().hex[:8]}", a.timeout_ms,
                                 a.stall_ms, mode)
                    print(json.dumps({"family": family, "mode": mode, "where": where, "steps": stall.steps,
                                      "outcome": stall.outcome}), flush=True)
                    cells.append(_cell(stall))
                print(f"| {family} | {mode} | {' | '.join(cells)} |", flush=True)
    finally:
        for p in proxies.values():
            p.stop()


if __name__ == "__main__":
    main()

"""Drive REAL Kafka clients through one small, uniform interface.

Every adapter takes a `bootstrap_servers` string and nothing else about the
cluster, so the same calls can later be pointed at the proxy instead of the
brokers. Three families:

* Python libraries, in process: kafka-python, confluent-kafka (librdkafka) and
  aiokafka, each as a `TransactionalClient`; confluent-kafka and kafka-python
  also as a `CommittedConsumer`.
* kcat, a librdkafka command-line tool: plain produce, metadata and a
  read_committed consumer. It cannot run transactions.
* The Java client, through the tools shipped in Kafka's own `kafka-tools` jar
  (TransactionalMessageCopier, VerifiableProducer, ProducerPerformance,
  TransactionsCommand), one JVM per call, with the client version chosen by
  which `kafka-tools` jar folder goes on the classpath.

Every subprocess runs with a timeout, is killed (its whole process group) when
the timeout passes, and a failure raises `ClientError` carrying the tail of
the tool's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from txnguard.testing import jars, raw

DEFAULT_TIMEOUT_S = 60.0
TOOL_HEAP = "256m"
KCAT = os.environ.get("TXNGUARD_KCAT", "kcat")

T = TypeVar("T")


class ClientError(RuntimeError):
    """A client or tool failed or timed out; the message carries the tail of its output."""


# -- subprocesses -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _describe(args: Sequence[str], stdout: str, stderr: str) -> str:
    # The classpath alone is thousands of characters; show the class and its arguments.
    shown = list(args)
    if "-cp" in shown:
        i = shown.index("-cp")
        shown[i + 1] = "<classpath>"
    return (f"command: {' '.join(shown)}\n--- stdout (tail) ---\n{_tail(stdout)}\n"
            f"--- stderr (tail) ---\n{_tail(stderr)}")


def run_tool(
    args: Sequence[str], *, timeout_s: float, input_bytes: bytes | None = None, check: bool = True
) -> ToolRun:
    """Run a command to completion; kill its process group and raise if it outlives `timeout_s`."""
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own session, so a timeout kills it and anything it started, and nothing else.
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input_bytes, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise ClientError(
            f"timed out after {timeout_s:.0f}s and was killed\n"
            + _describe(args, out.decode(errors="replace"), err.decode(errors="replace"))
        ) from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    run = ToolRun(list(args), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and run.returncode != 0:
        raise ClientError(f"exited with {run.returncode}\n" + _describe(args, run.stdout, run.stderr))
    return run


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking call in a daemon thread and give up after `timeout_s`.

    kafka-python's commit/abort wait without a timeout; a test must fail, not hang.
    The abandoned thread is a daemon, so it cannot keep the interpreter alive.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(e)

    worker = threading.Thread(target=target, name=f"bounded-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ClientError(f"{what} did not finish within {timeout_s:.0f}s")
    if error:
        raise error[0]
    return result[0]


def _group_id() -> str:
    return f"txnguard-{uuid.uuid4().hex[:12]}"


def _partitions_of(bootstrap_servers: str, topic: str, partitions: Sequence[int] | None) -> list[int]:
    if partitions is not None:
        return list(partitions)
    return list(range(raw.partition_count(bootstrap_servers, topic)))


def stable_end_offsets(
    bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None, *, timeout_s: float = 30.0,
) -> dict[int, int]:
    """Wait until no transaction is open on any partition (LSO == high watermark); return the watermarks.

    A producer's commit returns once the coordinator has logged its decision, before
    the markers reach the partitions. A read_committed consumer started right then
    stops at the old LSO and misses the last transaction, so wait for this first.
    Asks each partition's leader, as ListOffsets must.
    """
    deadline = time.monotonic() + timeout_s
    result: dict[int, int] = {}
    for p in _partitions_of(bootstrap_servers, topic, partitions):
        _, host, port = raw.leader_of(bootstrap_servers, topic, p)
        with raw.RawClient(host, port) as c:
            while True:
                lso = c.list_offsets(topic, p, read_committed=True)
                hw = c.list_offsets(topic, p, read_committed=False)
                if lso == hw:
                    result[p] = hw
                    break
                if time.monotonic() > deadline:
                    raise ClientError(f"{topic}-{p}: last stable offset {lso} still below high watermark {hw} "
                                      f"after {timeout_s:.0f}s (an open or hanging transaction)")
                time.sleep(0.05)
    return result


# -- the uniform interfaces ----------------------------------------------------------------------


class TransactionalClient(Protocol):
    name: str

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """init, begin, send every value (and wait for its ack), commit or abort, close."""
        ...


class CommittedConsumer(Protocol):
    name: str

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        """Values from the beginning up to the last stable offset, with isolation.level=read_committed.

        Returns partition by partition, in offset order within each. Raises ClientError
        if the end is not reached within `timeout_s`.
        """
        ...


# -- kafka-python ---------------------------------------------------------------------------------


class KafkaPythonClient:
    name = "kafka-python"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers, transactional_id=transactional_id,
            max_block_ms=int(timeout_s * 1000), request_timeout_ms=30000,
        )
        try:
            producer.init_transactions()  # bounded by max_block_ms
            producer.begin_transaction()
            futures = [producer.send(topic, value=v, partition=partition) for v in values]
            producer.flush(timeout=timeout_s)
            for f in futures:
                f.get(timeout=timeout_s)  # raises the send's error, if any
            end = producer.commit_transaction if commit else producer.abort_transaction
            _bounded(end, timeout_s, f"kafka-python {'commit' if commit else 'abort'}_transaction")
        finally:
            producer.close(timeout=10)

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        from kafka import KafkaConsumer, TopicPartition

        tps = [TopicPartition(topic, p) for p in _partitions_of(bootstrap_servers, topic, partitions)]
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
        )
        got: dict[int, list[tuple[int, bytes]]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        try:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            # Under read_committed the client's own end offsets are the last stable offsets.
            ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
            while behind := [tp for tp in tps if consumer.position(tp, timeout_ms=5000) < ends[tp]]:
                if time.monotonic() > deadline:
                    raise ClientError(f"kafka-python: {[str(tp) for tp in behind]} did not reach {ends} "
                                      f"within {timeout_s:.0f}s")
                for tp, records in consumer.poll(timeout_ms=200).items():
                    got[tp.partition].extend((r.offset, r.value) for r in records)
        finally:
            consumer.close(autocommit=False)
        return [v for p in sorted(got) for _, v in sorted(got[p])]


# -- confluent-kafka (librdkafka) -----------------------------------------------------------------


def _rdkafka_partition(partition: int | None) -> int:
    return -1 if partition is None else partition  # -1 is RD_KAFKA_PARTITION_UA: let the partitioner pick


class ConfluentKafkaClient:
    name = "confluent-kafka"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": transactional_id})
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, value=v, partition=_rdkafka_partition(partition), on_delivery=on_delivery)
        # Flush before an abort too: librdkafka purges unsent messages on abort, and an
        # abort test means nothing unless the aborted records really reached the log.
        if producer.flush(timeout_s) != 0:
            raise ClientError(f"confluent-kafka: {len(producer)} messages not delivered within {timeout_s:.0f}s")
        if failures:
            producer.abort_transaction(timeout_s)
            raise ClientError(f"confluent-kafka delivery failed: {failures[:3]}")
        if commit:
            producer.commit_transaction(timeout_s)
        else:
            producer.abort_transaction(timeout_s)

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Plain idempotent produce, acks=all; raises unless every value was acknowledged."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                             "linger.ms": 5})
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for v in values:
            while True:
                try:
                    producer.produce(topic, value=v, partition=_rdkafka_partition(partition),
                                     on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
        if producer.flush(timeout_s) != 0 or failures:
            raise ClientError(f"confluent-kafka produce: {len(producer)} undelivered, failures {failures[:3]}")

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        wanted = _partitions_of(bootstrap_servers, topic, partitions)
        consumer = Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": _group_id(), "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # librdkafka signals end-of-partition at the last stable offset when read_committed.
            "enable.partition.eof": True,
        })
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in wanted}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted])
            while at_end != set(wanted):
                if time.monotonic() > deadline:
                    raise ClientError(f"confluent-kafka: {topic} partitions {sorted(set(wanted) - at_end)} "
                                      f"did not reach their end within {timeout_s:.0f}s")
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                err, p = msg.error(), int(msg.partition() or 0)
                if err is None:
                    got[p].append((int(msg.offset() or 0), msg.value() or b""))
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(p)
                elif not err.retriable():
                    raise ClientError(f"confluent-kafka consumer error: {err}")
        finally:
            consumer.close()
        return [v for p in sorted(got) for _, v in sorted(got[p])]


# -- aiokafka -------------------------------------------------------------------------------------


class AioKafkaClient:
    name = "aiokafka"

    def run_transaction(
        self, bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        *, partition: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        # The adapter owns its event loop so callers (and tests) stay synchronous.
        coro = self._transaction(bootstrap_servers, topic, transactional_id, values, commit, partition)
        try:
            asyncio.run(asyncio.wait_for(coro, timeout_s))
        except TimeoutError as e:
            raise ClientError(f"aiokafka transaction did not finish within {timeout_s:.0f}s") from e

    @staticmethod
    async def _transaction(
        bootstrap_servers: str, topic: str, transactional_id: str, values: Sequence[bytes], commit: bool,
        partition: int | None,
    ) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, transactional_id=transactional_id)
        await producer.start()  # start() runs InitProducerId for a transactional producer
        try:
            await producer.begin_transaction()
            futures = [await producer.send(topic, value=v, partition=partition) for v in values]
            await asyncio.gather(*futures)  # every record acknowledged before the outcome is chosen
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
        finally:
            await producer.stop()


# -- kcat -------------------------------------------------------------------------------------------


class Kcat:
    """kcat (librdkafka). It has no transactional producer, so it only ever reads transactions."""

    name = "kcat"

    def __init__(self, executable: str = KCAT) -> None:
        self.executable = executable

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        got: list[tuple[int, int, bytes]] = []
        for p in _partitions_of(bootstrap_servers, topic, partitions):
            # -e: exit at end of partition, which read_committed puts at the last stable offset.
            # -J: one JSON envelope per message, so values may contain newlines.
            run = run_tool(
                [self.executable, "-C", "-b", bootstrap_servers, "-t", topic, "-p", str(p), "-o", "beginning",
                 "-e", "-q", "-J", "-X", "isolation.level=read_committed"],
                timeout_s=timeout_s,
            )
            for line in run.stdout.splitlines():
                if line.strip():
                    m = json.loads(line)
                    value = m["payload"]
                    got.append((int(m["partition"]), int(m["offset"]), b"" if value is None else value.encode()))
        return [v for _, _, v in sorted(got)]

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """One message per value (newline-delimited on kcat's stdin), acks=all."""
        if any(b"\n" in v for v in values):
            raise ValueError("kcat produce takes newline-delimited values; a value contains a newline")
        args = [self.executable, "-P", "-b", bootstrap_servers, "-t", topic, "-X", "acks=all"]
        if partition is not None:
            args += ["-p", str(partition)]
        run = run_tool(args, timeout_s=timeout_s, input_bytes=b"".join(v + b"\n" for v in values))
        # kcat reports delivery failures on stderr but may still exit 0.
        if "ERROR" in run.stderr:
            raise ClientError("kcat produce reported errors\n" + _describe(run.args, run.stdout, run.stderr))

    def metadata(self, bootstrap_servers: str, *, topic: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """kcat -L -J: {"brokers": [{"id", "name"}...], "topics": [{"topic", "partitions": [...]}...], ...}."""
        args = [self.executable, "-L", "-J", "-b", bootstrap_servers]
        if topic is not None:
            args += ["-t", topic]
        result: dict[str, Any] = json.loads(run_tool(args, timeout_s=timeout_s).stdout)
        return result


PYTHON_TRANSACTIONAL_CLIENTS: dict[str, TransactionalClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient())
}
COMMITTED_CONSUMERS: dict[str, CommittedConsumer] = {
    c.name: c for c in (ConfluentKafkaClient(), KafkaPythonClient(), Kcat())
}


# -- Java tools -------------------------------------------------------------------------------------

TOOLS_PACKAGE = "org.apache.kafka.tools"

# The first kafka-tools release that ships each tool under org.apache.kafka.tools.
_TOOL_SINCE: dict[str, tuple[int, int]] = {
    "TransactionalMessageCopier": (2, 0),
    "VerifiableProducer": (2, 0),
    "VerifiableConsumer": (2, 0),
    "ProducerPerformance": (2, 0),
    "TransactionsCommand": (3, 0),
    "EndToEndLatency": (3, 5),
}


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


def tools_log_config() -> Path:
    """A folder with log4j 1 and log4j2 configs: WARN and above, to stderr.

    Kafka 2.x/3.x tools log through log4j 1 (or reload4j), 4.x through log4j2. Without
    a config, log4j 1 prints warnings about missing appenders and the client logs
    every config dump at INFO. stderr is captured, so real warnings still reach
    the failure message of a tool that failed.
    """
    folder = jars.cache_root() / "tools-logging"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "log4j.properties": (
            "log4j.rootLogger=WARN, stderr\n"
            "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\n"
            "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        ),
        "log4j2.properties": (
            "appender.stderr.type=Console\n"
            "appender.stderr.name=STDERR\n"
            "appender.stderr.target=SYSTEM_ERR\n"
            "appender.stderr.layout.type=PatternLayout\n"
            "appender.stderr.layout.pattern=[%d] %p %m (%c)%n\n"
            "rootLogger.level=WARN\n"
            "rootLogger.appenderRef.stderr.ref=STDERR\n"
        ),
    }
    for name, text in files.items():
        target = folder / name
        if not target.exists() or target.read_text() != text:
            # Write-then-rename, so a concurrent JVM never reads half a file.
            tmp = folder / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            tmp.replace(target)
    return folder


def java_command(tool: str, java_version: str, args: Sequence[str]) -> list[str]:
    """`java ... org.apache.kafka.tools.<tool> args` with the kafka-tools jars of `java_version`.

    The kafka-tools folder carries kafka-clients of the same version, so the tool
    runs that Java client version.
    """
    since = _TOOL_SINCE.get(tool)
    if since is None:
        raise ClientError(f"unknown tool {tool}")
    if _version_tuple(java_version) < since:
        raise ClientError(f"{tool} is not in kafka-tools {java_version} (first in {since[0]}.{since[1]})")
    folder = jars.resolve("kafka-tools", java_version)
    logs = tools_log_config()
    return [
        "java", f"-Xmx{TOOL_HEAP}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
        # ProducerPerformance formats numbers with the default locale; pin it so "1,5" never appears.
        "-Duser.language=en", "-Duser.country=US",
        f"-Dlog4j.configuration=file:{logs / 'log4j.properties'}",
        f"-Dlog4j2.configurationFile={logs / 'log4j2.properties'}",
        "-cp", jars.classpath(folder), f"{TOOLS_PACKAGE}.{tool}", *args,
    ]


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a log line that happens to start with a brace
    return out


@dataclass(frozen=True)
class CopierResult:
    total_processed: int
    consumed: int
    remaining: int
    shutdown_complete: bool
    status_lines: int


def _is_copier_shutdown(status: dict[str, Any]) -> bool:
    # 2.8 prints {"shutdown_complete": <txn id>, ...}; 3.x prints {"stage": "ShutdownComplete", ...}.
    return "shutdown_complete" in status or status.get("stage") == "ShutdownComplete"


def java_transactional_copier(
    bootstrap_servers: str, input_topic: str, output_topic: str, transactional_id: str, group_id: str,
    max_messages: int, java_version: str, *, input_partition: int = 0, transaction_size: int = 200,
    transaction_timeout_ms: int = 60000, enable_random_aborts: bool = False, use_group_metadata: bool = False,
    timeout_s: float = 180.0,
) -> CopierResult:
    """Run TransactionalMessageCopier (consume a partition, produce + commit offsets in transactions).

    It prints one JSON status line per loop and a final one from its shutdown hook;
    the result is the final line's counts. `max_messages` is capped by the tool to
    what the input partition holds (read_committed) when it starts.
    """
    args = [
        "--broker-list", bootstrap_servers, "--input-topic", input_topic, "--input-partition", str(input_partition),
        "--output-topic", output_topic, "--transactional-id", transactional_id, "--consumer-group", group_id,
        "--max-messages", str(max_messages), "--transaction-size", str(transaction_size),
        "--transaction-timeout", str(transaction_timeout_ms),
    ]
    if enable_random_aborts:
        args.append("--enable-random-aborts")
    if use_group_metadata:
        args.append("--use-group-metadata")
    run = run_tool(java_command("TransactionalMessageCopier", java_version, args), timeout_s=timeout_s)
    statuses = [s for s in _json_lines(run.stdout) if "totalProcessed" in s]
    if not statuses:
        raise ClientError("TransactionalMessageCopier printed no status\n"
                          + _describe(run.args, run.stdout, run.stderr))
    last = statuses[-1]
    return CopierResult(
        total_processed=int(last["totalProcessed"]), consumed=int(last["consumed"]),
        remaining=int(last["remaining"]), shutdown_complete=_is_copier_shutdown(last),
        status_lines=len(statuses),
    )


@dataclass(frozen=True)
class VerifiableProducerResult:
    acked_values: list[str]
    errors: list[str]
    sent: int
    acked: int


def java_verifiable_producer(
    bootstrap_servers: str, topic: str, max_messages: int, java_version: str, *, throughput: int = -1,
    acks: int = -1, value_prefix: int | None = None, producer_config: dict[str, str] | None = None,
    config_dir: Path | None = None, timeout_s: float = 120.0,
) -> VerifiableProducerResult:
    """Run VerifiableProducer: values "0".."N-1" (or "<prefix>.<i>"), one JSON line per ack or error.

    It sets retries=0, so a send can fail on a leadership change; callers check `errors`.
    `producer_config` is written to a properties file in `config_dir` (default: a temp file).
    """
    args = ["--bootstrap-server", bootstrap_servers, "--topic", topic, "--max-messages", str(max_messages),
            "--throughput", str(throughput), "--acks", str(acks)]
    if value_prefix is not None:
        args += ["--value-prefix", str(value_prefix)]
    with _properties_file(producer_config, config_dir) as props:
        if props is not None:
            args += ["--producer.config", str(props)]
        run = run_tool(java_command("VerifiableProducer", java_version, args), timeout_s=timeout_s)
    acked: list[str] = []
    errors: list[str] = []
    sent = acked_count = -1
    for event in _json_lines(run.stdout):
        name = event.get("name")
        if name == "producer_send_success":
            acked.append(str(event["value"]))
        elif name == "producer_send_error":
            errors.append(f"{event.get('value')}: {event.get('exception')} {event.get('message')}")
        elif name == "tool_data":
            sent, acked_count = int(event["sent"]), int(event["acked"])
    return VerifiableProducerResult(acked_values=acked, errors=errors, sent=sent, acked=acked_count)


@dataclass(frozen=True)
class PerfResult:
    records: int
    records_per_sec: float
    mb_per_sec: float
    avg_latency_ms: float
    max_latency_ms: float
    p50_ms: int
    p95_ms: int
    p99_ms: int
    p999_ms: int


# The summary line ProducerPerformance prints last (same shape in 2.8 to 4.x).
_PERF_TOTAL = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th"
)


def parse_producer_performance(stdout: str) -> PerfResult | None:
    matches = list(_PERF_TOTAL.finditer(stdout))
    if not matches:
        return None
    m = matches[-1]
    return PerfResult(
        records=int(m["records"]), records_per_sec=float(m["rps"]), mb_per_sec=float(m["mbps"]),
        avg_latency_ms=float(m["avg"]), max_latency_ms=float(m["max"]), p50_ms=int(m["p50"]),
        p95_ms=int(m["p95"]), p99_ms=int(m["p99"]), p999_ms=int(m["p999"]),
    )


def java_producer_performance(
    bootstrap_servers: str, topic: str, num_records: int, java_version: str, *, record_size: int = 100,
    throughput: int = -1, transactional_id: str | None = None, transaction_duration_ms: int | None = None,
    producer_props: dict[str, str] | None = None, timeout_s: float = 180.0,
) -> PerfResult:
    """Run ProducerPerformance and parse its summary line.

    Transactions are on when `transaction_duration_ms` > 0 (the tool commits after each
    such interval). --transactional-id and --transaction-duration-ms exist in every
    kafka-tools version we use (2.8.2 up to 4.3.1).
    """
    # A properties file rather than --producer-props, which rejects any value containing "=".
    props = {"bootstrap.servers": bootstrap_servers, "acks": "all", **(producer_props or {})}
    args = ["--topic", topic, "--num-records", str(num_records), "--record-size", str(record_size),
            "--throughput", str(throughput)]
    if transactional_id is not None:
        args += ["--transactional-id", transactional_id]
    if transaction_duration_ms is not None:
        args += ["--transaction-duration-ms", str(transaction_duration_ms)]
    with _properties_file(props, None) as config:
        args += ["--producer.config", str(config)]
        run = run_tool(java_command("ProducerPerformance", java_version, args), timeout_s=timeout_s)
    result = parse_producer_performance(run.stdout)
    if result is None:
        raise ClientError("ProducerPerformance printed no summary\n" + _describe(run.args, run.stdout, run.stderr))
    return result


@dataclass(frozen=True)
class HangingTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp_ms: int
    duration_min: int


_HANGING_HEADER = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                   "LastTimestamp", "Duration(min)"]


def parse_find_hanging(stdout: str) -> list[HangingTransaction]:
    """Parse the table find-hanging prints: a header row, then one whitespace-separated row per hit."""
    lines = [line.split() for line in stdout.splitlines() if line.strip()]
    try:
        start = lines.index(_HANGING_HEADER) + 1
    except ValueError:
        raise ClientError(f"find-hanging printed no table:\n{_tail(stdout)}") from None
    rows = []
    for cells in lines[start:]:
        if len(cells) != len(_HANGING_HEADER):
            raise ClientError(f"unexpected find-hanging row {cells!r}:\n{_tail(stdout)}")
        topic, *numbers = cells
        p, pid, epoch, coord, offset, ts, dur = (int(x) for x in numbers)
        rows.append(HangingTransaction(topic, p, pid, epoch, coord, offset, ts, dur))
    return rows


def transactions_find_hanging(
    bootstrap_servers: str, *, broker_id: int | None = None, topic: str | None = None,
    partition: int | None = None, java_version: str = "3.5.2", max_transaction_timeout_minutes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[HangingTransaction]:
    """`TransactionsCommand find-hanging`: open transactions the coordinator does not know about.

    Candidates are open transactions on a partition whose producer's last batch
    timestamp (the batch's max timestamp) is older than --max-transaction-timeout
    minutes (tool default 15). The tool does not validate that value: 0 (and even
    negative numbers) are accepted, and 0 makes every open transaction a candidate.
    A candidate is reported if the coordinator does not list its partition in that
    transaction. Needs --broker-id or --topic (tool rule); --partition needs --topic.
    """
    if broker_id is None and topic is None:
        raise ValueError("find-hanging needs broker_id or topic")
    if partition is not None and topic is None:
        raise ValueError("find-hanging --partition needs topic")
    args = ["--bootstrap-server", bootstrap_servers, "find-hanging"]
    if broker_id is not None:
        args += ["--broker-id", str(broker_id)]
    if topic is not None:
        args += ["--topic", topic]
    if partition is not None:
        args += ["--partition", str(partition)]
    if max_transaction_timeout_minutes is not None:
        args += ["--max-transaction-timeout", str(max_transaction_timeout_minutes)]
    run = run_tool(java_command("TransactionsCommand", java_version, args), timeout_s=timeout_s)
    return parse_find_hanging(run.stdout)


# -- helpers ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _properties_file(values: dict[str, str] | None, folder: Path | None) -> Iterator[Path | None]:
    """A temporary Java properties file, removed afterwards (None when there is nothing to write)."""
    if not values:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="txnguard-", suffix=".properties", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in values.items()))
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)

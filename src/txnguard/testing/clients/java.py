"""The Java client, through the tools shipped in Kafka's own `kafka-tools` jar (TransactionalMessageCopier,
VerifiableProducer, ProducerPerformance, TransactionsCommand), one JVM per call, with the client version chosen by
which `kafka-tools` jar folder goes on the classpath."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txnguard.testing import jars
from txnguard.testing.clients.base import (
    DEFAULT_TIMEOUT_S,
    ClientError,
    describe_run,
    run_tool,
    tail,
)

TOOL_HEAP = "256m"
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
                          + describe_run(run.args, run.stdout, run.stderr))
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
    kafka-tools version we use (2.8.2 up to 4.4.0).
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
        raise ClientError("ProducerPerformance printed no summary\n" + describe_run(run.args, run.stdout, run.stderr))
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
        raise ClientError(f"find-hanging printed no table:\n{tail(stdout)}") from None
    rows = []
    for cells in lines[start:]:
        if len(cells) != len(_HANGING_HEADER):
            raise ClientError(f"unexpected find-hanging row {cells!r}:\n{tail(stdout)}")
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

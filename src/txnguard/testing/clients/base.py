"""What every client family shares: the uniform interfaces the tests drive, their result types, a consumer
group member's thread, and running a tool as a subprocess with a timeout.

Every adapter takes a `bootstrap_servers` string and nothing else about the cluster, so the same calls can be
pointed at the brokers or at the proxy. Every subprocess runs with a timeout, is killed (its whole process
group) when the timeout passes, and a failure raises `ClientError` carrying the tail of the tool's output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from txnguard.testing import raw

DEFAULT_TIMEOUT_S = 60.0

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


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def describe_run(args: Sequence[str], stdout: str, stderr: str) -> str:
    # The classpath alone is thousands of characters; show the class and its arguments.
    shown = list(args)
    if "-cp" in shown:
        i = shown.index("-cp")
        shown[i + 1] = "<classpath>"
    return (f"command: {' '.join(shown)}\n--- stdout (tail) ---\n{tail(stdout)}\n"
            f"--- stderr (tail) ---\n{tail(stderr)}")


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
        kill_group(proc)
        out, err = proc.communicate()
        raise ClientError(
            f"timed out after {timeout_s:.0f}s and was killed\n"
            + describe_run(args, out.decode(errors="replace"), err.decode(errors="replace"))
        ) from None
    except BaseException:
        kill_group(proc)
        proc.communicate()
        raise
    run = ToolRun(list(args), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and run.returncode != 0:
        raise ClientError(f"exited with {run.returncode}\n" + describe_run(args, run.stdout, run.stderr))
    return run


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
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


def fresh_group_id() -> str:
    return f"txnguard-{uuid.uuid4().hex[:12]}"


def partitions_of(bootstrap_servers: str, topic: str, partitions: Sequence[int] | None) -> list[int]:
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
    return {p: _stable_end_offset(bootstrap_servers, topic, p, deadline, timeout_s)
            for p in partitions_of(bootstrap_servers, topic, partitions)}


# A partition whose leadership is moving (a broker just restarted, a preferred-leader election) answers these
# until Metadata names the new leader: asked again of whichever broker leads it then.
_LEADER_MOVING = frozenset({ErrorCode.leader_not_available, ErrorCode.not_leader_or_follower,
                            ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch})


def _stable_end_offset(bootstrap_servers: str, topic: str, p: int, deadline: float, timeout_s: float) -> int:
    while True:
        _, host, port = raw.leader_of(bootstrap_servers, topic, p)
        try:
            with raw.RawClient(host, port) as c:
                while True:
                    lso = c.list_offsets(topic, p, read_committed=True)
                    hw = c.list_offsets(topic, p, read_committed=False)
                    if lso == hw:
                        return hw
                    if time.monotonic() > deadline:
                        raise ClientError(f"{topic}-{p}: last stable offset {lso} still below high watermark {hw} "
                                          f"after {timeout_s:.0f}s (an open or hanging transaction)")
                    time.sleep(0.05)
        except raw.RawProtocolError as e:
            if e.error_code not in _LEADER_MOVING or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


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


class PlainProducer(Protocol):
    name: str

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Plain (non-transactional) produce with acks=all; raises unless every value was acknowledged."""
        ...


def copy_of(value: bytes) -> bytes:
    """What a consume-transform-produce copier writes for each value it reads."""
    return b"copy-of-" + value


@dataclass(frozen=True)
class CopiedTransaction:
    committed: bool
    records: dict[int, int]  # output partition -> records this transaction wrote there


@dataclass(frozen=True)
class CopyResult:
    transactions: list[CopiedTransaction]

    @property
    def committed_records(self) -> int:
        return sum(sum(t.records.values()) for t in self.transactions if t.committed)

    @property
    def aborted_records(self) -> int:
        return sum(sum(t.records.values()) for t in self.transactions if not t.committed)

    @property
    def markers(self) -> int:
        """Control records in the output: one per partition a transaction wrote to, committed or aborted."""
        return sum(len(t.records) for t in self.transactions)


class TransactionalCopier(Protocol):
    name: str

    def copy_transactionally(
        self, bootstrap_servers: str, source: str, sink: str, transactional_id: str, group_id: str, count: int,
        *, batch_size: int = 50, abort_first: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CopyResult:
        """Consume-transform-produce, exactly once.

        Read `count` records of `source` as a member of `group_id` (subscribe,
        read_committed, no auto commit), and per polled batch: begin, write
        copy_of(value) to the same partition of `sink`, send the consumed offsets
        to the transaction (send_offsets_to_transaction), commit. With
        `abort_first`, the first batch's transaction is aborted after its records
        were acknowledged and its offsets sent, and the consumer seeks back to
        copy that batch again.
        """
        ...

    def committed_offsets(
        self, bootstrap_servers: str, group_id: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[int, int | None]:
        """The group's committed offset per partition (None: nothing committed), fetched by a fresh consumer."""
        ...


@dataclass(frozen=True)
class PartitionDescription:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: dict[int, PartitionDescription]

    @property
    def fully_led(self) -> bool:
        return bool(self.partitions) and all(p.leader >= 0 for p in self.partitions.values())


class AdminClient(Protocol):
    name: str

    def create_topic(
        self, bootstrap_servers: str, name: str, partitions: int, replication_factor: int,
        *, configs: dict[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """CreateTopics, then wait until this client's own metadata shows a leader for every partition."""
        ...

    def describe_topic(self, bootstrap_servers: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                       ) -> TopicDescription:
        """Partitions with leader, replicas and ISR; raises ClientError for an unknown topic."""
        ...

    def describe_cluster(self, bootstrap_servers: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         ) -> dict[int, tuple[str, int]]:
        """Broker id -> the (host, port) the cluster told this client to use for that broker."""
        ...


def wait_led(describe: Callable[[], TopicDescription | None], name: str, partitions: int, timeout_s: float,
              who: str) -> None:
    """Poll `describe` (None: not visible yet) until every partition of a new topic has a leader."""
    deadline = time.monotonic() + timeout_s
    last: TopicDescription | None = None
    while True:
        last = describe()
        if last is not None and len(last.partitions) == partitions and last.fully_led:
            return
        if time.monotonic() > deadline:
            raise ClientError(f"{who}: topic {name} not led within {timeout_s:.0f}s: {last}")
        time.sleep(0.1)


@dataclass(frozen=True)
class ConsumedRecord:
    partition: int
    offset: int
    value: bytes


class GroupMember:
    """One member of a consumer group, polling in its own thread until stopped.

    It subscribes with the client's eager assignors, auto-commits every 500 ms
    and heartbeats every 500 ms (so a join by another member is noticed
    quickly). Its rebalance timeout (max poll interval) is 30 s, not the
    clients' 300 s: a member that does not rejoin a rebalance within it is
    left out of that round by the coordinator, as Kafka does, and joins the
    next, so one stuck client cannot hold the whole group for five minutes.
    The test thread reads what the member is assigned now, every distinct
    assignment it has had, and every record it has read. Subclasses
    implement `_consume` for one client family; it must call `_seen` after every
    poll and return once `_stopping` is set.
    """

    name = "group-member"
    POLL_S = 0.2
    SESSION_TIMEOUT_MS = 10000
    HEARTBEAT_MS = 500
    AUTO_COMMIT_MS = 500
    MAX_POLL_INTERVAL_MS = 30000  # the rebalance timeout of every client family here, far above POLL_S

    def __init__(self, bootstrap_servers: str, topic: str, group_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group_id = group_id
        self._lock = threading.Lock()
        self._assigned: frozenset[int] = frozenset()
        self._history: list[frozenset[int]] = []
        self._records: list[ConsumedRecord] = []
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> GroupMember:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-member", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Leave the group (the client's close) and wait for the thread; raises if the member failed."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise ClientError(f"{self.name} group member did not stop within {timeout_s:.0f}s")
        self._check()

    def assignment(self) -> frozenset[int]:
        self._check()
        with self._lock:
            return self._assigned

    def assignments(self) -> list[frozenset[int]]:
        with self._lock:
            return list(self._history)

    def records(self) -> list[ConsumedRecord]:
        self._check()
        with self._lock:
            return list(self._records)

    def _run(self) -> None:
        try:
            self._consume()
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self._error = e

    def _consume(self) -> None:
        raise NotImplementedError

    def _seen(self, assigned: Iterable[int], records: Iterable[ConsumedRecord]) -> None:
        now = frozenset(assigned)
        with self._lock:
            if now != self._assigned or not self._history:
                self._history.append(now)
            self._assigned = now
            self._records.extend(records)

    def _check(self) -> None:
        if self._error is not None:
            raise ClientError(f"{self.name} group member failed: {self._error!r}") from self._error


class GroupClient(Protocol):
    name: str

    def group_member(self, bootstrap_servers: str, topic: str, group_id: str) -> GroupMember:
        """A member of `group_id` subscribed to `topic`, not started yet."""
        ...


def batch_bounds(offsets: Iterable[tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition: the first offset of a polled batch, and the offset after its last record."""
    first: dict[int, int] = {}
    after: dict[int, int] = {}
    for p, o in offsets:
        first[p] = min(first.get(p, o), o)
        after[p] = max(after.get(p, o + 1), o + 1)
    return first, after


def per_partition(partitions: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for p in partitions:
        counts[p] = counts.get(p, 0) + 1
    return counts


# -- paced transactions (each family's `paced_transactions`) ----------------------------------------


AckHook = Callable[[int, int], None]


@dataclass(frozen=True)
class PacedResult:
    committed: list[bytes]  # every value of every committed transaction, in send order
    aborted: int  # transactions aborted after an abortable error, then redone with the same values
    errors: list[str]  # the abortable errors, for the failure message and the report


def paced_values(transactional_id: str, transaction: int, per_transaction: int) -> list[bytes]:
    return [f"{transactional_id}-t{transaction}-r{i}".encode() for i in range(per_transaction)]


class PacedClient(Protocol):
    name: str

    def paced_transactions(
        self, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
        partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
        settings: dict[str, Any] | None = None,
    ) -> PacedResult:
        """`transactions` transactions of `per_transaction` records each, one Produce request per record.

        `settings` are the client library's own producer settings on top of the defaults (kafka-python
        keyword arguments, librdkafka properties, sarama.Config names), e.g. a small retry budget; not
        aiokafka.

        Each record is sent alone and its acknowledgement awaited before the next (linger 0), so a
        transaction is a long row of small Produce requests to one partition, all after the single
        AddPartitionsToTxn of that transaction. `on_ack(transaction, record)` runs in the producing
        thread after each acknowledgement, before the next send: a test can freeze a broker there and
        know the very next request is a Produce. An abortable error aborts the transaction and redoes
        it with the same values, as an application does; a fatal one raises ClientError.
        """
        ...


def no_ack(transaction: int, record: int) -> None:
    """The `on_ack` of a paced run that has none."""

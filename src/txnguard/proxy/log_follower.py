"""The follower of the coordinator's log: reads `__transaction_state` and keeps the pure view current.

Every proxy runs one (gateway and sidecar alike): the topic is small, and each record is what the
coordinator decided before it answered its client (verification/transaction_log_view.py says what the
records may decide). It reads with the proxy's own principal (DESCRIBE and READ on the topic), on its
own connections, without a consumer group (plain Fetch at offsets it keeps itself):

* a background loop per partition leader long-polls Fetch (v12, every broker from 2.8 to 4.4 takes it)
  for all the partitions that broker leads, from the position the view holds;
* `sync(partition)` answers "has the view read everything appended before now?": one Fetch that does
  not wait (on a second connection, so it never queues behind a long poll), applied, repeated until the
  position reaches the high watermark it reports. The coordinator answers its client only once its
  record is replicated (acks=all), so anything the client heard of before its write is below that
  high watermark;
* Metadata is read again on a leader error, a connection error or every `metadata_refresh_s`; a new
  leader continues from the view's position (the log is the same log). Each Fetch carries the leader epoch
  Metadata named: a broker that lost the leadership answers FENCED_LEADER_EPOCH, not what it holds as a
  follower (Fetch v11+ reads from followers), whose high watermark lags the leader's: a record the coordinator
  had acknowledged would be missing from a view "read to its end" (a false refusal, seen when the copier's
  __transaction_state partition moved). A new leader's own watermark counts once ListOffsets
  answers it is past the start of its epoch (KIP-207): until then it may lag what the old leader acknowledged.
  A partition passes nothing at once on the view unless the last answer that listed it came from its leader as
  Metadata names it now (`_listed_by`): after a move, the new leader's long poll may be live for the partitions it
  led before, while the view of this one is where the old leader's last answer left it (records the old leader had
  acknowledged may be missing: an Ongoing that is over would pass a late write). Such a write has the log read to
  its end first (`sync`), as any write the log does not pass at once.

Idle. A long poll costs a Fetch round or two per transaction of the cluster, whether or not any write needs the
log: a gateway whose clients' writes all pass on what it saw itself (their AddPartitionsToTxn came through it)
never asks it. `idle_after_s` after the last write that asked the log (`verdicts`), each leader's loop reads to
the end every `idle_read_s` instead of long-polling; the next write that asks wakes the loops and is decided only
once the log is read to its end as of its arrival (`sync`), as any write the log does not pass at once. A
partition's writes pass at once on the view only while its leader's long poll is live (`_live`: it has answered and
goes on), never on a view an idle read left behind. What an idle follower gives later: readiness and the lag
metrics (as of the last read), the ids that bypass txnguard, and the end of a transaction that an absorbed
CONCURRENT_TRANSACTIONS waits for (then only its own pauses end it).

Health is per partition: the log decides for a transactional id only once the follower has read that id's
partition to its high watermark, and while its leader answers. `caught_up_once` is readiness: every
partition read once (a gateway), or every partition its own broker leads (a sidecar: the others are read
through the other sidecars, which may not be up yet; a sidecar waiting for them would wait forever in a
rollout that starts sidecars one at a time). Lag in records and the age of the last caught-up moment are
metrics, the records it could not read are counted and logged (`Applied`). Denied READ or DESCRIBE: a log
line, the access metric, /readyz detail; the proxy works as without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v4.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from txnguard.codecs import log_fetch
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.errors import CodecError, DecodeFailed
from txnguard.codecs.log_fetch import (
    FETCH_SESSION_ID_NOT_FOUND,
    FINAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    NO_SESSION,
    FetchSession,
    LogAnswer,
    LogPartition,
    Wanted,
)
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.codecs.transaction_log import TOPIC, Decoded, PartitionRead
from txnguard.proxy import logs
from txnguard.proxy.config import HostPort
from txnguard.proxy.kafka_client import CLIENT_ID, BrokerConnection, BrokerConnections, UpstreamError
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.proxy.tasks import cancel_and_wait
from txnguard.verification.access import missing_acl
from txnguard.verification.transaction_log_view import APPLIED_BY_KIND, Applied, TransactionLogView
from txnguard.verification.verdicts import Verdict

_STATE, _TOMBSTONE = Applied.STATE, Applied.TOMBSTONE
# How a stretch of long polls ended (`_poll`), for `_follow`: go round again, or every partition answered an error.
_AGAIN, _ALL_FAILED = "again", "all failed"

FETCH_MAX_BYTES = 4 * 1024 * 1024
PARTITION_MAX_BYTES = 1024 * 1024
SESSION_ERRORS = frozenset({FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH})
LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                           ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch,
                           ErrorCode.leader_not_available, ErrorCode.kafka_storage_error})


class LogFollower:
    def __init__(self, view: TransactionLogView, metrics: ProxyMetrics, bootstrap: Callable[[], tuple[HostPort, ...]],
                 address_of: Callable[[str, int], HostPort], *, ssl_context: Any = None, auth: Any = None,
                 connect_timeout_s: float = 5.0, timeout_s: float = 5.0, max_wait_ms: int = 500,
                 metadata_refresh_s: float = 30.0, idle_after_s: float | None = None, idle_read_s: float = 5.0,
                 on_refused: Callable[[Any], None] | None = None,
                 on_proved: Callable[[tuple[str, str, str]], None] | None = None, log: Any = None) -> None:
        self.view = view
        self.metrics = metrics
        self.bootstrap = bootstrap
        self.address_of = address_of
        self.timeout_s = timeout_s
        self.max_wait_ms = max_wait_ms
        self.metadata_refresh_s = metadata_refresh_s
        self.on_refused, self.on_proved = on_refused, on_proved
        # Idle (see the module): `idle_after_s` after the last write that asked the log (the start counts as one),
        # a read to the end every `idle_read_s` instead of the long poll. None: always the long poll.
        self.idle_after_s, self.idle_read_s = idle_after_s, idle_read_s
        self._asked_at = time.monotonic()
        self._live: set[HostPort] = set()  # leaders whose long poll answered and goes on: their partitions pass at once
        # partition -> the leader whose answer last listed it (no error): its writes pass at once only if that is
        # its leader now (a partition whose leader moved waits for an answer of the new one)
        self._listed_by: dict[int, HostPort] = {}
        self._wakes: dict[HostPort, asyncio.Event] = {}  # an idle leader loop's rest ends early when a write asks
        self._polls = BrokerConnections(ssl_context=ssl_context, connect_timeout_s=connect_timeout_s, auth=auth)
        self._syncs = BrokerConnections(ssl_context=ssl_context, connect_timeout_s=connect_timeout_s, auth=auth)
        # What Metadata said, and what each round reads of it without walking every partition (`_plan`): the
        # partitions each leader leads, those whose leader epoch is not known to be started, and a version that
        # moves when either changes (a fetch session then starts over with a full Fetch).
        self._leaders: dict[int, HostPort] = {}      # partition -> its leader's address
        # partition -> its leader's epoch as Metadata named it, sent in every Fetch (a broker that no longer leads
        # it answers FENCED_LEADER_EPOCH instead of what it holds as a follower, to its own, older high watermark)
        self._leader_epochs: dict[int, int] = {}
        self._epoch_checked: dict[int, int] = {}   # partition -> the epoch whose leader's watermark reached its start
        self._led_by: dict[HostPort, list[int]] = {}
        self._epochs_unchecked: set[int] = set()
        self._plan_version = 0
        self.high_watermarks: dict[int, int] = {}
        self.caught_up_at: dict[int, float] = {}     # partition -> monotonic time it last reached the watermark
        self._behind: set[int] = set()               # partitions whose last Fetch ended below the high watermark
        self._failing: set[HostPort] = set()         # leaders whose last Fetch failed: their partitions decide nothing
        self.own: set[int] = set()                   # partitions its own broker leads (a sidecar's readiness)
        # A sidecar: its own listener's address (as Metadata names it) -> its broker's, read directly.
        self.local: Callable[[HostPort], HostPort | None] | None = None
        self.caught_up_once = False
        self._said: set[tuple[int, Applied]] = set()
        self._sync_current: dict[int, asyncio.Task[bool]] = {}  # the one read-to-the-end Fetch per partition
        self._sync_next: dict[int, asyncio.Task[bool]] = {}     # the one after it, for the writes that came since
        self.topic_exists: bool | None = None
        self.problem: str | None = None              # why it cannot follow now (/readyz detail)
        self.denied = False                          # the proxy's principal may not read the topic: not followed
        self.on_usable: Callable[[], None] | None = None  # told when `usable` changes (readiness is reconsidered)
        self._metadata_stale = asyncio.Event()
        self._loops: dict[HostPort, asyncio.Task[None]] = {}
        self._sessions: dict[HostPort, FetchSession] = {}  # the long poll's fetch session with each leader
        self._moved: set[int] = set()  # partitions whose position moved since their session's last request
        # transactional id -> what to call once the log shows its transaction ended (`when_ended`)
        self._ending: dict[str, list[Callable[[], None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # `log`: another logger (`txnguard hanging` reads the log once and says what went wrong in its own words).
        self.log = log if log is not None else logs.get(component="log_follower")
        self._register_metrics()

    # -- what Metadata said -----------------------------------------------------------------------------

    @property
    def leaders(self) -> dict[int, HostPort]:
        return self._leaders

    @leaders.setter
    def leaders(self, leaders: dict[int, HostPort]) -> None:
        if leaders != self._leaders:
            self._leaders = leaders
            self._plan()

    @property
    def leader_epochs(self) -> dict[int, int]:
        return self._leader_epochs

    @leader_epochs.setter
    def leader_epochs(self, epochs: dict[int, int]) -> None:
        if epochs != self._leader_epochs:
            self._leader_epochs = epochs
            self._plan()

    def _plan(self) -> None:
        led_by: dict[HostPort, list[int]] = {}
        for p in sorted(self._leaders):
            led_by.setdefault(self._leaders[p], []).append(p)
        self._led_by = led_by
        self._epochs_unchecked = {p for p, e in self._leader_epochs.items()
                                  if e >= 0 and self._epoch_checked.get(p) != e}
        self._plan_version += 1

    # -- life cycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._loops.values(), *self._sync_current.values(),
                             *self._sync_next.values()) if t is not None]
        self._closed = True  # a loop that lost its cancellation (tasks.py) ends at its next turn
        await cancel_and_wait(tasks, self.log)
        self._polls.close()
        self._syncs.close()

    async def _run(self) -> None:
        while not self._closed:
            try:
                await self._refresh_metadata()
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                self._say_problem(f"no Metadata for {TOPIC}: {e!r}")
            self._metadata_stale.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._metadata_stale.wait(), self.metadata_refresh_s)

    async def read_once(self, budget_s: float) -> set[int]:
        """Read the whole log to its end as of now, once, without following it (`txnguard hanging`): Metadata, then
        `read_to_end` of every partition. The partitions read to their end; `denied`, `topic_exists` and `problem`
        say why others were not."""
        try:
            await self._refresh_metadata(follow=False)
        except (UpstreamError, OSError, CodecError, TimeoutError) as e:
            self._say_problem(f"no Metadata for {TOPIC}: {e!r}")
            return set()
        if self.denied or not self.topic_exists:
            return set()
        return await self.read_to_end(self.leaders, budget_s)

    async def _refresh_metadata(self, *, follow: bool = True) -> None:
        answer = await self._any_broker(MetadataRequest(
            topics=(MetadataRequestTopic(name=TopicName(TOPIC)),), allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
        brokers = {int(b.node_id): self.address_of(str(b.host), int(b.port)) for b in answer.brokers}
        topic = answer.topics[0] if answer.topics else None
        code = int(topic.error_code) if topic is not None else ErrorCode.unknown_topic_or_partition
        if code == ErrorCode.unknown_topic_or_partition:
            # No transaction yet on this cluster: the coordinator creates the topic with its first one. Nothing
            # to read is caught up; Metadata is asked again until the topic appears.
            self.topic_exists = False
            was = self.usable
            self.caught_up_once = True
            self.problem = None
            if not was and self.on_usable is not None:
                self.on_usable()
            asyncio.get_running_loop().call_later(min(self.metadata_refresh_s, 2.0), self._metadata_stale.set)
            return
        missing = missing_acl("transaction_log_metadata", code, TOPIC)
        if missing is not None:
            if self.on_refused is not None:
                self.on_refused(missing)
            self._deny()
            self._say_problem(f"the proxy may not DESCRIBE {TOPIC}: the coordinator's log is not followed")
            return
        self.denied = False
        self.topic_exists = True
        self.view.partition_count = len(topic.partitions)  # type: ignore[union-attr]
        leaders = {int(p.partition_index): brokers[int(p.leader_id)] for p in topic.partitions  # type: ignore[union-attr]
                   if int(p.leader_id) in brokers}
        if self.local is not None:
            mapped = {p: self.local(a) for p, a in leaders.items()}
            self.own = {p for p, a in mapped.items() if a is not None}
            leaders = {p: mapped[p] or a for p, a in leaders.items()}
        self.leaders = leaders
        self.leader_epochs = {int(p.partition_index): int(p.leader_epoch) for p in topic.partitions}  # type: ignore[union-attr]
        self._check_caught_up()
        for p in leaders:
            self.view.positions.setdefault(p, 0)
        if not follow:
            return
        for address in set(leaders.values()):
            task = self._loops.get(address)
            if task is None or task.done():
                self._loops[address] = asyncio.get_running_loop().create_task(self._follow(address))

    async def _any_broker(self, payload: Any) -> Any:
        last: Exception | None = None
        for address in self.bootstrap():
            try:
                conn = await asyncio.wait_for(asyncio.shield(self._syncs.get(address)), self.timeout_s)
                return await conn.request(payload, self.timeout_s)
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                last = e
                self._syncs.drop(address)
        raise UpstreamError(f"no bootstrap broker answered: {last!r}")

    # -- reading ------------------------------------------------------------------------------------------

    async def _follow(self, address: HostPort) -> None:
        """Long-poll the partitions `address` leads, while it leads any."""
        backoff = 0.1
        while not self._closed:
            plan, partitions = self._plan_version, self._led_by.get(address)
            if not partitions:
                return
            try:
                conn = self._polls.ready(address)
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.shield(self._polls.get(address)), self.timeout_s)
                # A new leader's watermark not past its epoch's start yet: a short poll, then asked again.
                started = self._epochs_unchecked.isdisjoint(partitions) or await self._epochs_started(conn, partitions)
                if plan != self._plan_version:
                    # The plan moved while this loop awaited: these partitions may no longer be the ones this leader
                    # leads. A session set up with the new plan and the old partitions would never fetch a partition
                    # that moved here (a fault test's follower, at "lag 0", sat 169 records behind on one).
                    continue
                idle = self._idle()
                wait_ms = 0 if idle else self.max_wait_ms if started else min(self.max_wait_ms, 50)
                session = self._sessions.setdefault(address, FetchSession())
                positions = self.view.positions
                before = [positions.get(p, 0) for p in partitions] if idle else None
                try:
                    outcome = await self._poll(conn, address, plan, partitions, session, wait_ms)
                finally:
                    self._live.discard(address)  # until the next stretch's first answer
                if outcome is _ALL_FAILED:
                    # Every partition answered an error, at once (no long poll): READ refused, or all moved away.
                    # Asked again after a backoff, as after a connection error, not in a loop of round trips (a
                    # principal with DESCRIBE and no READ sent some 5,000 Fetches a second to the broker).
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                else:
                    backoff = 0.1
                    # Idle: read to the end (more than a Fetch's bytes: at once again), then the next read after
                    # idle_read_s; a read that moved nothing (a batch this reader cannot open) rests too, not a loop
                    # of Fetches that do not wait.
                    if idle and (self._behind.isdisjoint(partitions)
                                 or before == [positions.get(p, 0) for p in partitions]):
                        await self._rest(address)
            except (UpstreamError, OSError, CodecError, TimeoutError) as e:
                self._failing.add(address)
                self._polls.drop(address)
                self._sessions.pop(address, None)  # its id goes with it: the next one closes nothing
                self._say_problem(f"reading {TOPIC} from {address}: {e!r}")
                self._metadata_stale.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _idle(self) -> bool:
        return self.idle_after_s is not None and time.monotonic() - self._asked_at > self.idle_after_s

    def _asked(self) -> None:
        """A write asked the log: long-poll again (the idle loops woken) for `idle_after_s` from now."""
        idle = self._idle()
        self._asked_at = time.monotonic()
        if idle:
            for wake in self._wakes.values():
                wake.set()

    async def _rest(self, address: HostPort) -> None:
        """An idle loop's pause between two reads to the end: `idle_read_s`, or until a write asks the log."""
        wake = self._wakes.setdefault(address, asyncio.Event())
        wake.clear()
        if not self._idle():
            return  # asked since this round
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), self.idle_read_s)

    def _passes_at_once(self, partition: int) -> bool:
        """Whether the view may pass a write of `partition` before reading the log to its end: while its leader's
        long poll is live (always, when the follower never idles), and the last answer that listed it was that
        leader's (see the module)."""
        leader = self._leaders.get(partition)
        if leader is None or self._listed_by.get(partition) != leader:
            return False
        return self.idle_after_s is None or leader in self._live

    def _poll(self, conn: BrokerConnection, address: HostPort, plan: int, partitions: list[int],
              session: FetchSession, wait_ms: int) -> asyncio.Future[object]:
        """Long polls of `partitions` in `session`, one after the other: each answer is applied in the turn of the
        loop that read it, and the next Fetch sent from there (no task woken, no future, no timer per round: the
        follower's cost is per round, several per transaction of the cluster). The returned future ends the
        stretch, for `_follow` to decide: _AGAIN (the plan moved, an epoch to check, the session lost, closing),
        _ALL_FAILED (every partition answered an error), or the error (the connection failed or timed out, an
        answer that does not decode)."""
        stretch: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        timeout_s, full = self.timeout_s + wait_ms / 1000, True
        live = self._live

        def send() -> None:
            nonlocal full
            encode, full = self._fetch_request(partitions, wait_ms, (session, plan))
            conn.send_encoded(ApiKey.FETCH.value, log_fetch.VERSION, encode, timeout_s, answered)

        def answered(body: memoryview | None, error: Exception | None) -> None:
            if stretch.done():
                return  # `_follow` was cancelled (closing): the answer is dropped
            try:
                if error is not None:
                    raise error
                assert body is not None
                answer = log_fetch.read_log_answer(body, self.view.positions)
                session.answered(answer.error_code, answer.session_id)
                self._failing.discard(address)
                if answer.error_code in SESSION_ERRORS:
                    stretch.set_result(_AGAIN)  # the broker dropped the session (evicted, restarted): full at once
                    return
                _, failed = self._apply(answer, address, partitions, complete=full)
                if failed.issuperset(partitions):
                    stretch.set_result(_ALL_FAILED)
                elif (self._closed or plan != self._plan_version or wait_ms != self.max_wait_ms
                      or not self._epochs_unchecked.isdisjoint(partitions) or self._idle()):
                    stretch.set_result(_AGAIN)
                else:
                    live.add(address)  # this answer applied, the next long poll on its way
                    send()
            except Exception as e:  # noqa: BLE001 - to `_follow`, which handles or raises it as its own
                if not stretch.done():
                    stretch.set_exception(e)

        send()
        return stretch

    def _fetch_request(self, partitions: list[int], max_wait_ms: int,
                       in_session: tuple[FetchSession, int] | None) -> tuple[Callable[[int], bytes], bool]:
        """A Fetch of `partitions` from the view's positions, packed by hand (log_fetch.py: with kio, a round at 50
        partitions cost about 1 ms of CPU); `in_session` (the long poll's session, and the version of the plan
        `partitions` come from), only what moved. (Its encoder, whether it lists every partition.)"""
        epochs, positions = self._leader_epochs, self.view.positions
        if in_session is None:
            session_id, epoch, full = NO_SESSION, FINAL_EPOCH, True
            listed = [Wanted(p, epochs.get(p, -1), positions.get(p, 0), PARTITION_MAX_BYTES) for p in partitions]
        else:
            session, plan = in_session
            session_id, epoch, listed, full = session.next(plan, partitions, epochs, positions, PARTITION_MAX_BYTES,
                                                           self._moved)
        self._fetches.value += 1
        return (lambda correlation_id: log_fetch.fetch_request(
            correlation_id, CLIENT_ID, TOPIC, listed, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            session_id=session_id, session_epoch=epoch)), full

    async def _fetch(self, conn: BrokerConnection, partitions: list[int], max_wait_ms: int,
                     timeout_s: float) -> LogAnswer:
        """One sessionless Fetch of `partitions` from the view's positions (a read to the end), read in place."""
        encode, _ = self._fetch_request(partitions, max_wait_ms, None)
        body = await conn.request_encoded(ApiKey.FETCH.value, log_fetch.VERSION, encode, timeout_s)
        return log_fetch.read_log_answer(body, self.view.positions)

    def _epoch_started(self, partition: int) -> bool:
        return partition not in self._epochs_unchecked

    async def _epochs_started(self, conn: Any, partitions: list[int], timeout_s: float | None = None) -> bool:
        """Whether each partition's leader has a high watermark past the start of its epoch, asked once per epoch.

        A leader just elected reports the watermark it knew as a follower until its followers fetch from it: below
        records the previous leader had acknowledged (the coordinator answered its client), which a Fetch that stops
        there would call the end of the log. ListOffsets LATEST answers OFFSET_NOT_AVAILABLE until the watermark
        reached the epoch's start (KIP-207); till then the partition is not read to its end (`_apply`)."""
        asked = {p: self.leader_epochs.get(p, -1) for p in partitions if not self._epoch_started(p)}
        if not asked:
            return True
        latest = tuple(ListOffsetsPartition(partition_index=i32(p), current_leader_epoch=i32(e), timestamp=i64(-1))
                       for p, e in asked.items())
        answer = await conn.request(ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
            ListOffsetsTopic(name=TopicName(TOPIC), partitions=latest),)), timeout_s or self.timeout_s)
        for topic in answer.topics:
            for part in topic.partitions:
                p, code = int(part.partition_index), int(part.error_code)
                if code == ErrorCode.none:
                    self._epoch_checked[p] = asked[p]
                    if asked[p] == self._leader_epochs.get(p, -1):
                        self._epochs_unchecked.discard(p)
                elif code in LEADER_ERRORS:
                    self._metadata_stale.set()
        return all(self._epoch_started(p) for p in partitions)

    def _apply(self, answer: LogAnswer, source: HostPort, asked: Iterable[int], *,
               complete: bool = True) -> tuple[set[int], set[int]]:
        """One Fetch answer of `source` into the view: (the partitions it read to the high watermark it reported,
        those that answered an error other than an offset out of range; all it `asked` for on a top-level error).
        An answer not `complete` (incremental, in a fetch session) leaves out the partitions with no news: one that
        was at its high watermark still is."""
        now = time.monotonic()
        reached: set[int] = set()
        failed: set[int] = set()
        error, _, parts = answer
        if error != ErrorCode.none:
            self._say_problem(f"Fetch of {TOPIC} answered {error}")
            return reached, set(asked)
        read_one = False
        listed_by = self._listed_by
        for part in parts:
            p, code = part.partition, part.error_code
            if code != ErrorCode.none:
                if self._partition_failed(part):
                    failed.add(p)
                continue
            read_one = True
            listed_by[p] = source
            if part.read is not None:
                self._read(p, part.read, part.failure)
            hw = part.high_watermark
            self.high_watermarks[p] = hw
            if self.view.positions.get(p, 0) >= hw and self._epoch_started(p):
                self.caught_up_at[p] = now
                self._behind.discard(p)
                reached.add(p)
            else:
                self._behind.add(p)  # more than one Fetch holds, or a batch it could not read stopped it
        if not complete:
            reached |= self._unlisted_at_end(asked, {part.partition for part in parts}, now)
        if read_one:
            self.denied = False
            if self.on_proved is not None:
                self.on_proved(("READ", "Topic", TOPIC))
        self._check_caught_up()
        return reached, failed

    def _unlisted_at_end(self, asked: Iterable[int], listed: set[int], now: float) -> set[int]:
        """The partitions an incremental answer left out that are at their end: the broker lists a partition only
        with news (records, a new watermark), so one left out still has the watermark last read. One that was
        below it only because its new leader's epoch had not started yet is at its end once the epoch has (no
        news would ever come to say so: a fault test's follower waited forever on such a partition)."""
        caught_up_at, behind, hws = self.caught_up_at, self._behind, self.high_watermarks
        positions = self.view.positions
        unlisted = set(asked).difference(listed)
        at_end = (unlisted - behind).intersection(caught_up_at)  # set operations: no Python loop per partition
        for p in unlisted & behind:
            hw = hws.get(p)
            if hw is not None and positions.get(p, 0) >= hw and self._epoch_started(p):
                behind.discard(p)
                at_end.add(p)
        caught_up_at.update(dict.fromkeys(at_end, now))
        return at_end

    def _partition_failed(self, part: LogPartition) -> bool:
        """A partition's error: whether it failed (an offset out of range does not: the log's start moved)."""
        p, code = part.partition, part.error_code
        if code == ErrorCode.offset_out_of_range:
            # Compaction or retention removed the start of the log: continue at its start (what was
            # removed was superseded: compaction keeps each id's latest record).
            self.view.positions[p] = max(self.view.positions.get(p, 0), part.log_start_offset)
            self._moved.add(p)
            return False
        if code in LEADER_ERRORS:
            self._metadata_stale.set()
            return True
        missing = missing_acl("transaction_log_fetch", code, TOPIC)
        if missing is not None:
            self._deny()
            if self.on_refused is not None:
                self.on_refused(missing)
        self._say_problem(f"Fetch of {TOPIC}-{p} answered {code}")
        return True

    def _readiness_partitions(self) -> set[int]:
        return self.own if self.local is not None else set(self.leaders)

    def _check_caught_up(self) -> None:
        """Caught up once: every partition readiness waits for read to its high watermark (see the module)."""
        if self.caught_up_once and self.problem is None:
            return  # nothing to say again (every answer comes here: no walk of every partition for nothing)
        wanted = self._readiness_partitions()
        if all(self.partition_usable(p) for p in wanted) and (not self.caught_up_once or self.problem is not None):
            first = not self.caught_up_once
            self.caught_up_once = True
            self.problem = None
            if first:
                self.log.info("transaction_log_caught_up", partitions=len(wanted), ids=len(self.view),
                              records=sum(self.view.counts.values()))
            if self.on_usable is not None:
                self.on_usable()

    def partition_usable(self, partition: int) -> bool:
        """The log may decide for the ids of `partition`: read to its high watermark once, not stopped below it
        (a batch it could not read), and its leader answering."""
        leader = self.leaders.get(partition)
        return (not self.denied and leader is not None and leader not in self._failing
                and partition in self.caught_up_at and partition not in self._behind)

    def _read(self, partition: int, read: PartitionRead, failure: DecodeFailed | None) -> None:
        """A partition's records, decoded and reduced with the answer (`read_log_answer`: each id's last record, every
        unreadable one), into the view; `failure`: what stopped their reading. Once per partition of every long
        poll's answer: kept to a few steps when it carries a record or two."""
        self.view.apply_read(partition, read)
        state, tombstone, unknown, malformed = read.counts
        counted = self._counters
        if state:
            counted[0].value += state
        if tombstone:
            counted[1].value += tombstone
        if unknown or malformed:
            counted[2].value += unknown
            counted[3].value += malformed
            self._unreadable(partition, read.kept)
        if self._ending:
            for txn_id in read.ended:
                if txn_id in self._ending:
                    self._ended(txn_id)
        if read.next_offset is not None:
            self._moved.add(partition)  # its offset in the fetch session moves (`FetchSession.next`)
        if failure is not None:
            # A batch this reader cannot open: its records are unread. Skipping would decide on states older than
            # the log's; so stop this partition here and say so (writes of its ids go to the next source).
            self._say_problem(f"{TOPIC}-{partition} at offset {self.view.positions.get(partition, 0)}: {failure}")

    def _unreadable(self, partition: int, kept: list[Decoded]) -> None:
        """Records of `partition` this reader could not read: said once per partition and kind (the metric counts
        them all)."""
        for offset, kind, _, _ in kept:
            applied = APPLIED_BY_KIND[kind]
            if applied is not _STATE and applied is not _TOMBSTONE and (partition, applied) not in self._said:
                self._said.add((partition, applied))
                self.log.warning("transaction_log_record_unreadable", partition=partition, offset=offset,
                                 outcome=applied.value, detail="its id is asked of the coordinator instead")

    def when_ended(self, txn_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (soon, on this loop) once a record read says `txn_id`'s transaction ended
        (codecs/transaction_log.py's `ENDED`, or the id removed): the coordinator accepts its next transaction then.
        An absorption of CONCURRENT_TRANSACTIONS asks again at that moment instead of when its pause runs out
        (proxy/session.py). Returns what forgets the callback (its pause ran out first)."""
        callbacks = self._ending.setdefault(txn_id, [])
        callbacks.append(callback)

        def forget() -> None:
            found = self._ending.get(txn_id)
            if found is not None and callback in found:
                found.remove(callback)
                if not found:
                    del self._ending[txn_id]

        return forget

    def _ended(self, txn_id: str) -> None:
        loop = asyncio.get_running_loop()
        for callback in self._ending.pop(txn_id, ()):
            loop.call_soon(callback)  # after this answer is applied, not inside the follower's round

    async def sync(self, partition: int, budget_s: float) -> bool:
        """Read `partition` up to the high watermark as of now; True once there, False past the budget.

        At most one such Fetch per partition is in flight: a write that comes while one is on its way (it may
        have been sent before the write came) waits for the next, which starts when the current one ends and
        serves every write that came meanwhile. Under load that is one Fetch per round trip, not one per write."""
        if self.leaders.get(partition) is None or partition not in self.caught_up_at:
            return False
        loop = asyncio.get_running_loop()
        current = self._sync_current.get(partition)
        if current is None or current.done():
            task = self._sync_current[partition] = loop.create_task(self._read_to_end(partition, budget_s))
        else:
            task = self._sync_next.get(partition)  # type: ignore[assignment]
            if task is None or task.done():
                task = self._sync_next[partition] = loop.create_task(self._after(current, partition, budget_s))
        try:
            return await asyncio.wait_for(asyncio.shield(task), budget_s)
        except TimeoutError:
            return False

    async def _after(self, current: asyncio.Task[bool], partition: int, budget_s: float) -> bool:
        await asyncio.wait([current])
        self._sync_current[partition] = asyncio.current_task()  # type: ignore[assignment]
        if self._sync_next.get(partition) is asyncio.current_task():
            del self._sync_next[partition]
        return await self._read_to_end(partition, budget_s)

    async def _read_to_end(self, partition: int, budget_s: float) -> bool:
        return partition in await self.read_to_end([partition], budget_s)

    async def read_to_end(self, partitions: Iterable[int], budget_s: float) -> set[int]:
        """Read each of `partitions` up to its high watermark as of now: Fetches that do not wait, to its leader on
        the sync connections (never queued behind a long poll), applied, repeated while they make progress. The
        partitions that got there within `budget_s`. Left out: one without a leader, one whose leader answers an
        error or does not answer, one that stops short (a batch this reader cannot open). `sync` (one partition, a
        write's) and the hanging scan (every partition, once) both read this way."""
        deadline = time.monotonic() + budget_s
        by_leader: dict[HostPort, list[int]] = {}
        for p in partitions:
            address = self.leaders.get(p)
            if address is not None:
                by_leader.setdefault(address, []).append(p)
        read = await asyncio.gather(*(self._read_leader_to_end(a, ps, deadline) for a, ps in by_leader.items()))
        return set().union(*read)

    async def _read_leader_to_end(self, address: HostPort, partitions: list[int], deadline: float) -> set[int]:
        pending, reached = set(partitions), set[int]()
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                before = {p: self.view.positions.get(p, 0) for p in pending}
                conn = self._syncs.ready(address)
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.shield(self._syncs.get(address)), left)
                started = await self._epochs_started(conn, sorted(pending), left)
                asked = sorted(pending)
                answer = await self._fetch(conn, asked, 0, left)
                done, failed = self._apply(answer, address, asked)
                reached |= done & pending
                # A partition that moved on is asked again, as one whose new leader's watermark is not past its
                # epoch's start yet; one that did neither (an unreadable batch) is not.
                pending = {p for p in pending - done - failed
                           if self.view.positions.get(p, 0) > before[p] or not self._epoch_started(p)}
                if not started:
                    await asyncio.sleep(0.02)
        except (UpstreamError, OSError, CodecError, TimeoutError):
            self._syncs.drop(address)
        return reached

    # -- evidence -----------------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Caught up once and reading: its view may decide."""
        return self.caught_up_once and self.problem is None

    @property
    def gives_evidence(self) -> bool:
        """Readiness's view: followed (catching up, or back after a transient error), not denied. A transient
        error makes writes ask the next source for a moment; it does not take the proxy out of service."""
        return not self.denied

    async def verdicts(self, txn_id: str, producer_id: int, epoch: int, tps: list[TopicPartition],
                       wait_s: float) -> dict[TopicPartition, Verdict]:
        """The log's verdicts on a write's partitions: passes at once; the rest once the follower has read the
        id's partition up to its end as of now (at most `wait_s`). A partition left out is not decided here."""
        view = self.view
        self._asked()
        partition = view.partition_of(txn_id)
        if partition is None or not self.partition_usable(partition):
            if self.denied or not await self._partition_read(txn_id, wait_s):
                return {}  # a proxy just started waits a moment for the first read; then the next source
            partition = view.partition_of(txn_id)
            if partition is None or not self.partition_usable(partition):
                return {}
        found: dict[TopicPartition, Verdict] = {}
        if self._passes_at_once(partition):
            for tp in tps:
                v = view.verdict(txn_id, producer_id, epoch, tp, caught_up=False)
                if v is not None:
                    found[tp] = v
        rest = [tp for tp in tps if tp not in found]
        if not rest or not await self.sync(partition, wait_s):
            return found
        for tp in rest:
            v = view.verdict(txn_id, producer_id, epoch, tp, caught_up=True)
            if v is not None:
                found[tp] = v
        return found

    def _deny(self) -> None:
        if not self.denied:
            self.denied = True
            if self.on_usable is not None:
                self.on_usable()  # readiness without the log's evidence (an enforcing 2.8 sidecar is not ready)

    async def _partition_read(self, txn_id: str, wait_s: float) -> bool:
        """Wait (at most `wait_s`) for the id's partition if the follower has not read it to its end yet (a
        proxy just started); one read before and not usable now (its leader fails) is not waited for."""
        partition = self.view.partition_of(txn_id)
        if partition is not None and partition in self.caught_up_at:
            return False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            partition = self.view.partition_of(txn_id)
            if partition is not None and self.partition_usable(partition):
                return True
            await asyncio.sleep(0.01)
        return False

    # -- health -------------------------------------------------------------------------------------------

    def _say_problem(self, problem: str) -> None:
        if problem != self.problem:
            self.log.warning("transaction_log_not_followed", detail=problem)
        was = self.usable
        self.problem = problem
        if was and self.on_usable is not None:
            self.on_usable()

    def lag_records(self) -> int:
        return sum(max(self.high_watermarks.get(p, 0) - self.view.positions.get(p, 0), 0) for p in self.leaders)

    def lag_seconds(self) -> float:
        """How long since the least recent partition was last read to its high watermark."""
        if not self.leaders:
            return 0.0
        now = time.monotonic()
        return max(now - self.caught_up_at.get(p, 0.0) for p in self.leaders) if self.caught_up_once else float("inf")

    def detail(self) -> str:
        """/readyz's words on the follower."""
        if self.problem is not None:
            return f"transaction log: {self.problem}"
        if not self.caught_up_once:
            return f"transaction log: catching up ({self.lag_records()} records behind)"
        return f"transaction log: {len(self.view)} ids, {self.lag_records()} records behind"

    def _register_metrics(self) -> None:
        m = self.metrics
        m.log_follower_lag_records.set_function(lambda: float(self.lag_records()))
        m.log_follower_lag_seconds.set_function(
            lambda: self.lag_seconds() if self.caught_up_once else -1.0)
        m.log_follower_ids.set_function(lambda: float(len(self.view)))
        m.log_follower_idle.set_function(lambda: 1.0 if self._idle() else 0.0)
        # Plain counters, read when /metrics is: a round counts a Fetch and its records without a lock or a call.
        # By codecs/transaction_log.py's index of each kind, as a read counts them.
        self._counters = tuple(m.log_follower_records.labels(a.value) for a in APPLIED_BY_KIND)
        self._fetches = m.log_follower_fetches.labels()

"""The transaction guard's IO half: the Verifier, metrics, logs and the audit log.

The decisions themselves (what is watched, which requests are checked, what
counts as added, the verdicts' consequences) are pure and live in
`txnguard.verification.decisions`; each connection core calls them. This module
answers the questions the cores ask (`answer`), and writes down every decision
they report (`record`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, assert_never

from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.topic_partition import TopicPartition
from txnguard.connection.ledger import Ledger, Passed, PassedOffsets
from txnguard.policies.enforcement import Enforcement
from txnguard.policies.policy import Policy
from txnguard.proxy import logs
from txnguard.proxy.config import HostPort, ProxyConfig, ProxyMode
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.proxy.tasks import cancel_and_wait
from txnguard.proxy.verifier import Verifier
from txnguard.verification.audit import (
    ClientInfo,
    audit_record,
    connection_record,
    end_txn_hold_record,
    identified,
    record_key,
    transaction_log_id_record,
)
from txnguard.verification.bypass import Entry, SeenIds, active_entries, capped, unseen_count
from txnguard.verification.checks import (
    Answer,
    AwaitEndTxn,
    CountOffsetsPartitions,
    DescribeTransaction,
    EndTxnSettled,
    EndTxnStillInDoubt,
    HeldForEndTxn,
    OffsetCommitWrite,
    OffsetsPartitionCount,
    OffsetsPartitionCountFailed,
    PartitionVerdicts,
    ProduceWrite,
    Question,
    TimedOutEndTxn,
    TimedOutInitProducerId,
    TransactionDescription,
    TransactionDescriptionFailed,
    VerifyPartitions,
)
from txnguard.verification.concurrent import concurrent_retry
from txnguard.verification.decisions import (
    FORWARDED,
    Clock,
    Decision,
    TransactionRules,
)
from txnguard.verification.hold_limits import HoldLimits, worth_asking_again
from txnguard.verification.in_doubt import Ending, EndTxnLedger, InDoubtLimits, SentEndTxn
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.registry import Registry, RegistryLimits
from txnguard.verification.transaction_log_view import TransactionLogView
from txnguard.verification.verdicts import Verdict

if TYPE_CHECKING:
    from txnguard.proxy.audit_sink import AuditPublisher


def evidence_ttl(config: ProxyConfig) -> int | None:
    """How long evidence not ended by an observed EndTxn stays valid.

    A gateway sees each client's whole life cycle, so evidence lasts until EndTxn,
    InitProducerId or the transaction timeout (None). A sidecar sees EndTxn only
    for transactions its broker coordinates, and an old client keeps its epoch
    across transactions, so by default a sidecar never reuses evidence (0 ms):
    every first write per request is checked with the leader or the coordinator.
    """
    if config.verification.evidence_ttl_ms is not None:
        return config.verification.evidence_ttl_ms
    return None if config.mode is ProxyMode.GATEWAY else 0


def now_ms() -> int:
    return int(time.time() * 1000)


class SystemClock:
    """The connection cores' clock: wall milliseconds, a monotonic clock and this thread's CPU time."""

    wall_ms = staticmethod(now_ms)
    perf = staticmethod(time.perf_counter)
    cpu = staticmethod(time.thread_time)


class AuditLog:
    """Every audit record, one JSON text each: a line to a file (appended) or stdout ("-"), and to the
    audit topic's publisher when one is attached (proxy/audit_sink.py; it never blocks)."""

    def __init__(self, path: str | None, on_enabled: Callable[[bool], None] | None = None) -> None:
        self._on_enabled = on_enabled  # told whether anything reads the records, at start and on attach
        self._out: IO[str] | None
        if path is None:
            self._out = None
        elif path == "-":
            self._out = sys.stdout
        else:
            self._out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the proxy
        self._sink: AuditPublisher | None = None
        self.proxy_id = ""  # set by Proxy.start, once the bootstrap listener's port is known
        self.written = 0
        # Called before every record `write` takes (the guard's: records booked earlier go first).
        self.before_write: Callable[[], None] | None = None
        if on_enabled is not None:
            on_enabled(self.enabled)

    def attach(self, sink: AuditPublisher) -> None:
        self._sink = sink
        if self._on_enabled is not None:
            self._on_enabled(self.enabled)

    @property
    def enabled(self) -> bool:
        return self._out is not None or self._sink is not None

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            if self.before_write is not None:
                self.before_write()
            self.write_text(json.dumps(record, separators=(",", ":")), record_key(record))

    def write_text(self, text: str, key: str | None) -> None:
        """A record already serialised as `write` does it; `key` its record_key."""
        if self._out is not None:
            self._out.write(text + "\n")
        if self._sink is not None:
            self._sink.publish(key, text.encode())
        self.written += 1

    def write_texts(self, records: list[tuple[str, str | None]]) -> None:
        """`write_text` of each (text, key) in turn; the file gets them in one write (the same bytes)."""
        if self._out is not None:
            self._out.write("".join([f"{text}\n" for text, _ in records]))
        if self._sink is not None:
            for text, key in records:
                self._sink.publish(key, text.encode())
        self.written += len(records)

    def connection_closed(self, client: ClientInfo, inventory: ConnectionInventory, reason: str) -> None:
        """The connection record of a client that identified itself (the client inventory)."""
        if not self.enabled:
            return
        if identified(client):
            self.write(connection_record(time_ms=now_ms(), proxy_id=self.proxy_id, client=client,
                                         inventory=inventory, close_reason=reason))

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
        self._out = None  # records after this (late closes) still reach the publisher until it stops


# The relay's ledger (connection/ledger.py) is recorded in batches: at the latest LEDGER_DELAY_S after a read
# left something in it, at once past LEDGER_BOUND entries, and before whatever could show its absence.
LEDGER_DELAY_S = 0.05
# 50 ms, not 5: at 5 ms a one-record transaction loop (one every 4-10 ms) had nearly every transaction recorded on
# a timer of its own, a wake-up of the loop each; 50 ms measured 15 % less gateway CPU per transaction with
# confluent-kafka and more transactions per second in every round (bench/short_transactions.py --compare-rev).
# The cost: a SIGKILLed proxy loses up to the last 50 ms of passed-write records (docs/operations/audit.md).
LEDGER_BOUND = 64
# A round of transaction_log_id records lists at most this many ids (the unseen first; the rest counted), reading
# the view LOG_IDS_SLICE ids a turn of the event loop (and writing a twentieth of that many records a turn).
MAX_LOG_ID_RECORDS = 10_000
LOG_IDS_SLICE = 20_000
# The unseen-ids gauge is counted again at most this often (one pass over the view: 100,000 ids cost 30-75 ms).
UNSEEN_REFRESH_S = 10.0
_SETTLE_WAIT_S = 5.0  # a reader on another thread waits this long, at most, for the loop to record the ledger


class TransactionGuard:
    """Time: the waits (holds, backoffs, question bounds) run on the event loop's clock (`loop.time()`,
    asyncio.sleep, wait_for); the wall milliseconds handed to the pure core come from `clock`. A test
    gives both from one fake clock (tests/unit/virtual_time.py)."""

    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics, policy: Policy, upstream_ssl: Any,
                 address_of: Callable[[str, int], HostPort] | None = None, clock: Clock | None = None) -> None:
        v = config.verification
        self.config = config
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.metrics = metrics
        self.registry = Registry(RegistryLimits(max_entries=v.registry_max_entries,
                                                idle_expiry_ms=int(v.registry_idle_expiry_s * 1000),
                                                evidence_ttl_ms=evidence_ttl(config)))
        # The KAFKA-17754 defence: EndTxns in doubt, and the waits of the requests held behind them.
        self.in_doubt = EndTxnLedger(InDoubtLimits(enabled=v.end_txn_in_doubt_hold, max_ms=v.end_txn_in_doubt_max_ms,
                                                   hold_ms=v.end_txn_hold_ms), on_change=self._in_doubt_ended)
        self._in_doubt_waits: dict[str, asyncio.Event] = {}
        # The ledger counts how each doubt ended (`EndTxnLedger.endings`); the metric's children read those counts
        # when /metrics is read (`_export_in_doubt_endings`), so an EndTxn answer counts nothing twice.
        self._in_doubt_endings = {e: metrics.end_txn_in_doubt_endings.labels(e.value) for e in Ending}
        self.rules = TransactionRules(self.registry, policy, enabled=v.enabled, ask_leader=v.leader_evidence,
                                      holds=HoldLimits(share=v.hold_share, max_ms=v.hold_max_ms,
                                                       default_request_timeout_ms=v.client_request_timeout_ms),
                                      concurrent=concurrent_retry(config.health.concurrent_transactions_budget_ms),
                                      in_doubt=self.in_doubt if v.end_txn_in_doubt_hold else None)
        self.verifier = Verifier(config.upstream, metrics, ssl_context=upstream_ssl, timeout_s=v.timeout_s,
                                 connect_timeout_s=config.limits.connect_timeout_s, address_of=address_of,
                                 coordinator_evidence=v.coordinator_evidence, auth=config.upstream_auth)
        # The coordinator's own log (verification/transaction_log_view.py), read by every proxy when on.
        self.follower: LogFollower | None = None
        if v.transaction_log and v.enabled:
            verifier = self.verifier
            self.follower = LogFollower(
                TransactionLogView(), metrics, lambda: verifier.bootstrap, verifier.address_of,
                ssl_context=upstream_ssl, auth=config.upstream_auth, connect_timeout_s=config.limits.connect_timeout_s,
                timeout_s=v.timeout_s, metadata_refresh_s=config.metadata_refresh_s,
                idle_after_s=v.transaction_log_idle_after_s, idle_read_s=v.transaction_log_idle_read_s,
                on_refused=verifier.access.refused, on_proved=verifier.access.proved)
            verifier.transaction_log = self.follower
            verifier.transaction_log_wait_s = v.transaction_log_wait_ms / 1000
            # Who reaches the brokers without this proxy (verification/bypass.py): the ids the registry learns are
            # remembered past its expiry, at most as many as the view holds.
            self.registry.seen = SeenIds(self.follower.view.limits.max_entries)
        self._log_ids_interval_s = config.audit.transaction_log_ids_interval_s
        self._log_ids_due = time.monotonic() + (self._log_ids_interval_s or 0.0)
        self._log_ids_task: asyncio.Task[int] | None = None
        self._passed_templates: dict[tuple[Any, ...], tuple[ClientInfo, Verdict, tuple[str, str, str, str]]] = {}
        self.audit = AuditLog(config.audit_path, on_enabled=self._audit_enabled)
        self.log = logs.get(component="guard")
        # The ledger every session's core books in (one order over all connections), recorded in batches.
        self.ledger = Ledger()
        self._ledger_timer: asyncio.TimerHandle | None = None
        self._ledger_loop: asyncio.AbstractEventLoop | None = None
        self.audit.before_write = self.flush_ledger  # another record: those booked earlier go first
        metrics.before_collect.callbacks.append(self.settle_ledger)  # a scrape sees everything booked before it
        metrics.before_collect.callbacks.append(self._export_in_doubt_endings)
        metrics.registry_size.set_function(lambda: len(self.registry))
        metrics.end_txn_in_doubt.set_function(lambda: len(self.in_doubt))
        self._unseen_last = 0.0
        self._unseen_at: float | None = None  # when the gauge last counted (monotonic)
        if self.follower is not None:
            metrics.log_follower_unseen.set_function(self._unseen_ids)

    def _unseen_ids(self) -> float:
        """The gauge, at scrape time, counted again at most every UNSEEN_REFRESH_S: one pass over the view, on the
        event loop (/metrics is served there). A reader on another thread (a test's `get_sample_value`) may meet the
        follower changing the view mid-pass: it gets the last count instead of an error."""
        follower, seen = self.follower, self.registry.seen
        if follower is None or seen is None:
            return 0.0
        now = time.monotonic()
        if self._unseen_at is None or now - self._unseen_at >= UNSEEN_REFRESH_S:
            try:
                self._unseen_last = float(unseen_count(follower.view, seen, self.clock.wall_ms()))
                self._unseen_at = now
            except RuntimeError:  # "mutated during iteration": only off the loop's thread
                pass
        return self._unseen_last

    def _log_ids_round(self) -> None:
        """Housekeeping's: a round of `transaction_log_id` records every audit.transaction_log_ids_interval_s."""
        if self._log_ids_interval_s is None or time.monotonic() < self._log_ids_due:
            return
        self._log_ids_due = time.monotonic() + self._log_ids_interval_s
        if self._log_ids_task is None or self._log_ids_task.done():
            self._log_ids_task = asyncio.get_running_loop().create_task(self.write_log_ids())

    async def write_log_ids(self) -> int:
        """One round of `transaction_log_id` records: the ids active in the coordinator's log, the unseen first, at
        most MAX_LOG_ID_RECORDS; how many were written. Nothing before the follower has read the log once (a view being
        read holds part of the log). A large view is read from a copy in slices, the records written in slices,
        each slice a turn of the event loop, so clients' requests never wait for a whole round."""
        follower, seen = self.follower, self.registry.seen
        if follower is None or seen is None or not follower.caught_up_once or not self.audit.enabled:
            return 0
        now = self.clock.wall_ms()
        items = list(follower.view.items())  # one C-level copy: the follower changes the view between slices
        found: list[Entry] = []
        for start in range(0, len(items), LOG_IDS_SLICE):
            found += active_entries(items[start:start + LOG_IDS_SLICE], seen, now)
            await asyncio.sleep(0)
        round_ = capped(found, MAX_LOG_ID_RECORDS)
        for start in range(0, len(round_.ids), LOG_IDS_SLICE // 20):
            for log_id in round_.ids[start:start + LOG_IDS_SLICE // 20]:
                self.audit.write(transaction_log_id_record(time_ms=now, proxy_id=self.audit.proxy_id, log_id=log_id,
                                                           active_ids=round_.active, omitted_ids=round_.omitted))
            await asyncio.sleep(0)
        self.log.info("transaction_log_ids_written", records=len(round_.ids), active=round_.active,
                      unseen=sum(1 for i in round_.ids if not i.seen), omitted=round_.omitted)
        return len(round_.ids)

    def _audit_enabled(self, enabled: bool) -> None:
        # Only an audit record shows a decision's thread CPU time: not measured when nobody reads it.
        self.rules.measures_cpu = enabled

    @property
    def policy(self) -> Policy:
        return self.rules.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.rules.policy = policy

    async def close(self) -> None:
        if self._ledger_timer is not None:
            self._ledger_timer.cancel()
            self._ledger_timer = None
        self.flush_ledger()
        if self._log_ids_task is not None:
            await cancel_and_wait([self._log_ids_task], self.log)
        if self.follower is not None:
            await self.follower.close()
        await self.verifier.close()
        self.audit.close()

    # -- the relay's ledger, in batches ------------------------------------------------------------------
    #
    # Recorded after every read, the ledger cost half as much as the relay itself in a profile of the gateway
    # under a transactional Java producer (metric children, a Counter's mutex, the audit lines); in batches
    # much of that is paid once for many writes. What is recorded is the same, in the same order
    # (record_fast), and nobody can tell it was late:
    #   the general path's commands ── Session._execute flushes first (a rejection's record follows the
    #                                  passes before it);
    #   any other audit record ─────── AuditLog.write flushes first (a connection record, a hanging finding);
    #   a read of the metrics ──────── the registry's first collector flushes (a /metrics scrape, a test's
    #                                  get_sample_value, from any thread: settle_ledger);
    #   a session's close, the once-a-second timers, and LEDGER_BOUND entries (memory stays bounded);
    #   otherwise LEDGER_DELAY_S after the read that left the first entry (the audit file and topic).

    def booked(self) -> None:
        """A read on the relay's fast path left something in `ledger`: recorded now past LEDGER_BOUND
        entries, else by a timer armed when the ledger went from empty to not (at most LEDGER_DELAY_S)."""
        ledger = self.ledger
        if len(ledger) >= LEDGER_BOUND:
            self.flush_ledger()
        elif self._ledger_timer is None:
            # An armed timer is left armed when something else flushes: it then fires early, which only
            # shortens the wait of what was booked after that flush.
            loop = asyncio.get_running_loop()
            self._ledger_loop = loop
            self._ledger_timer = loop.call_later(LEDGER_DELAY_S, self._ledger_due)

    def _ledger_due(self) -> None:
        self._ledger_timer = None
        self.flush_ledger()

    def flush_ledger(self) -> None:
        """Record what the ledger holds (on the event loop's thread, or with no loop running)."""
        ledger = self.ledger
        if ledger.passed or ledger.windows or ledger.offsets:
            self.record_fast(ledger)

    def settle_ledger(self) -> None:
        """Before the metrics are read, from any thread: the ledger is recorded on the loop's thread (the
        reader waits for it; at most _SETTLE_WAIT_S if the loop is stuck), or here when no loop runs."""
        ledger = self.ledger
        if not (ledger.passed or ledger.windows or ledger.offsets):
            return
        loop = self._ledger_loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            self.flush_ledger()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def flush() -> None:
            try:
                self.flush_ledger()
            finally:
                done.set_result(None)

        try:
            loop.call_soon_threadsafe(flush)
        except RuntimeError:  # closed meanwhile: nothing books any more
            self.flush_ledger()
            return
        with contextlib.suppress(concurrent.futures.TimeoutError):
            done.result(_SETTLE_WAIT_S)

    def housekeeping(self) -> None:
        """Once a second (Proxy._timer_loop): the ledger recorded, whatever its timer; what expired forgotten."""
        self.flush_ledger()
        self.registry.expire(self.clock.wall_ms())
        self._log_ids_round()
        for s in self.in_doubt.expire(self.clock.wall_ms()):
            self.log.warning("end_txn_in_doubt_expired", transactional_id=s.transactional_id,
                             producer_id=s.producer_id, producer_epoch=s.producer_epoch, committed=s.committed,
                             connection_id=s.connection_id, orphaned=s.orphaned_ms is not None,
                             reason=f"no answer within {self.in_doubt.limits.max_ms} ms: the next transaction of "
                                    "this producer is no longer held for it (KAFKA-17754 exposure)")

    # -- the KAFKA-17754 defence ---------------------------------------------------------------------------

    def _in_doubt_ended(self, txn_id: str, ending: Ending) -> None:
        """The ledger's callback (on this loop): one EndTxn of `txn_id` less in doubt; wake its holds."""
        event = self._in_doubt_waits.pop(txn_id, None)
        if event is not None:
            event.set()

    def _export_in_doubt_endings(self) -> None:
        """Before /metrics is read: `txnguard_end_txn_in_doubt_endings_total` is the ledger's own counts."""
        for ending, n in self.in_doubt.endings.items():
            self._in_doubt_endings[ending].value = n

    async def _await_end_txn(self, question: AwaitEndTxn) -> EndTxnSettled | EndTxnStillInDoubt:
        """Hold until no EndTxn in doubt can land in the transaction the held request opens, within its
        bound. Meanwhile the coordinator is asked whether the producer moved on (an epoch bump fences the
        old EndTxn); its answer on its own connection is what normally ends the doubt."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + question.hold_ms / 1000
        txn_id, pid, epoch = question.transactional_id, question.producer_id, question.producer_epoch
        next_describe = loop.time() + 0.25
        first = self.in_doubt.blocking(txn_id, pid, epoch, question.connection_id, self.clock.wall_ms())
        if first is not None:
            self.log.info("end_txn_hold", transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                          connection_id=question.connection_id, hold_ms=round(question.hold_ms),
                          end_txn=_describe_sent(first),
                          reason="an EndTxn of this producer id and epoch is unanswered and could end the "
                                 "transaction this request opens (KAFKA-17754): held until it is answered")
        self.metrics.end_txn_holds.inc()
        try:
            while self.in_doubt.blocking(txn_id, pid, epoch, question.connection_id, self.clock.wall_ms()) is not None:
                left = deadline - loop.time()
                if left <= 0:
                    return EndTxnStillInDoubt()
                event = self._in_doubt_waits.setdefault(txn_id, asyncio.Event())
                try:
                    await asyncio.wait_for(event.wait(), min(left, max(next_describe - loop.time(), 0.01)))
                    continue
                except TimeoutError:
                    pass
                if loop.time() >= next_describe:
                    next_describe = loop.time() + 0.5
                    await self._fenced_by_coordinator(txn_id, pid, epoch)
            return EndTxnSettled()
        finally:
            self.metrics.end_txn_holds.dec()

    async def _fenced_by_coordinator(self, txn_id: str, pid: int, epoch: int) -> None:
        """Ask the coordinator: another producer epoch fences the EndTxn in doubt; any answer at all settles
        those whose connection had closed before the question (verification/in_doubt.py)."""
        mark = self.in_doubt.mark()
        try:
            desc = await asyncio.wait_for(self.verifier.describe(txn_id), self.config.verification.timeout_s)
        except Exception:  # noqa: BLE001 - no answer proves nothing: keep holding
            return
        if desc.error_code == 0 and desc.producer_id >= 0 and (desc.producer_id, desc.producer_epoch) != (pid, epoch):
            self.in_doubt.fenced(txn_id, desc.producer_id, desc.producer_epoch)
        else:
            self.in_doubt.answered_after(txn_id, pid, epoch, mark)

    def _record_end_txn_hold(self, decision: Decision, log: Any) -> None:
        """A request held for an EndTxn in doubt was decided: metric, log line and audit record."""
        ctx = decision.context
        assert ctx is not None
        ending = "settled" if decision.forward is not None else "timeout"
        self.metrics.child(self.metrics.end_txn_hold_endings, ending).inc()
        in_doubt = [_describe_sent(s) for s in self.in_doubt.in_doubt(ctx.transactional_id)]
        error = None if decision.forward is not None else 51  # CONCURRENT_TRANSACTIONS
        (log.info if ending == "settled" else log.warning)(
            "end_txn_hold_ended", api=ctx.api, transactional_id=ctx.transactional_id, producer_id=ctx.producer_id,
            producer_epoch=ctx.producer_epoch, ending=ending, held_ms=round(decision.elapsed_ms, 1),
            end_txns_in_doubt=in_doubt,
            reason=("the earlier EndTxn was answered or fenced: the new transaction cannot be ended by it"
                    if ending == "settled" else
                    "an earlier EndTxn of this producer is still unanswered and could end the new transaction "
                    "(KAFKA-17754): answered CONCURRENT_TRANSACTIONS, which the client retries"))
        if self.audit.enabled:
            self.audit.write(end_txn_hold_record(
                time_ms=self.clock.wall_ms(), proxy_id=self.audit.proxy_id, transactional_id=ctx.transactional_id,
                producer_id=ctx.producer_id, producer_epoch=ctx.producer_epoch, api=ctx.api, ending=ending,
                held_ms=decision.elapsed_ms, in_doubt=in_doubt, error_sent=error,
                error_name=None if error is None else "CONCURRENT_TRANSACTIONS", client=ctx.client))

    async def answer(self, question: Question, leader: HostPort | None) -> Answer:
        """Find out what a connection core asked (it resumes its decision with the answer)."""
        match question:
            case VerifyPartitions():
                return await self._verify(question, leader)
            case CountOffsetsPartitions():
                try:
                    return OffsetsPartitionCount(await self.verifier.offsets_partitions())
                except Exception as e:  # noqa: BLE001 - no partition count: the core answers "cannot verify"
                    return OffsetsPartitionCountFailed(repr(e))
            case DescribeTransaction():  # a coordinator timeout to confirm (verification/timeouts.py)
                try:
                    return TransactionDescription(await self.verifier.describe(question.transactional_id))
                except Exception as e:  # noqa: BLE001 - no answer: the request passes as it is
                    return TransactionDescriptionFailed(repr(e))
            case AwaitEndTxn():
                return await self._await_end_txn(question)
            case _:
                assert_never(question)

    async def _verify(self, question: VerifyPartitions, leader: HostPort | None) -> PartitionVerdicts:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + question.hold_ms / 1000
        ask_leader = leader if question.ask_leader else None
        verdicts, desc = await self.verifier.verify(question.transactional_id, question.producer_id,
                                                    question.producer_epoch, question.partitions, ask_leader)
        again = worth_asking_again(verdicts)
        if not again or loop.time() >= deadline:
            return PartitionVerdicts(verdicts, desc)
        return await self._hold(question, ask_leader, verdicts, desc, again, deadline)

    async def _hold(self, question: VerifyPartitions, leader: HostPort | None, verdicts: dict[TopicPartition, Verdict],
                    desc: DescribedTransaction | None, again: list[TopicPartition],
                    deadline: float) -> PartitionVerdicts:
        """Ask again while the coordinator can only say "not now", until the request's own bound
        (verification/hold_limits.py). Each question keeps its own `timeout_s`; the last one is cut at the
        deadline. The check stays pending meanwhile: the core holds the request, and only it."""
        loop = asyncio.get_running_loop()
        holds = self.rules.holds
        self.metrics.verification_holds.inc()
        attempt = 0
        try:
            while again and (left := deadline - loop.time()) > 0:
                attempt += 1
                await asyncio.sleep(min(holds.backoff(attempt) / 1000, left))
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    fresh, answered = await asyncio.wait_for(self.verifier.verify(
                        question.transactional_id, question.producer_id, question.producer_epoch, again, leader),
                        left)
                except TimeoutError:
                    break  # the deadline cut the last question: the earlier "not now" stands
                verdicts.update(fresh)
                desc = answered if answered is not None else desc
                again = worth_asking_again(verdicts)
        finally:
            self.metrics.verification_holds.dec()
        ending = "timeout" if again else "decided"
        self.metrics.child(self.metrics.verification_hold_endings, ending).inc()
        if again:
            self.log.warning("verification_hold_expired", transactional_id=question.transactional_id,
                             producer_id=question.producer_id, producer_epoch=question.producer_epoch,
                             partitions=[f"{t}-{p}" for t, p in again], questions=attempt + 1,
                             held_ms=round(question.hold_ms),
                             reason="the coordinator gave no definite answer within the request's own timeout")
        return PartitionVerdicts(verdicts, desc)

    def _record_timeout_recovery(self, decision: Decision, log: Any) -> None:
        """A KIP-588 answer or rewrite (verification/timeouts.py): a log line, a metric, an audit record."""
        ctx = decision.context
        assert ctx is not None
        for r in decision.records:
            to_error = r.error.name if r.error is not None else "EPOCH_OF_COORDINATOR"
            self.metrics.error_rewrites.labels(ctx.api, "PRODUCER_FENCED", to_error, ctx.client.family).inc()
            log.info("coordinator_timeout_recovered", api=ctx.api, transactional_id=ctx.transactional_id,
                     producer_id=ctx.producer_id, producer_epoch=ctx.producer_epoch, reason=r.verdict.detail,
                     error=to_error)
            if self.audit.enabled:
                sent = r.error is not None
                self.audit.write(audit_record(
                    time_ms=self.clock.wall_ms(), transactional_id=ctx.transactional_id, producer_id=ctx.producer_id,
                    producer_epoch=ctx.producer_epoch, api=ctx.api, api_version=ctx.api_version, target=r.target,
                    verdict=r.verdict, decision=r.decision, error_sent=r.error.code if sent and r.error else None,
                    error_name=r.error.name if sent and r.error else None, latency_ms=decision.elapsed_ms,
                    cpu_ms=None, mode=ctx.mode.value, proxy_id=self.audit.proxy_id, client=ctx.client))

    def record_fast(self, ledger: Ledger) -> None:
        """What a connection core's ledger holds (connection/ledger.py): exactly what `record` does for the
        `Decided` of a write passed on local evidence (no failed partition: no log line), and the windows.
        Produces and TxnOffsetCommits are recorded in the order booked (`_record_passed`).

        Once per batch, not per write: each metric child is looked up once; each histogram child observes
        its values in the order they were booked (`observe_many`: the same counts and the same float sum);
        the verifications counter gets one `inc` per label set, the sum of the per-write increments (whole
        numbers: exact); the audit lines, each with its decision's time, reach the file in one write."""
        passed, offsets, windows = ledger.take()
        if passed or offsets:
            self._record_passed(passed, offsets)
        if windows:
            self._record_windows(windows)

    def _record_windows(self, windows: list[tuple[str, float]]) -> None:
        """Check-to-append windows: each evidence's histogram child observes its own in the order booked."""
        by_evidence: dict[str, list[float]] = {}
        for evidence, window_ms in windows:
            found = by_evidence.get(evidence)
            if found is None:
                found = by_evidence[evidence] = []
            found.append(window_ms)
        m = self.metrics
        for evidence, values in by_evidence.items():
            m.child(m.verification_window, evidence).observe_many(values)

    def _record_passed(self, passed: list[Passed], offsets: list[PassedOffsets]) -> None:
        """Produces and TxnOffsetCommits passed on local evidence, as `record` of their `Decided`s in the order
        booked: each kind's inspection_time child (by its check's api) observes its own values; a
        verification_time child (by evidence: both kinds share them) observes them in the order booked, as do
        the audit lines. Each offset commit carries its place among the Produces (connection/ledger.py); a batch
        of Produces alone (the hot case) is one run of them."""
        m = self.metrics
        child = m.child
        produce_inspections: list[float] = []
        offset_inspections: list[float] = []
        timings: dict[str, list[float]] = {}  # by evidence, in the order booked
        counts: dict[tuple[str, str], int] = {}
        labels: dict[int, tuple[str, str]] = {}  # a verdict's (evidence, outcome): verdicts are shared
        audit = self.audit.enabled
        lines: list[tuple[str, str | None]] = []
        done = 0
        for offset in [*offsets, None]:
            upto = len(passed) if offset is None else offset.place
            if upto > done:
                run = passed[done:upto] if done or upto < len(passed) else passed  # Produces alone: no copy
                _tally(run, produce_inspections, timings, counts, labels)
                if audit:
                    lines += self._passed_lines(run)
            done = upto
            if offset is None:
                break
            v = offset.verdict
            offset_inspections.append(offset.inspection_ms)
            label = (v.evidence.value, v.outcome.value)
            timings.setdefault(label[0], []).append(offset.verification_ms)
            counts[label] = counts.get(label, 0) + 1
            if audit:
                lines.append(self._offsets_line(offset))
        if produce_inspections:
            child(m.inspection_time, ProduceWrite.api).observe_many(produce_inspections)
        if offset_inspections:
            child(m.inspection_time, OffsetCommitWrite.api).observe_many(offset_inspections)
        for evidence, values in timings.items():
            child(m.verification_time, evidence).observe_many(values)
        for (evidence, outcome), n in counts.items():
            child(m.verifications, evidence, outcome, FORWARDED).inc(n)
        if lines:
            self.audit.write_texts(lines)

    def _offsets_line(self, offset: PassedOffsets) -> tuple[str, str | None]:
        """The audit record of a TxnOffsetCommit passed on local evidence: (text, key) as `write` makes them."""
        client, txn_id, pid, epoch, version, v, mode = (offset.client, offset.transactional_id, offset.producer_id,
                                                        offset.producer_epoch, offset.api_version, offset.verdict,
                                                        offset.mode)
        group, elapsed_ms, cpu_ms, time_ms = offset.group, offset.verification_ms, offset.cpu_ms, offset.time_ms
        proxy_id = self.audit.proxy_id
        templates = self._passed_templates
        key = ("group", id(client), txn_id, pid, epoch, version, group, id(v), mode, proxy_id)  # never a Produce's
        found = templates.get(key)
        if found is None or found[0] is not client or found[1] is not v:
            if len(templates) >= _TEMPLATES:
                templates.clear()
            found = templates[key] = (client, v, _passed_template(
                client, txn_id, pid, epoch, version, f"group:{group}", v, mode, proxy_id, OffsetCommitWrite.api))
        a, b, c, d = found[2]
        cpu = "null" if cpu_ms is None else repr(round(cpu_ms, 4))
        return f"{a}{time_ms}{b}{round(elapsed_ms, 4)!r}{c}{cpu}{d}", txn_id

    def _passed_lines(self, passed: list[Passed]) -> list[tuple[str, str | None]]:
        """The audit records of passed writes, one per partition, in order: (text, key) as `write` makes them."""
        lines: list[tuple[str, str | None]] = []
        templates = self._passed_templates
        proxy_id = self.audit.proxy_id
        for p in passed:
            client, txn_id, pid, epoch, version = p.client, p.transactional_id, p.producer_id, p.producer_epoch, \
                p.api_version
            v, mode, time_ms, cpu_ms = p.verdict, p.mode, p.time_ms, p.cpu_ms
            latency = repr(round(p.verification_ms, 4))
            cpu = "null" if cpu_ms is None else repr(round(cpu_ms, 4))
            for topic, index in p.partitions:
                key = (id(client), txn_id, pid, epoch, version, topic, index, id(v), mode, proxy_id)
                found = templates.get(key)
                if found is None or found[0] is not client or found[1] is not v:
                    if len(templates) >= _TEMPLATES:
                        templates.clear()
                    found = templates[key] = (client, v, _passed_template(
                        client, txn_id, pid, epoch, version, f"{topic}-{index}", v, mode, proxy_id))
                a, b, c, d = found[2]
                lines.append((f"{a}{time_ms}{b}{latency}{c}{cpu}{d}", txn_id))
        return lines

    def record(self, decision: Decision, log: Any) -> None:
        """What a decision leaves, by the kind of check that took it: a write's verdicts, a hold's ending or a
        coordinator timeout's recovery (metrics, log lines, audit records: tests/unit/test_check_records.py)."""
        ctx = decision.context
        if ctx is None:
            return
        kind = ctx.kind
        match kind:
            case ProduceWrite() | OffsetCommitWrite():
                self._record_verdicts(decision, log)
            case HeldForEndTxn():
                self._record_end_txn_hold(decision, log)
            case TimedOutEndTxn() | TimedOutInitProducerId():
                self._record_timeout_recovery(decision, log)
            case _:
                assert_never(kind)

    def _record_verdicts(self, decision: Decision, log: Any) -> None:
        """Metrics, a log line per failed partition, and an audit record per partition."""
        ctx = decision.context
        assert ctx is not None
        m = self.metrics
        m.child(m.inspection_time, ctx.api).observe(ctx.inspection_ms)
        for r in decision.records:
            v = r.verdict
            m.child(m.verification_time, v.evidence.value).observe(decision.elapsed_ms)
            if not v.passed:
                m.child(m.verification_failures, v.outcome.value).inc()
            m.child(m.verifications, v.evidence.value, v.outcome.value, r.decision).inc()
            choice = r.error
            if choice is not None:
                if r.enforced:
                    m.error_rewrites.labels(ctx.api, v.underlying or v.outcome.value, choice.name,
                                            ctx.client.family).inc()
                log.info("verification_failed", api=ctx.api, transactional_id=ctx.transactional_id,
                         producer_id=ctx.producer_id, producer_epoch=ctx.producer_epoch, target=r.target,
                         outcome=v.outcome.value, evidence=v.evidence.value, reason=v.detail, error=choice.name,
                         decision=r.decision)
            if self.audit.enabled:  # a record is a 26-key dict: not built when nobody reads it
                sent = choice is not None and r.enforced
                self.audit.write(audit_record(
                    time_ms=self.clock.wall_ms(), transactional_id=ctx.transactional_id, producer_id=ctx.producer_id,
                    producer_epoch=ctx.producer_epoch, api=ctx.api, api_version=ctx.api_version, target=r.target,
                    verdict=v, decision=r.decision, error_sent=choice.code if sent and choice else None,
                    error_name=choice.name if sent and choice else None, latency_ms=decision.elapsed_ms,
                    cpu_ms=decision.cpu_ms, mode=ctx.mode.value, proxy_id=self.audit.proxy_id, client=ctx.client))


_TEMPLATES = 4096  # audit record templates of passed writes kept (client, producer, partition); then forgotten
_HOLES = ("\x00time", "\x00latency", "\x00cpu")


def _tally(passed: list[Passed], inspections: list[float], timings: dict[str, list[float]],
           counts: dict[tuple[str, str], int], labels: dict[int, tuple[str, str]]) -> None:
    """Add a run of passed Produces to a batch's inspection times, verification times by evidence (one per
    partition, in the order booked) and verification counts by (evidence, outcome)."""
    for p in passed:
        partitions, v, inspection_ms, elapsed_ms = p.partitions, p.verdict, p.inspection_ms, p.verification_ms
        inspections.append(inspection_ms)
        label = labels.get(id(v))
        if label is None:
            label = labels[id(v)] = (v.evidence.value, v.outcome.value)
        n = len(partitions)
        timing = timings.get(label[0])
        if timing is None:
            timing = timings[label[0]] = []
        if n == 1:
            timing.append(elapsed_ms)
        else:
            timing.extend([elapsed_ms] * n)
        counts[label] = counts.get(label, 0) + n


def _passed_template(client: ClientInfo, txn_id: str, pid: int, epoch: int, version: int, target: str, v: Verdict,
                     mode: Enforcement, proxy_id: str, api: str = ProduceWrite.api) -> tuple[str, str, str, str]:
    """The audit record of a passed Produce partition (or TxnOffsetCommit: `api`, target the group) as
    `AuditLog.write` serialises it, cut where the time, the latency and the CPU time go (the rest is the same
    for every write of this producer to this partition): json.dumps writes an int as str() and a float as repr()."""
    record = audit_record(time_ms=0, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                          api=api, api_version=version, target=target, verdict=v, decision=FORWARDED,
                          error_sent=None, error_name=None, latency_ms=0.0, cpu_ms=None, mode=mode.value,
                          proxy_id=proxy_id, client=client)
    record["time_ms"], record["latency_ms"], record["cpu_ms"] = _HOLES
    text = json.dumps(record, separators=(",", ":"))
    a, rest = text.split(json.dumps(_HOLES[0]))
    b, rest = rest.split(json.dumps(_HOLES[1]))
    c, d = rest.split(json.dumps(_HOLES[2]))
    return a, b, c, d


def _describe_sent(s: SentEndTxn) -> dict[str, Any]:
    return {"committed": s.committed, "connection_id": s.connection_id, "sent_ms": s.sent_ms,
            "orphaned": s.orphaned_ms is not None}

"""The relay's ledger is recorded in batches, and no observer can tell: a real `Session` (proxy/session.py) with
its real guard, and fake sockets.

    client ──Produce(orders-0) xN──▶ session ──▶ broker      fast path: each write booked in the guard's ledger
    broker ──answers──────────────▶ session ──▶ client       fast path: each window booked
              ... the ledger recorded: by the guard's timer (LEDGER_DELAY_S), past LEDGER_BOUND entries,
                  before the general path's commands, before any other audit record, before every read of
                  the metrics (a /metrics scrape, from any thread), when the session closes.

What is recorded (every metric sample, every audit line byte for byte, in order) is what recording after
every read gave (`booked` replaced by an immediate `flush_ledger`, the shell before batching), and an audit
record's time is its decision's, not the batch's. Time is one fake clock: the core's, the guard's and the
event loop's (virtual_time.py); it moves a millisecond a read unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from connection_playbook import (
    EPOCH,
    PID,
    T0,
    TXN,
    FakeClock,
    FakeCluster,
    heartbeat,
    heartbeat_response,
    produce,
    txn_offset_commit,
    txn_offset_commit_response,
)
from connection_playbook import produce_response as answer
from virtual_time import run

from txnguard.policies.policy import policy_from_config
from txnguard.proxy import guard as guard_module
from txnguard.proxy import session as session_module
from txnguard.proxy.admin import AdminServer
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import LEDGER_BOUND, LEDGER_DELAY_S, TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.proxy.session import Session
from txnguard.verification.verdicts import Evidence, Outcome, Verdict

NOT_ADDED = ("orders", 9)  # never added to the transaction: the general path asks the coordinator
PASSES = {"evidence": "local", "outcome": "pass", "decision": "forwarded"}


class Transport:
    """One side's socket: what the session wrote to it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.data += chunk

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Coordinator:
    """The verifier: every partition it is asked about is not in the transaction."""

    async def verify(self, txn_id: str, pid: int, epoch: int, partitions: list[tuple[str, int]],
                     leader: Any) -> tuple[dict[tuple[str, int], Verdict], None]:
        return {p: Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not added") for p in partitions}, None

    async def close(self) -> None:
        pass


class Gateway(FakeCluster):
    """What a session needs of its proxy (session.Host), with a real guard and metrics on the fake clock."""

    opened: list[Gateway] = []  # their audit files are closed after each test (the `closing` fixture)

    def __init__(self, tmp: Path, name: str, clock: FakeClock) -> None:
        super().__init__()
        Gateway.opened.append(self)
        self.audit_path = tmp / f"{name}.jsonl"
        self.config = ProxyConfig(upstream=(HostPort("127.0.0.1", 9),), audit_path=str(self.audit_path))
        self.metrics = ProxyMetrics()
        self.guard = TransactionGuard(self.config, self.metrics, policy_from_config({}), None, clock=clock)
        self.guard.verifier = Coordinator()  # type: ignore[assignment]
        self.guard.registry.init_producer_id(TXN, PID, EPOCH, 60_000, clock.wall_ms())
        self.guard.registry.added(TXN, PID, EPOCH, clock.wall_ms(), partitions={T0})
        self.guard.registry.added(TXN, PID, EPOCH, clock.wall_ms(), group="g")  # AddOffsetsToTxn(g) answered
        self.guard.rules.offsets_partitions = 50
        self.debug = False
        self.response_observer = None
        self.closed: list[Session] = []
        self.batches: list[tuple[float, int, int, int]] = []  # record_fast calls: (time, thread, passed, windows)
        self.offsets: list[int] = []  # record_fast calls: how many offset commits each recorded
        record_fast = self.guard.record_fast

        def counted(ledger: Any) -> None:
            self.batches.append((clock.seconds, threading.get_ident(), len(ledger.passed), len(ledger.windows)))
            self.offsets.append(len(ledger.offsets))
            record_fast(ledger)

        self.guard.record_fast = counted  # type: ignore[method-assign]

    async def upstream_for(self, listener: Any) -> list[HostPort]:
        raise AssertionError("the test connects the session itself")

    async def connect_upstream(self, target: HostPort, factory: Any) -> Any:
        raise AssertionError("the test connects the session itself")

    def session_closed(self, session: Session) -> None:
        self.closed.append(session)

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    def samples(self) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        """Every sample, but those of the real clock: the session times its pauses with time.monotonic, and the
        process_* families are this test process's own CPU and memory."""
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                      for metric in self.metrics.registry.collect() for s in metric.samples
                      if not s.name.endswith("_created") and s.name != "txnguard_backpressure_paused_seconds_total"
                      and not s.name.startswith("process_"))


@pytest.fixture(autouse=True)
def closing() -> Iterator[None]:
    yield
    while Gateway.opened:
        Gateway.opened.pop().guard.audit.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The sessions' cores read this clock too (proxy/session.py's `_CLOCK`)."""
    fake = FakeClock()
    monkeypatch.setattr(session_module, "_CLOCK", fake)
    return fake


def connected(gateway: Gateway) -> Session:
    """A session whose client named itself (a Heartbeat) and whose broker connection is up."""
    session = Session(gateway, SimpleNamespace(name="bootstrap"), "127.0.0.1:50000")
    session.client, session.upstream = Transport(), Transport()  # type: ignore[assignment]
    session.upstream_address = HostPort("127.0.0.1", 9092)
    session.from_client(heartbeat(0))
    session.from_upstream(heartbeat_response(0))
    return session


def writes(session: Session, clock: FakeClock, first: int, n: int, step_s: float = 0.001) -> list[int]:
    """n writes with local evidence and their answers, each read `step_s` after the last (no loop turn in
    between); returns each write's decision time (wall ms)."""
    decided = []
    for cid in range(first, first + n):
        clock.seconds += step_s
        decided.append(clock.wall_ms())
        session.from_client(produce(cid, [T0]))
        clock.seconds += step_s
        session.from_upstream(answer(cid, [T0]))
    return decided


async def writes_with_loop_turns(session: Session, clock: FakeClock, first: int, n: int) -> None:
    """As `writes`, each read a separate turn of the event loop, as sockets deliver them."""
    for cid in range(first, first + n):
        clock.seconds += 0.001
        session.from_client(produce(cid, [T0]))
        await asyncio.sleep(0)
        clock.seconds += 0.001
        session.from_upstream(answer(cid, [T0]))
        await asyncio.sleep(0)


async def writes_and_commits_with_loop_turns(session: Session, clock: FakeClock, first: int, n: int) -> None:
    """As `writes_with_loop_turns`, each write followed by a TxnOffsetCommit of the group (local evidence, v0-v4
    in turn) in a read of its own, answered after it: a batch holds both kinds, interleaved."""
    for cid in range(first, first + 2 * n, 2):
        for request in (produce(cid, [T0]), txn_offset_commit(cid + 1, version=cid % 5)):
            clock.seconds += 0.001
            session.from_client(request)
            await asyncio.sleep(0)
        for response in (answer(cid, [T0]), txn_offset_commit_response(cid + 1, version=cid % 5)):
            clock.seconds += 0.001
            session.from_upstream(response)
            await asyncio.sleep(0)


async def rejected(session: Session, clock: FakeClock, cid: int, request: bytes | None = None) -> None:
    """client ──Produce(orders-9)──▶ the general path asks the coordinator ──▶ rejected, answered locally."""
    clock.seconds += 0.001
    before = len(session.client.data)  # type: ignore[union-attr]
    session.from_client(produce(cid, [NOT_ADDED]) if request is None else request)
    while len(session.client.data) == before:  # type: ignore[union-attr]
        await asyncio.sleep(0)  # the question's task runs; no timer is due meanwhile


Scenario = Callable[[Session, FakeClock], Awaitable[None]]


def batched_and_per_read(tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
                         steps: Scenario) -> tuple[Gateway, Gateway]:
    """The same client conversation played through a gateway recording in batches and through one recording
    after every read (the shell before), each on its own fake clock; the connection closed at the end."""
    reference_clock = FakeClock()
    batched, per_read = Gateway(tmp_path, "batched", clock), Gateway(tmp_path, "per-read", reference_clock)
    per_read.guard.booked = per_read.guard.flush_ledger  # type: ignore[method-assign]  # the shell before

    async def scenario(gateway: Gateway, c: FakeClock) -> None:
        monkeypatch.setattr(session_module, "_ids", itertools.count(1))  # both connections are number 1
        session = connected(gateway)
        await steps(session, c)
        session.close("client_closed")

    run(scenario(batched, clock), clock)
    monkeypatch.setattr(session_module, "_CLOCK", reference_clock)
    run(scenario(per_read, reference_clock), reference_clock)
    return batched, per_read


def test_n_fast_writes_then_a_rejection_record_what_recording_after_every_read_did(tmp_path, clock, monkeypatch):
    async def steps(session: Session, c: FakeClock) -> None:
        await writes_with_loop_turns(session, c, 1, 20)
        await rejected(session, c, 21)
        await writes_with_loop_turns(session, c, 22, 3)

    batched, per_read = batched_and_per_read(tmp_path, clock, monkeypatch, steps)

    ours, theirs = batched.audit_path.read_bytes().splitlines(), per_read.audit_path.read_bytes().splitlines()
    assert ours[:-1] == theirs[:-1]  # every decision's line, byte for byte
    # The connection record (last) is stamped with the real wall clock (AuditLog.connection_closed).
    assert _without_wall_clock(ours[-1]) == _without_wall_clock(theirs[-1])
    assert batched.samples() == per_read.samples()
    kinds = [(r["kind"], r.get("decision")) for r in batched.audit()]
    assert kinds == [("decision", "forwarded")] * 20 + [("decision", "rejected")] + \
        [("decision", "forwarded")] * 3 + [("connection", None)]
    assert batched.metric("txnguard_verifications_total", PASSES) == 23
    # Per read: a batch per fast read. Batched: the guard's timer waits LEDGER_DELAY_S (50 ms) from the first
    # booked read, longer than all these reads take (47 ms, a millisecond a read), so it never fires here: one
    # batch before the rejection's commands (the first 20 writes), one at the close (the last 3).
    assert len(per_read.batches) == 2 * 23
    assert LEDGER_DELAY_S * 1000 > 47 and [b[2] for b in batched.batches] == [20, 3]


def test_writes_and_offset_commits_in_batches_record_what_recording_after_every_read_did(tmp_path, clock,
                                                                                       monkeypatch):
    """The two kinds share a batch (and the verification_time children): recorded in the order booked."""
    async def steps(session: Session, c: FakeClock) -> None:
        await writes_and_commits_with_loop_turns(session, c, 1, 10)
        await rejected(session, c, 21, txn_offset_commit(21, group="h"))  # never added: asked, rejected
        await writes_and_commits_with_loop_turns(session, c, 22, 3)

    batched, per_read = batched_and_per_read(tmp_path, clock, monkeypatch, steps)

    ours, theirs = batched.audit_path.read_bytes().splitlines(), per_read.audit_path.read_bytes().splitlines()
    assert ours[:-1] == theirs[:-1]  # every decision's line, byte for byte
    assert _without_wall_clock(ours[-1]) == _without_wall_clock(theirs[-1])
    assert batched.samples() == per_read.samples()
    kinds = [(r["kind"], r.get("api"), r.get("decision")) for r in batched.audit()]
    both = [("decision", "produce", "forwarded"), ("decision", "txn_offset_commit", "forwarded")]
    assert kinds == both * 10 + [("decision", "txn_offset_commit", "rejected")] + both * 3 + \
        [("connection", None, None)]
    assert batched.metric("txnguard_verifications_total", PASSES) == 26
    assert batched.metric("txnguard_inspection_time_ms_count", {"api": "txn_offset_commit"}) == 14
    assert sum(per_read.offsets) == sum(batched.offsets) == 13  # booked by the fast path, in batches here
    assert len(batched.batches) < len(per_read.batches) // 4


def test_an_offset_commit_alone_in_the_ledger_is_recorded_by_the_timer(tmp_path, clock):
    """A fast read that booked nothing but an offset commit arms the guard's timer (proxy/session.py)."""
    gateway = Gateway(tmp_path, "commit", clock)

    async def scenario() -> float:
        session = connected(gateway)
        clock.seconds += 0.001
        session.from_client(txn_offset_commit(1))
        booked_at = clock.seconds
        assert gateway.batches == []
        await asyncio.sleep(1)  # no answer, no traffic: the guard's timer
        return booked_at

    booked_at = run(scenario(), clock)
    [(at, _, passed, windows)] = gateway.batches
    assert (passed, windows, gateway.offsets) == (0, 0, [1]) and at == pytest.approx(booked_at + LEDGER_DELAY_S)
    [record] = gateway.audit()
    assert (record["api"], record["target"], record["decision"]) == ("txn_offset_commit", "group:g", "forwarded")


def _without_wall_clock(line: bytes) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(line)
    assert record["kind"] == "connection"
    del record["time_ms"], record["connected_ms"]
    return record


def test_a_scrape_in_the_middle_sees_every_write_before_it(tmp_path, clock):
    gateway = Gateway(tmp_path, "scraped", clock)
    admin = AdminServer(gateway, HostPort("127.0.0.1", 0))  # type: ignore[arg-type]

    def scraped(name: str) -> float:
        """GET /metrics, as the admin server answers it: the sample's value in the text."""
        status, _, body = admin._route("GET", "/metrics")
        assert status == "200 OK"
        prefix = name + '{decision="forwarded",evidence="local",outcome="pass"} '
        [line] = [x for x in body.decode().splitlines() if x.startswith(prefix)]
        return float(line.removeprefix(prefix))

    async def scenario() -> None:
        session = connected(gateway)
        writes(session, clock, 1, 7)
        assert [r["kind"] for r in gateway.audit()] == []  # booked, not yet recorded
        assert scraped("txnguard_verifications_total") == 7
        assert len(gateway.audit()) == 7  # the scrape recorded the audit records too
        writes(session, clock, 8, 5)
        assert scraped("txnguard_verifications_total") == 12
        assert gateway.metric("txnguard_verification_window_ms_count", {"evidence": "local"}) == 12

    run(scenario(), clock)
    assert [b[2:] for b in gateway.batches] == [(7, 7), (5, 5)]  # one batch per scrape, nothing else flushed


def test_a_reader_on_another_thread_sees_every_write_the_loop_booked(tmp_path, clock, monkeypatch):
    """Tests read a ProxyThread's registry from their own thread: the ledger is recorded on the loop's thread
    (the reader waits for it). The timer is put out of reach, so only the read can record it."""
    monkeypatch.setattr(guard_module, "LEDGER_DELAY_S", 3600.0)
    gateway = Gateway(tmp_path, "threads", clock)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="proxy-loop")
    thread.start()
    try:
        done = asyncio.run_coroutine_threadsafe(_on_loop(lambda: writes(connected(gateway), clock, 1, 9)), loop)
        done.result(10)
        assert gateway.batches == []  # booked on the loop, not recorded
        assert gateway.metric("txnguard_verifications_total", PASSES) == 9  # this thread reads
        assert [(b[1], b[2]) for b in gateway.batches] == [(thread.ident, 9)]  # recorded on the loop's thread
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _on_loop(f: Any) -> Any:
    return f()


def test_the_time_bound_records_without_any_further_traffic_each_record_with_its_decisions_time(tmp_path, clock):
    gateway = Gateway(tmp_path, "timer", clock)

    async def scenario() -> tuple[list[int], float]:
        session = connected(gateway)
        started = clock.seconds
        decided = writes(session, clock, 1, 4, step_s=0.0005)  # 4 ms of reads: within the bound
        await asyncio.sleep(0)  # the loop's turn: nothing is due yet
        assert gateway.batches == [] and gateway.audit() == []
        await asyncio.sleep(1)  # no traffic: the loop jumps to the guard's timer, then idles
        return decided, started

    decided, started = run(scenario(), clock)
    [(at, _, passed, windows)] = gateway.batches
    assert (passed, windows) == (4, 4)
    assert at == pytest.approx(started + 0.0005 + LEDGER_DELAY_S)  # the bound after the first booked read
    records = gateway.audit()
    assert [r["time_ms"] for r in records] == decided  # the decisions' times, not the batch's
    assert decided[-1] < at * 1000


def test_past_the_bound_the_ledger_is_recorded_at_once(tmp_path, clock):
    gateway = Gateway(tmp_path, "bound", clock)

    async def scenario() -> None:
        session = connected(gateway)
        writes(session, clock, 1, LEDGER_BOUND // 2 - 1)
        clock.seconds += 0.001
        session.from_client(produce(LEDGER_BOUND // 2, [T0]))  # one entry short of the bound
        assert gateway.batches == []
        session.from_upstream(answer(LEDGER_BOUND // 2, [T0]))  # the bound: recorded without the loop's turn
        assert [b[2:] for b in gateway.batches] == [(LEDGER_BOUND // 2, LEDGER_BOUND // 2)]
        assert len(gateway.audit()) == LEDGER_BOUND // 2

    run(scenario(), clock)


def test_another_audit_record_comes_after_the_writes_booked_before_it(tmp_path, clock):
    gateway = Gateway(tmp_path, "order", clock)

    async def scenario() -> None:
        session = connected(gateway)
        writes(session, clock, 1, 3)
        gateway.guard.audit.write({"kind": "hanging", "time_ms": clock.wall_ms()})  # e.g. the hanging scan's
        writes(session, clock, 4, 2)
        session.close("client_closed")  # the connection record
        assert [r["kind"] for r in gateway.audit()] == ["decision"] * 3 + ["hanging"] + ["decision"] * 2 + \
            ["connection"]

    run(scenario(), clock)
    assert [b[2] for b in gateway.batches] == [3, 2]


def test_the_once_a_second_upkeep_records_the_ledger(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(guard_module, "LEDGER_DELAY_S", 3600.0)  # only the upkeep can record it
    gateway = Gateway(tmp_path, "upkeep", clock)

    async def scenario() -> None:
        session = connected(gateway)
        writes(session, clock, 1, 2)
        assert gateway.batches == []
        gateway.guard.housekeeping()  # Proxy._timer_loop, once a second
        assert [b[2] for b in gateway.batches] == [2] and len(gateway.audit()) == 2

    run(scenario(), clock)

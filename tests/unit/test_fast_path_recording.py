"""What the proxy records of transactional writes is the same whether the relay's fast path checked them in
place (the core's ledger, `TransactionGuard.record_fast`) or the general path did (`Decided`, `record`): every
metric sample and every audit record, time included, in the same order, over the same traffic. The shell's
part is played as proxy/session.py does it: the fast call first; after a fast read that left something in
the guard's ledger, `booked` (recorded in a batch, by the guard's timer); the ledger recorded before a call's
commands. The clock moves a millisecond a read and is the event loop's too (virtual_time.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from connection_playbook import (
    EPOCH,
    PID,
    T0,
    T1,
    TXN,
    FakeClock,
    FakeCluster,
    heartbeat,
    heartbeat_response,
    produce,
    produce_response,
    txn_offset_commit,
    txn_offset_commit_response,
)
from virtual_time import run

from txnguard.codecs.groups import offsets_partition_for
from txnguard.connection import commands as c
from txnguard.connection.core import Connection, Settings
from txnguard.connection.ledger import Ledger, Passed, PassedOffsets
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.checks import PartitionVerdicts
from txnguard.verification.inventory import ConnectionInventory
from txnguard.verification.verdicts import Evidence, Outcome, Verdict

T2 = ("audit.events", 0)
OFFSETS_PARTITIONS = 50
NOT_ADDED_GROUP = ("__consumer_offsets", offsets_partition_for("h", OFFSETS_PARTITIONS))  # no AddOffsetsToTxn(h)


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))


class _Shell:
    """proxy/session.py's handling of one connection, without sockets."""

    def __init__(self, tmp: Path, name: str, fast: bool, policy: dict[str, Any]) -> None:
        self.audit_path = tmp / f"{name}.jsonl"
        self.metrics = ProxyMetrics()
        config = ProxyConfig(upstream=(HostPort("127.0.0.1", 9),), audit_path=str(self.audit_path))
        self.clock = clock = FakeClock()
        self.guard = TransactionGuard(config, self.metrics, policy_from_config(policy), None, clock=clock)
        self.guard.registry.init_producer_id(TXN, PID, EPOCH, 60_000, clock.wall_ms())
        self.guard.registry.added(TXN, PID, EPOCH, clock.wall_ms(), partitions={T0, T1, T2})
        self.guard.registry.added(TXN, PID, EPOCH, clock.wall_ms(), group="g")  # AddOffsetsToTxn(g) was answered
        self.guard.rules.offsets_partitions = OFFSETS_PARTITIONS
        self.core = Connection(Settings(connection_id=1, listener="bootstrap", max_frame_bytes=1 << 20,
                                        pre_auth_max_frame_bytes=None, max_in_flight=100, partial_frame_timeout_s=30.0,
                                        idle_timeout_s=600.0, fast_path=fast),
                               self.guard.rules, FakeCluster(), clock, self.metrics.traffic,
                               ConnectionInventory("client", 0))
        self.core.ledger = self.guard.ledger  # as proxy/session.py
        self.log = _Log()
        self.asked: list[c.Ask] = []
        self.sent = {c.SendToBroker: b"", c.SendToClient: b""}  # every byte to each side
        self.booked = self.batches = 0  # fast reads that left something in the ledger; record_fast calls
        self.offsets = 0  # offset commits the fast path booked
        record_fast = self.guard.record_fast

        def counted(ledger: Any) -> None:
            self.batches += 1
            self.offsets += len(ledger.offsets)
            record_fast(ledger)

        self.guard.record_fast = counted  # type: ignore[method-assign]

    def _execute(self, commands: list[c.Command]) -> None:
        ledger = self.core.ledger
        if ledger.passed or ledger.windows:
            self.guard.flush_ledger()
        for command in commands:
            if isinstance(command, c.Decided):
                self.guard.record(command.decision, self.log)
            elif isinstance(command, c.Ask):
                self.asked.append(command)
            elif isinstance(command, c.SendToBroker | c.SendToClient):
                self.sent[type(command)] += b"".join(bytes(b) for b in command.data)

    def _booked(self) -> None:
        ledger = self.core.ledger
        if ledger.passed or ledger.windows:
            self.booked += 1
            self.guard.booked()

    def from_client(self, data: bytes) -> None:
        self.clock.seconds += 0.001
        done = self.core.relay_from_client(data)
        if done == len(data):
            self.sent[c.SendToBroker] += data
            self._booked()
        else:
            self._execute(self.core.receive_from_client(data, done))

    def from_broker(self, data: bytes) -> None:
        self.clock.seconds += 0.001
        done = self.core.relay_from_broker(data)
        if done == len(data):
            self.sent[c.SendToClient] += data
            self._booked()
        else:
            self._execute(self.core.receive_from_broker(data, done))

    def samples(self) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                      for metric in self.metrics.registry.collect() for s in metric.samples
                      # process_*: this test process's CPU and memory, which move between two reads
                      if not s.name.endswith("_created") and not s.name.startswith("process_"))

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]


def _play(shell: _Shell) -> None:
    """The traffic, then the event loop runs until the guard's timer has recorded what was left."""

    async def play() -> None:
        _traffic(shell)
        await asyncio.sleep(1)

    run(play(), shell.clock)


def _traffic(shell: _Shell) -> None:
    shell.from_client(heartbeat(0))  # names the client: the fast path starts after it
    shell.from_broker(heartbeat_response(0))
    cid = 1
    for i in range(30):
        parts = [[T0], [T0, T1], [T2], [T1, T2]][i % 4]
        requests = [produce(cid, parts, version=3 + i % 9), heartbeat(cid + 1)]
        answers = [produce_response(cid, parts, version=max(8, 3 + i % 9)), heartbeat_response(cid + 1)]
        if i % 3 == 1:  # the group's offsets, between the write and the heartbeat (v0-v4 in turn)
            requests.insert(1, txn_offset_commit(cid + 3, version=i % 5))
            answers.insert(1, txn_offset_commit_response(cid + 3, version=i % 5))
            cid += 1
        if i % 5 == 0:  # a partition never added: the verifier is asked (the general path, and a hold)
            requests.append(produce(cid + 2, [("orders", 9)]))
        elif i % 10 == 7:  # a group never added: likewise
            requests.append(txn_offset_commit(cid + 2, group="h"))
        shell.from_client(b"".join(requests))
        shell.from_broker(b"".join(answers))
        if i % 5 == 0 or i % 10 == 7:  # the general path rejects what the verifier found (not in the transaction)
            [ask] = shell.asked
            shell.asked = []
            asked = ("orders", 9) if i % 5 == 0 else NOT_ADDED_GROUP
            shell._execute(shell.core.answered(ask.check_id, PartitionVerdicts({asked: Verdict(
                Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not added")})))
            cid += 1
        cid += 2


def test_the_fast_path_records_exactly_what_the_general_path_records(tmp_path: Path) -> None:
    policy = {"rules": [{"topic": "audit.*", "mode": "monitor"}]}
    fast, general = _Shell(tmp_path, "fast", True, policy), _Shell(tmp_path, "general", False, policy)
    for shell in (fast, general):
        _play(shell)
    assert fast.sent == general.sent
    assert fast.samples() == general.samples()
    assert fast.audit() == general.audit()  # each with its decision's time, though recorded later
    assert fast.audit_path.read_bytes() == general.audit_path.read_bytes()  # and byte for byte
    assert fast.log.lines == general.log.lines
    passed = [r for r in general.audit() if r["kind"] == "decision" and r["decision"] == "forwarded"]
    commits = [r for r in passed if r["api"] == "txn_offset_commit"]
    assert len(passed) == 15 * 3 + 10 and {r["mode"] for r in passed} == {"enforce", "monitor"}
    assert [(r["target"], r["api_version"]) for r in commits] == [("group:g", i % 5) for i in range(1, 30, 3)]
    assert len({r["time_ms"] for r in passed}) == 30  # a millisecond a read: the times tell the writes apart
    # Each offset commit's record follows its read's write's records (the order of the requests).
    assert [r["api"] for r in general.audit()[:6]] == ["produce"] * 4 + ["txn_offset_commit", "produce"]
    assert [s for s in fast.samples() if s[0] == "txnguard_verification_window_ms_count"] == [
        ("txnguard_verification_window_ms_count", (("evidence", "local"),), 40.0)]  # one per write answered
    assert ("txnguard_inspection_time_ms_count", (("api", "txn_offset_commit"),), 13.0) in fast.samples()
    assert fast.offsets == 10 and general.offsets == 0  # those with local evidence were checked in place
    # Recorded in batches, not once per fast read (how many reads the fast path takes here depends on what it
    # reads in place: 54 of the 60 reads with a Produce or its answer; a batch ends where the general path
    # takes a read, or at the timer).
    # test_ledger_batches.py counts the batches of plainer traffic.
    assert general.booked == 0 and fast.booked > 30 and fast.batches <= fast.booked // 2


def test_the_fast_path_takes_the_transactional_writes_it_can(tmp_path: Path) -> None:
    """Not a tautology of the test above: the fast shell really relayed the verified writes itself."""
    shell = _Shell(tmp_path, "fast", True, {})
    shell.from_client(heartbeat(0))
    shell.from_broker(heartbeat_response(0))
    read = produce(1, [T0, T1]) + heartbeat(2)
    assert shell.core.relay_from_client(read) == len(read)
    assert [p[1:6] for p in shell.core.ledger.passed] == [(TXN, PID, EPOCH, 9, [T0, T1])]  # txn id .. partitions
    answers = produce_response(1, [T0, T1]) + heartbeat_response(2)
    assert shell.core.relay_from_broker(answers) == len(answers)
    assert shell.core.ledger.windows == [("local", 0.0)]
    read = produce(3, [T2]) + txn_offset_commit(4) + produce(5, [T0])
    assert shell.core.relay_from_client(read) == len(read)
    assert [p.partitions for p in shell.core.ledger.passed] == [[T0, T1], [T2], [T0]]
    assert [(*o[1:6], o.place) for o in shell.core.ledger.offsets] == [(TXN, PID, EPOCH, 3, "g", 2)]  # after [T2]


def test_a_plain_histogram_exports_what_a_prometheus_client_histogram_does() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from txnguard.proxy.traffic_metrics import PlainHistogram

    buckets = (0.01, 0.025, 0.5, 1, 2.5, 10000)
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    h = Histogram("h_ms", "doc", ["evidence"], buckets=buckets, registry=theirs)
    p = PlainHistogram("h_ms", "doc", ["evidence"], buckets=buckets, registry=ours)
    for i, value in enumerate([0.0, 0.01, 0.0100001, 0.5, 1, 3, 10000, 10001.5, 0.024, 1e-9]):
        for hist in (h, p):
            hist.labels("local" if i % 3 else "cache").observe(value)

    def samples(r: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
        return sorted(((s.name, s.labels, s.value) for m in r.collect() for s in m.samples
                       if not s.name.endswith("_created") and not s.name.startswith("process_")), key=repr)

    assert samples(ours) == samples(theirs)


def test_a_passed_writes_audit_text_is_what_write_serialises(tmp_path: Path) -> None:
    from txnguard.policies.enforcement import Enforcement
    from txnguard.proxy.guard import AuditLog, _passed_template
    from txnguard.verification.audit import ClientInfo, audit_record
    from txnguard.verification.registry import _PASSED_FROM_CACHE

    client = ClientInfo("c\"1", None, "2.0", "java", "bootstrap", 3)
    log = AuditLog(str(tmp_path / "a.jsonl"))
    texts = []
    for latency, cpu in [(0.0, None), (0.0123456, 0.00005), (12.5, 1e-7), (123456.789012, 3.0)]:
        log.write(audit_record(time_ms=1764250000123, transactional_id="t-é", producer_id=9, producer_epoch=2,
                               api="produce", api_version=7, target="orders-3", verdict=_PASSED_FROM_CACHE,
                               decision="forwarded", error_sent=None, error_name=None, latency_ms=latency,
                               client=client, mode="monitor", proxy_id="p:1", cpu_ms=cpu))
        a, b, c, d = _passed_template(client, "t-é", 9, 2, 7, "orders-3", _PASSED_FROM_CACHE, Enforcement.MONITOR,
                                      "p:1")
        texts.append(f"{a}1764250000123{b}{round(latency, 4)!r}{c}"
                     f"{'null' if cpu is None else repr(round(cpu, 4))}{d}")
    log.close()
    assert (tmp_path / "a.jsonl").read_text().splitlines() == texts


def test_observe_many_is_observe_of_each_value_in_turn() -> None:
    """A batch's observations: the same bucket counts and the same float sum, added in the same order (near
    1e16 a float's step is 2: 1e16 + 1.0 rounds the 1.0 away, so the order of the additions shows)."""
    from txnguard.proxy.traffic_metrics import PlainHistogramChild

    bounds = (0.5, 1.0, 2.5)
    values = [1e16, 1.0, 1.0, 0.1, 0.2, 0.3, 2.5, 0.0]
    one_by_one, batched = PlainHistogramChild(bounds), PlainHistogramChild(bounds)
    for value in values:
        one_by_one.observe(value)
    batched.observe_many(values[:3])
    batched.observe_many(values[3:])
    assert (batched.counts, batched.sum) == (one_by_one.counts, one_by_one.sum)
    assert batched.counts == [4, 2, 1, 1] and sum(sorted(values)) != batched.sum  # the order matters here


def test_record_fast_of_writes_and_offset_commits_is_record_of_their_decisions_in_order(tmp_path: Path) -> None:
    """The ledger's records against the `Decision`s they stand for, with timings the fake clock never gives (every
    value differs; near 1e16 the order of a histogram's additions shows: test_observe_many_is_...): both kinds
    share the verification_time children, and each has its own inspection_time child (by its check's api)."""
    from txnguard.codecs.produce import ProducePartition
    from txnguard.policies.enforcement import Enforcement
    from txnguard.verification.audit import ClientInfo
    from txnguard.verification.checks import OffsetCommitWrite, ProduceWrite
    from txnguard.verification.decisions import FORWARDED, Decision, RequestContext, VerdictRecord
    from txnguard.verification.registry import _PASSED_FROM_CACHE, _PASSED_LOCALLY

    client = ClientInfo("c\"1", "librdkafka", "2.3.0", "librdkafka", "bootstrap", 3)
    frame = memoryview(b"\0\0\0\0")
    # (kind, version, partitions or group, verdict, mode, inspection, elapsed, cpu, wall ms): in the order booked.
    booked: list[tuple[str, int, Any, Verdict, Enforcement, float, float, float | None, int]] = [
        ("produce", 9, [T0, T1], _PASSED_LOCALLY, Enforcement.ENFORCE, 0.25, 0.5, 0.0123456, 1_700_000_000_001),
        ("offsets", 3, "g", _PASSED_LOCALLY, Enforcement.ENFORCE, 0.5, 1e16, None, 1_700_000_000_002),
        ("offsets", 0, "g-\u00e9", _PASSED_FROM_CACHE, Enforcement.MONITOR, 0.75, 1.0, 3.0, 1_700_000_000_003),
        ("produce", 11, [T2], _PASSED_LOCALLY, Enforcement.MONITOR, 0.125, 1.0, 1e-7, 1_700_000_000_004),
        ("offsets", 4, "g", _PASSED_LOCALLY, Enforcement.ENFORCE, 12.5, 0.1, 0.00005, 1_700_000_000_005),
    ]
    fast, general = _Shell(tmp_path, "fast", True, {}), _Shell(tmp_path, "general", False, {})
    ledger = Ledger()
    for kind, version, what, v, mode, inspection, elapsed, cpu, wall_ms in booked:
        if kind == "produce":
            ledger.passed.append(Passed(client, TXN, PID, EPOCH, version, what, v, mode, inspection, elapsed, cpu,
                                        wall_ms, 0.0))
            check: Any = ProduceWrite(tuple(ProducePartition(t, p, []) for t, p in what))
            targets = [f"{t}-{p}" for t, p in what]
        else:
            ledger.offsets.append(PassedOffsets(client, TXN, PID, EPOCH, version, what, v, mode, inspection, elapsed,
                                                cpu, wall_ms, 0.0, len(ledger.passed)))
            check, targets = OffsetCommitWrite(what), [f"group:{what}"]
        general.clock.seconds = wall_ms / 1000  # `record` stamps a record when it records it
        ctx = RequestContext(check, version, TXN, PID, EPOCH, mode, frame, None, None, client,
                             inspection_ms=inspection)
        general.guard.record(Decision(forward=frame, context=ctx, records=[
            VerdictRecord(t, v, FORWARDED, None, False) for t in targets], elapsed_ms=elapsed, cpu_ms=cpu), general.log)
    fast.guard.record_fast(ledger)
    fast.guard.audit.close()
    general.guard.audit.close()
    assert fast.audit_path.read_bytes() == general.audit_path.read_bytes()
    assert [r["api"] for r in fast.audit()] == ["produce"] * 2 + ["txn_offset_commit"] * 2 + ["produce",
                                                                                              "txn_offset_commit"]
    assert fast.samples() == general.samples()
    assert fast.log.lines == general.log.lines == []

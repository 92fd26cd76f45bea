"""Upgrades without downtime under a live transactional copier (issue 21, item 4).

    confluent-kafka copier ──▶ front: a gateway, two gateway replicas, or a sidecar per broker
                                ──▶ Kafka in ZooKeeper mode, 3 brokers
    steps, one at a time, each: its own input records ─▶ its action ─▶ those records copied (committed):
      broker roll:  broker N SIGTERM ─▶ restarted on 3.9.2 with its data folder, inter.broker.protocol.version
                    3.4 written before (Kafka's upgrade notes, ZooKeeper-based clusters, step 1), wait until
                    every partition is in sync; then each broker again with the protocol raised to 3.9
      proxy roll:   a sidecar (or a gateway replica) SIGTERM ─▶ it drains and exits ─▶ started on its ports

The roll drives the copier (clients.confluent_exactly_once_copy in a child process, see bounce.ConfluentChild):
each step writes its own `per_step` input records, then runs its action, and ends once the copier has committed
every input record written so far. So every step meets a copy of its own records (the copier cannot run dry
before the last step, nor the roll leave a step with nothing copied), and the copier stops when the roll ends:
it is asked for `per_step` records per step, no more. It commits every `commit_every` input records and pauses
`pace_s` after each commit, which spreads a step's copy over its action. No bound on how long a step takes: only
a copier that commits nothing for `stall_s` while it has records to copy is given up on (stuck, not slow). What
the copier saw (commits, errors by kind), what the proxies logged at warning level and what they refused (their
audit records) is counted per step. After the copy: the output at read_committed against the input (lost,
duplicated), and find-hanging with a 0-minute bound (bounce._hanging) on the output and the group's
__consumer_offsets partition.

Used by bench/rolling_upgrade_zk.py and tests/integration/test_rolling_upgrade_zk.py.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import clients, raw
from txnguard.testing.bounce import (
    ConfluentChild,
    free_port,
    gateway,
    listener_ports,
    read_back,
    sidecar,
)
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyProcess

FROM, TO = "3.4.1", "3.9.2"
IBP = "inter.broker.protocol.version"
FROM_IBP, TO_IBP = "3.4", "3.9"
ERROR_KINDS = ("retriable", "abortable", "delivery", "fatal", "hung")
HUNG_AFTER_S = 30.0  # past send_offsets_to_transaction's own timeout: the copier abandons the producer
COPIER_TIMEOUT_S = 300.0  # the copier's bound on each of its calls (init, commit, abort), not on the copy
STALL_S = 600.0  # no commit for this long with records to copy: the copier is stuck (a step takes under a minute)
# librdkafka fails every record still queued or in flight when abort_transaction runs, with one of these.
PURGED = ("_PURGE_QUEUE", "_PURGE_INFLIGHT")
# What the step table says of each broker's ApiVersions: the APIs a transactional copy goes through.
SHOWN_APIS = {ApiKey.PRODUCE: "Produce", ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", ApiKey.END_TXN: "EndTxn",
              ApiKey.DESCRIBE_TRANSACTIONS: "DescribeTransactions"}


def after_commit(committed: Any, seconds: float, copied: int) -> None:
    """The copier's progress hook: tell the roll how many input records are committed, then pause."""
    committed.value = copied
    time.sleep(seconds)


@dataclass
class Step:
    name: str
    action: Callable[[], str | None]  # returns a detail for the table (or None)
    started: float = 0.0
    ended: float = 0.0
    detail: str = ""


class Front:
    """The txnguard processes between the copier and Kafka; every one ever started keeps its log and audit."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.bootstrap = ""
        self.files: list[tuple[Path, Path]] = []  # (log, audit) of every process started
        self.running: dict[Any, ProxyProcess] = {}

    def _paths(self, name: str) -> tuple[Path, Path]:
        log, audit = self.tmp / f"{name}-{len(self.files)}.log", self.tmp / f"{name}-{len(self.files)}.jsonl"
        self.files.append((log, audit))
        return log, audit

    def start(self) -> None:
        raise NotImplementedError

    def _start_one(self, key: Any) -> ProxyProcess:
        raise NotImplementedError

    def restart(self, key: Any) -> str:
        """SIGTERM one process, wait for it to drain and exit, start it again on the same ports."""
        signalled = time.monotonic()
        code = self.running.pop(key).terminate(60)
        exited = time.monotonic() - signalled
        self.running[key] = self._start_one(key)
        return f"exit {code} {exited:.1f} s after SIGTERM, ready again after {time.monotonic() - signalled:.1f} s"

    def stop(self) -> None:
        for p in self.running.values():
            if p.proc is not None and p.proc.poll() is None:
                p.terminate()


class Direct(Front):
    """The control: no txnguard, the copier bootstraps from the brokers themselves."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        self.bootstrap = cluster.bootstrap_servers

    def start(self) -> None:
        pass


class Gateways(Front):
    """`replicas` gateway processes, each on its own ports; the client bootstraps from all of them."""

    def __init__(self, cluster: Cluster, tmp: Path, replicas: int = 1) -> None:
        super().__init__(cluster, tmp)
        self.ports = {i: (free_port(), free_port(), listener_ports(cluster)) for i in range(1, replicas + 1)}
        self.bootstrap = ",".join(f"127.0.0.1:{port}" for port, _, _ in self.ports.values())

    def start(self) -> None:
        for i in self.ports:
            self.running[i] = self._start_one(i)

    def _start_one(self, key: Any) -> ProxyProcess:
        port, admin, brokers = self.ports[key]
        log, audit = self._paths(f"gateway-{key}")
        return gateway(self.cluster, port, admin, audit, log, brokers)


class Sidecars(Front):
    """A sidecar per broker (the cluster in sidecar layout); the client bootstraps from the sidecars."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        self.admin = {n.id: free_port() for n in cluster.nodes}
        self.bootstrap = cluster.sidecar_bootstrap

    def start(self) -> None:
        for n in self.cluster.nodes:
            self.running[n.id] = self._start_one(n.id)

    def _start_one(self, key: Any) -> ProxyProcess:
        log, audit = self._paths(f"sidecar-{key}")
        return sidecar(self.cluster.node(key), self.admin[key], audit, log)


def api_ranges(cluster: Cluster) -> str:
    """Each live broker's version and the ApiVersions ranges of SHOWN_APIS, asked of the broker itself."""
    parts = []
    for n in cluster.nodes:
        try:
            with raw.RawClient(n.host, n.port, timeout=5) as c:
                keys = {int(k.api_key): int(k.max_version) for k in c.api_versions().api_keys}
        except (OSError, raw.RawProtocolError):
            parts.append(f"{n.id}: down")
            continue
        shown = " ".join(f"{name} {keys[k]}" if k in keys else f"no {name}" for k, name in SHOWN_APIS.items())
        parts.append(f"{n.id} ({n.version or cluster.version}): {shown}")
    return "; ".join(parts)


def _baseline(cluster: Cluster, seconds: float) -> str:
    time.sleep(seconds)
    return api_ranges(cluster)


def broker_roll(cluster: Cluster, _front: Front | None = None) -> list[Step]:
    """Kafka's rolling upgrade of a ZooKeeper-based cluster, FROM -> TO: each broker restarted on TO with
    the protocol held at FROM_IBP, then each again with the protocol raised to TO_IBP."""

    def roll(node_id: int, version: str, ibp: str) -> str:
        cluster.upgrade_node(node_id, version, {IBP: ibp})
        cluster.wait_in_sync()
        return api_ranges(cluster)

    steps = [Step(f"broker {n.id}: {FROM} -> {TO}, {IBP}={FROM_IBP}", functools.partial(roll, n.id, TO, FROM_IBP))
             for n in cluster.nodes]
    steps += [Step(f"broker {n.id}: {IBP} {FROM_IBP} -> {TO_IBP}", functools.partial(roll, n.id, TO, TO_IBP))
              for n in cluster.nodes]
    return steps


def proxy_roll(_cluster: Cluster, front: Front) -> list[Step]:
    """Each process of `front` restarted in turn (SIGTERM, drain, start on the same ports)."""
    return [Step(f"{type(front).__name__.lower().rstrip('s')} {key}: SIGTERM, drain, restart",
                 functools.partial(front.restart, key)) for key in list(front.running)]


@dataclass
class StepRow:
    name: str
    seconds: float
    copied: int
    errors: Counter[str]
    warnings: Counter[str]
    refusals: Counter[str]
    detail: str

    def row(self) -> str:
        def fmt(c: Counter[str]) -> str:
            return ", ".join(f"{n} x {k}" for k, n in sorted(c.items())) or "none"
        errors = " / ".join(str(self.errors.get(k, 0)) for k in ERROR_KINDS)
        return (f"| {self.name} | {self.seconds:.0f} s | {self.copied} | {errors} | {fmt(self.warnings)} | "
                f"{fmt(self.refusals)} | {self.detail} |")


STEP_HEADER = ("| step | took | records copied | client errors (retriable / abortable / delivery / fatal / hung) | "
               "proxy warnings | proxy refusals | detail |\n| --- | --- | --- | --- | --- | --- | --- |")


@dataclass
class RollResult:
    variant: str
    records: int
    copied: int
    lost: int
    duplicated: int
    hanging: int
    finished: bool
    seconds: float
    outcome: str
    steps: list[StepRow] = field(default_factory=list)
    error_texts: Counter[str] = field(default_factory=Counter)
    client_errors: list[tuple[str, str]] = field(default_factory=list)  # (kind, text), in the order seen

    def errors(self, kind: str) -> int:
        return sum(1 for k, _ in self.client_errors if k == kind)

    @property
    def fatal(self) -> int:
        return self.errors("fatal")

    @property
    def failed_deliveries(self) -> list[str]:
        """Records the brokers or the proxy refused, or that timed out: every delivery error but the purge of an
        aborted transaction's records (those are the abort's, and an abort redoes them)."""
        return [t for k, t in self.client_errors if k == "delivery" and not any(p in t for p in PURGED)]

    @property
    def purged_without_abort(self) -> int:
        """Records purged although the copier aborted nothing: something else failed them."""
        purged = self.errors("delivery") - len(self.failed_deliveries)
        return purged if self.errors("abortable") == 0 else 0

    @property
    def hung_while_quiet(self) -> int:
        """Producers abandoned in send_offsets_to_transaction during the first step, which restarts nothing:
        librdkafka #5511 needs the group coordinator's broker to leave the Metadata, so these are not it."""
        return self.steps[0].errors.get("hung", 0) if self.steps else 0

    @property
    def passed(self) -> bool:
        return (self.finished and self.lost == 0 and self.duplicated == 0 and self.hanging == 0
                and self.fatal == 0 and not self.failed_deliveries and self.purged_without_abort == 0
                and self.hung_while_quiet == 0)

    def report(self) -> str:
        rows = "\n".join(r.row() for r in self.steps)
        texts = "; ".join(f"{n} x {t}" for t, n in self.error_texts.most_common(8)) or "none"
        return (f"### {self.variant}\n\n{STEP_HEADER}\n{rows}\n\n"
                f"{self.copied} of {self.records} records copied; lost {self.lost}, duplicated {self.duplicated}, "
                f"hanging {self.hanging}; copier {'finished' if self.finished else 'did NOT finish'}; "
                f"{self.seconds:.0f} s; verdict: {'PASS' if self.passed else 'FAIL'}\n"
                f"client errors seen: {texts}\ncopier: {self.outcome}\n")


def _proxy_lines(front: Front) -> list[dict[str, Any]]:
    out = []
    for log, _ in front.files:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("level") in ("warning", "error", "critical") and "timestamp" in rec:
                rec["_t"] = datetime.datetime.fromisoformat(rec["timestamp"]).timestamp()
                out.append(rec)
    return out


def _refusals(front: Front) -> list[dict[str, Any]]:
    out = []
    for _, audit in front.files:
        for line in audit.read_text().splitlines() if audit.exists() else []:
            rec = json.loads(line)
            if rec.get("kind") == "decision" and rec.get("outcome") != "pass":
                out.append(rec)
    return out


def _copied_up_to(job: ConfluentChild, committed: Any, target: int, stall_s: float) -> str | None:
    """Wait until the copier has committed `target` input records; else why not (it ended, or it is stuck)."""
    seen, since = committed.value, time.monotonic()
    while committed.value < target:
        if job.done():
            return "the copier ended first"
        if committed.value != seen:
            seen, since = committed.value, time.monotonic()
        elif time.monotonic() - since > stall_s:
            return f"the copier committed nothing for {stall_s:.0f} s with {target - seen} records to copy"
        time.sleep(0.1)
    return None


def run_roll(cluster: Cluster, front: Front, make_steps: Callable[[Cluster, Front], list[Step]], tmp: Path, *,
             variant: str, per_step: int = 500, commit_every: int = 50, pace_s: float = 0.5,
             baseline_s: float = 5.0, stall_s: float = STALL_S) -> RollResult:
    """Start `front`, then each step in turn: `per_step` new input records, the step's action, and their copy
    through `front` committed; then check the output."""
    u = uuid.uuid4().hex[:8]
    group, txn_id = f"group-{u}", f"tid-{u}"
    # min.insync.replicas 2 as a production topic has it: a step that took two replicas away would show.
    configs = {"min.insync.replicas": "2"}
    source = fresh_topic(cluster, f"roll-in-{u}", replication_factor=3, configs=configs)
    sink = fresh_topic(cluster, f"roll-out-{u}", replication_factor=3, configs=configs)
    steps: list[Step] = []
    ran: list[Step] = []
    values: list[bytes] = []
    committed = multiprocessing.get_context("spawn").Value("q", 0)  # input records the copier committed so far
    started = time.monotonic()
    job: ConfluentChild | None = None
    stopped = ""
    trace = tmp / f"copier-{u}.trace"  # where the copier is, line by line (a stuck one sends no result)
    try:
        front.start()
        steps = [Step("start, then a quiet baseline", functools.partial(_baseline, cluster, baseline_s)),
                 *make_steps(cluster, front)]
        records = per_step * len(steps)
        values = [f"roll-{i:06d}".encode() for i in range(records)]
        # Every broker leaves the Metadata while it restarts: librdkafka #5511 can then leave
        # send_offsets_to_transaction blocked forever (a client bug, shown without txnguard by
        # bench/librdkafka_5511.py); the copier abandons such a producer after 30 s and goes on ("hung").
        # No deadline for the whole copy: the roll sets its pace, and gives up only on a stall (stall_s).
        job = ConfluentChild(front.bootstrap, source, sink, txn_id, group, records, commit_every=commit_every,
                             timeout_s=COPIER_TIMEOUT_S, deadline_s=math.inf,
                             progress=functools.partial(after_commit, committed, pace_s),
                             watch_send_offsets_s=HUNG_AFTER_S, trace=str(trace))
        for n, step in enumerate(steps):
            step.started = time.time()
            ran.append(step)
            clients.ConfluentKafkaClient().produce(cluster.bootstrap_servers, source,
                                                   values[n * per_step:(n + 1) * per_step], partition=0)
            step.detail = step.action() or ""
            stopped = _copied_up_to(job, committed, (n + 1) * per_step, stall_s) or ""
            if stopped and trace.exists():
                stopped += "; the copier's last steps: " + " | ".join(trace.read_text().splitlines()[-8:])
            step.ended = time.time()
            if stopped:
                break
        outcome = job.result(0 if stopped else 60)
        out, hanging, left_open = read_back(cluster, sink, group)
    finally:
        if job is not None and not job.done():
            job.result(0)
        front.stop()
    expected = [clients.copy_of(v) for v in values[:len(ran) * per_step]]  # what the steps that ran wrote
    timeline: list[tuple[float, str, str]] = getattr(outcome, "timeline", [])
    commits = [(t, int(text)) for t, kind, text in timeline if kind == "committed"]
    warnings, refusals = _proxy_lines(front), _refusals(front)

    def copied_by(t: float) -> int:
        return max((n for when, n in commits if when < t), default=0)

    rows = []
    for i, step in enumerate(ran):
        # The first row counts what came before it too (the proxies' start), the last whatever came after.
        a, b = step.started, step.ended
        first, last = (0.0 if i == 0 else a), (b + 1e9 if i == len(ran) - 1 else b)
        rows.append(StepRow(
            step.name, b - a, copied_by(last) - copied_by(a),
            Counter(kind for t, kind, _ in timeline if kind != "committed" and first <= t < last),
            Counter(str(w.get("event")) for w in warnings if first <= w["_t"] < last),
            Counter(f"{r['outcome']}/{r.get('evidence')}: {r.get('reason')}" for r in refusals
                    if first * 1000 <= r["time_ms"] < last * 1000),
            step.detail))
    copied = getattr(outcome, "copied", 0)
    return RollResult(
        variant, len(values), copied, len(set(expected) - set(out)), len(out) - len(set(out)), hanging,
        finished=copied == len(values) and len(ran) == len(steps), seconds=time.monotonic() - started,
        outcome=(f"{stopped}: " if stopped else "") + (str(outcome)[:300] if not timeline else
        f"{copied} copied in {getattr(outcome, 'transactions', 0)} transactions, {getattr(outcome, 'aborted', 0)} "
        f"aborted, {getattr(outcome, 'producers', 1)} producer(s){'; ' + left_open[:200] if left_open else ''}"),
        steps=rows, error_texts=Counter(text.split(" (")[0][:120] for _, kind, text in timeline if kind != "committed"),
        client_errors=[(kind, text) for _, kind, text in timeline if kind != "committed"])

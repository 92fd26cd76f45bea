"""One J1-lite run: both modes at once, under the same faults, then a final read and the check per mode.

    direct:   writers, readers ──────────────▶ FaultRelay(sidecar port) ──▶ 3 brokers
    proxied:  writers, readers ──▶ gateway ──▶ FaultRelay(sidecar port) ──▶ 3 brokers

The cluster uses the harness's sidecar layout: every broker advertises a port of its own for clients
(where its relay listens) and replicates over another listener, so clients and the gateway that follow
metadata stay behind the relays, while replication and the final read do not. Both modes run at the same
time on their own topics and transactional ids, so each fault window hits both alike (proxy-kill only
touches the proxied clients). Used by tests/integration/test_jepsen_lite.py and bench/jepsen_lite.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from txnguard.testing import kafka
from txnguard.testing.faults import FaultRelay
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.jepsen.checker import CLASSES, CheckResult, check
from txnguard.testing.jepsen.history import History, of_mode
from txnguard.testing.jepsen.nemesis import KINDS, Gateway, Nemesis, NemesisConfig
from txnguard.testing.jepsen.workload import Reader, WorkloadConfig, Writer, final_read


@dataclass
class RunConfig:
    nemesis: NemesisConfig = field(default_factory=NemesisConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    version: str = "3.5.2"
    warmup_s: float = 30.0     # at most, until every mode committed a transaction
    settle_s: float = 15.0     # at most, for the last stable offsets to reach the log end before the final read


@dataclass
class ModeResult:
    mode: str
    check: dict[str, Any]
    per_kind: dict[str, dict[str, int]]   # fault kind -> anomaly class -> count
    crashed: list[str]


@dataclass
class RunResult:
    config: dict[str, Any]
    seconds: float
    history: str
    modes: dict[str, ModeResult]
    nemesis_errors: list[str]
    out_of_sync: list[str]      # heals after which replicas had not caught up within 60 s (the next window overlaps)
    windows: list[str]          # the fault kinds, in the order they ran
    applied: list[int]          # per window: frames its relay faults hit, or processes it signalled
    outcomes: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # kind -> mode -> ok/fail/info

    def activity(self) -> str:
        """Per fault kind: windows, what they applied, transactions completed per mode (ok/fail/info)."""
        modes = list(self.modes)
        rows = ["| fault kind | windows | frames hit / processes signalled | " +
                " | ".join(f"{m} txns ok/fail/info" for m in modes) + " |",
                "|" + "---|" * (3 + len(modes))]
        for kind in dict.fromkeys(self.windows):
            n = self.windows.count(kind)
            applied = sum(a for k, a in zip(self.windows, self.applied, strict=False) if k == kind)
            cells = ["/".join(str(self.outcomes.get(kind, {}).get(m, {}).get(t, 0)) for t in ("ok", "fail", "info"))
                     for m in modes]
            rows.append(f"| {kind} | {n} | {applied} | " + " | ".join(cells) + " |")
        return "\n".join(rows)

    def table(self) -> str:
        """Anomalies per fault kind, direct vs proxied, one row per kind that ran."""
        modes = list(self.modes)
        head = "| fault kind | " + " | ".join(f"{m}: {c}" for c in CLASSES for m in modes) + " |"
        rows = [head, "|" + "---|" * (1 + len(CLASSES) * len(modes))]
        for kind in ["none", *dict.fromkeys(self.windows)]:
            cells = [str(self.modes[m].per_kind.get(kind, {}).get(c, 0)) for c in CLASSES for m in modes]
            rows.append(f"| {kind} | " + " | ".join(cells) + " |")
        return "\n".join(rows)


def start_relays(cluster: kafka.Cluster) -> dict[int, FaultRelay]:
    relays = {}
    for n in cluster.nodes:
        assert n.sidecar_port is not None, "J1-lite needs a cluster in the sidecar layout (kafka.up(sidecars=True))"
        relays[n.id] = FaultRelay((n.host, n.port), port=n.sidecar_port).start()
    return relays


def _processes(cfg: RunConfig, history: History, stop: threading.Event, bootstrap: dict[str, str],
               topics: dict[str, str], u: str) -> list[Writer | Reader]:
    out: list[Writer | Reader] = []
    for m in cfg.nemesis.modes:
        for i in range(cfg.workload.writers):
            seed = cfg.nemesis.seed * 1000 + i + (500 if m == "proxied" else 0)
            out.append(Writer(f"{m}/w{i}", history, stop, bootstrap[m], topics[m], f"jl-{m}-{u}-w{i}",
                              cfg.workload, seed=seed))
        for i in range(cfg.workload.readers):
            out.append(Reader(f"{m}/r{i}", history, stop, bootstrap[m], topics[m], f"jl-{m}-{u}-r{i}", cfg.workload))
    return out


def _warm_up(history: History, modes: list[str], timeout_s: float) -> None:
    """Until every mode committed a transaction: faults are meant for a workload that runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(
            any(op["type"] == "ok" and op["f"] == "txn" and op["process"].startswith(f"{m}/") for op in history.ops)
            for m in modes):
        time.sleep(0.2)


def _results(cfg: RunConfig, history: History, path: Path, processes: list[Writer | Reader],
             nemesis: Nemesis | None, seconds: float) -> RunResult:
    windows = [str(op["value"]["kind"]) for op in history.ops
               if op["f"] == "nemesis" and op["value"]["phase"] == "start"]
    applied = [int(op["value"].get("applied", 0)) for op in history.ops
               if op["f"] == "nemesis" and op["value"]["phase"] == "stop"]
    outcomes: dict[str, dict[str, dict[str, int]]] = {}
    kind = "none"
    for op in history.ops:
        if op["f"] == "nemesis" and op["value"]["phase"] == "start":
            kind = str(op["value"]["kind"])
        elif op["f"] == "txn" and op["type"] != "invoke":
            per = outcomes.setdefault(kind, {}).setdefault(op["process"].split("/")[0], {})
            per[op["type"]] = per.get(op["type"], 0) + 1
    results = {}
    for m in cfg.nemesis.modes:
        checked: CheckResult = check(of_mode(history.ops, m))
        mine = [p for p in processes if p.process.startswith(f"{m}/")]
        crashed = [f"{p.process}: {p.error!r}" for p in mine if p.error] + \
                  [f"{p.process}: still running at the end" for p in mine if p.is_alive()]
        results[m] = ModeResult(m, checked.summary(), checked.by_fault(), crashed)
    return RunResult(config={"nemesis": {**asdict(cfg.nemesis), "kinds": list(cfg.nemesis.kinds)},
                             "workload": asdict(cfg.workload), "version": cfg.version, "kinds_known": list(KINDS)},
                     seconds=round(seconds, 1), history=str(path), modes=results,
                     nemesis_errors=nemesis.errors if nemesis else [],
                     out_of_sync=nemesis.out_of_sync if nemesis else [], windows=windows,
                     applied=applied, outcomes=outcomes)


def run(cfg: RunConfig, workdir: Path, cluster: kafka.Cluster | None = None) -> RunResult:
    """A run on `cluster` (3 nodes, sidecar layout, no relays running) or on a cluster of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    own = cluster is None
    if cluster is None:
        cluster = kafka.up(cfg.version, 3, workdir / "kafka", sidecars=True, die_with_parent=True)
    relays: dict[int, FaultRelay] = {}
    gateway: Gateway | None = None
    history = History()
    stop = threading.Event()
    processes: list[Writer | Reader] = []
    nemesis: Nemesis | None = None
    started = time.monotonic()
    u = uuid.uuid4().hex[:6]
    modes = list(cfg.nemesis.modes)
    topics = {m: fresh_topic(cluster, f"jl-{m}-{u}", partitions=cfg.workload.partitions, replication_factor=3,
                             configs={"min.insync.replicas": "2"}) for m in modes}
    try:
        relays = start_relays(cluster)
        if "proxied" in modes:
            gateway = Gateway(cluster, cluster.sidecar_bootstrap, workdir)
            gateway.start()
        bootstrap = {"direct": cluster.sidecar_bootstrap, "proxied": gateway.bootstrap if gateway else ""}
        processes = _processes(cfg, history, stop, bootstrap, topics, u)
        for p in processes:
            p.start()
        _warm_up(history, modes, cfg.warmup_s)
        nemesis = Nemesis(cfg.nemesis, history, cluster, relays, gateway)
        nemesis.run()  # healed when it returns
        time.sleep(2)  # let the clients catch up before they stop
    finally:
        stop.set()
        if nemesis is not None:
            nemesis.heal()
        for p in processes:
            p.join(60)
        if gateway is not None:
            gateway.stop()
        path = workdir / f"history-{u}.jsonl"
        try:
            # Through the relays, now without faults: clients follow the brokers' advertised (relay) ports.
            for m in modes:
                final_read(history, f"{m}/final", cluster, topics[m], cfg.workload.partitions, settle_s=cfg.settle_s)
        finally:
            history.write_jsonl(path)  # the evidence, even when the final read failed
            for r in relays.values():
                r.stop()
            if own:
                cluster.down()
    return _results(cfg, history, path, processes, nemesis, time.monotonic() - started)

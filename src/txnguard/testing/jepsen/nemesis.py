"""The J1-lite nemesis: one fault kind at a time, rotated every `period_s`, each recorded with start and stop.

    clients ──▶ (proxy) ──▶ FaultRelay per broker ──▶ broker
                  ▲                 ▲                    ▲
              proxy-kill   delay, hold-endtxn,    broker-pause, broker-kill
                           reset, bandwidth

Kinds (parameters drawn from the run's seed):

    delay         responses of any API delayed 0.3-1.5 s, each with probability 0.2 (later ones wait behind)
    hold-endtxn   each relay holds the next EndTxn of each mode past the client's socket timeout, releases it
                  `hold_s` later while the producer is in its next transaction, and again (KAFKA-17754)
    reset         requests of any API reset their connection with probability 0.02
    bandwidth     both directions cut to 32 KiB/s
    broker-pause  SIGSTOP one broker (all its threads) for the window, SIGCONT at its end
    broker-kill   SIGKILL one broker; restarted at the end of the window, which ends once it is ready
    proxy-kill    SIGKILL the gateway process, restarted on the same ports `proxy_down_s` later (proxied
                  clients only; direct clients see a quiet window)
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.testing import bounce, kafka, raw
from txnguard.testing.faults import Action, Direction, Fault, FaultRelay
from txnguard.testing.jepsen.history import History
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyProcess

# Broker faults apart: a pause right before a kill can leave one replica in sync, and then a min.isr of 2
# (transaction state log, the workload's topics) refuses every write until a follower catches up.
KINDS = ("delay", "broker-pause", "hold-endtxn", "reset", "broker-kill", "bandwidth", "proxy-kill")
END_TXN = ApiKey.END_TXN


class Gateway:
    """A `txnguard run` gateway process whose upstream is the relays, restartable on the same ports."""

    def __init__(self, cluster: Cluster, upstream: str, workdir: Path) -> None:
        self.cluster, self.upstream, self.workdir = cluster, upstream, workdir
        self.port, self.admin = bounce.free_port(), bounce.free_port()
        self.broker_ports = bounce.listener_ports(cluster)
        self.proc: ProxyProcess | None = None
        self.starts = 0
        self.audits: list[Path] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        audit = self.workdir / f"gateway-{self.starts}.audit.jsonl"
        self.audits.append(audit)
        self.proc = bounce.gateway(self.cluster, self.port, self.admin, audit,
                                   self.workdir / f"gateway-{self.starts}.log", self.broker_ports,
                                   upstream=self.upstream)

    def kill(self) -> None:
        if self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None:
            bounce.kill(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()


@dataclass
class NemesisConfig:
    kinds: Sequence[str] = KINDS
    period_s: float = 15.0
    duration_s: float = 300.0
    hold_s: float = 5.0
    proxy_down_s: float = 1.5
    seed: int = 1
    modes: Sequence[str] = ("direct", "proxied")
    # Whose EndTxns hold-endtxn holds (None: every mode's; one mode's to see what the fault does to it alone).
    hold_modes: Sequence[str] | None = None

    @property
    def windows(self) -> int:
        """How many windows the rotation runs: as many whole periods as fit in duration_s, at least one."""
        return max(1, int((self.duration_s + 0.5) // self.period_s))


@dataclass
class Nemesis:
    cfg: NemesisConfig
    history: History
    cluster: Cluster
    relays: dict[int, FaultRelay]
    gateway: Gateway | None
    errors: list[str] = field(default_factory=list)
    out_of_sync: list[str] = field(default_factory=list)  # heals whose replicas did not catch up in time

    def __post_init__(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self._stop = threading.Event()
        self._paused: set[int] = set()
        self._killed: set[int] = set()
        self._installed: list[Fault] = []   # this window's relay faults, to count the frames they hit

    def abort(self) -> None:
        self._stop.set()

    # -- the schedule -------------------------------------------------------------------------------

    def run(self) -> None:
        """The whole rotation, then heal; in the calling thread, on purpose: brokers and the gateway it restarts
        are started with PR_SET_PDEATHSIG (die with the parent *thread*), so a nemesis thread that ended
        would take them down with it."""
        # Windows of period_s each from their own start: a slow heal (a broker's restart) delays the next
        # window rather than eating it. The number of windows is planned up front (duration_s / period_s), not
        # read off the clock as the run goes: on a loaded machine slow heals would otherwise drop the last kinds.
        windows = self.cfg.windows
        try:
            for i in range(windows):
                if self._stop.is_set():
                    break
                self._window(self.cfg.kinds[i % len(self.cfg.kinds)], time.monotonic() + self.cfg.period_s)
        finally:
            self.heal()

    def _window(self, kind: str, until: float) -> None:
        detail: dict[str, Any] = {}
        try:
            active: Callable[[float], None] = getattr(self, "_" + kind.replace("-", "_"))(detail)
        except Exception as e:  # noqa: BLE001 - a fault that could not start is recorded, the run goes on
            self.errors.append(f"{kind} start: {e!r}")
            self.history.record("nemesis", "info", "nemesis", {"kind": kind, "phase": "start", "error": repr(e)})
            self._sleep(until)
            return
        self.history.record("nemesis", "info", "nemesis", {"kind": kind, "phase": "start", **detail})
        try:
            active(until)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"{kind}: {e!r}")
        finally:
            # Frames a relay fault hit, or processes signalled: evidence that the window did something.
            applied = sum(f.applied for f in self._installed) + len(self._paused) + len(self._killed)
            self._installed = []
            try:
                self._clear_faults()
                self._heal_processes()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{kind} stop: {e!r}")
            self.history.record("nemesis", "info", "nemesis", {"kind": kind, "phase": "stop",
                                                               "applied": applied + detail.get("kills", 0)})

    def _sleep(self, until: float) -> None:
        self._stop.wait(max(0.0, until - time.monotonic()))

    # -- the kinds: each starts its fault and returns what keeps it going until the window ends -----------------

    def _each_relay(self, seed: int | None = None, **fault: Any) -> list[tuple[FaultRelay, Fault]]:
        """The same fault on every relay; a seeded one gets seed + node id, so relays do not fault in step."""
        added = [(r, r.add(Fault(**fault, seed=0 if seed is None else seed + node_id)))
                 for node_id, r in sorted(self.relays.items())]
        self._installed += [f for _, f in added]
        return added

    def _delay(self, detail: dict[str, Any]) -> Callable[[float], None]:
        delay = round(self.rng.uniform(0.3, 1.5), 2)
        detail["delay_s"] = delay
        self._each_relay(self.rng.randrange(1 << 30), action=Action.DELAY, direction=Direction.RESPONSE,
                         times=None, probability=0.2, delay_s=delay)
        return self._sleep

    def _reset(self, detail: dict[str, Any]) -> Callable[[float], None]:
        self._each_relay(self.rng.randrange(1 << 30), action=Action.RESET, times=None, probability=0.02)
        return self._sleep

    def _bandwidth(self, detail: dict[str, Any]) -> Callable[[float], None]:
        detail["bytes_per_s"] = 32 * 1024
        for direction in Direction:
            self._each_relay(action=Action.BANDWIDTH, direction=direction, times=None, bytes_per_s=32 * 1024)
        return self._sleep

    def _hold_endtxn(self, detail: dict[str, Any]) -> Callable[[float], None]:
        detail["hold_s"] = self.cfg.hold_s

        def tagged(tag: bytes) -> Callable[[bytes], bool]:
            return lambda frame: tag in frame  # this mode's transactional ids only: one held EndTxn per mode

        def arm() -> list[tuple[FaultRelay, Fault]]:
            held: list[tuple[FaultRelay, Fault]] = []
            for mode in self.cfg.hold_modes if self.cfg.hold_modes is not None else self.cfg.modes:
                held += self._each_relay(action=Action.HOLD, api_key=END_TXN, match=tagged(f"jl-{mode}-".encode()))
            return held

        def keep(until: float) -> None:
            while time.monotonic() < until and not self._stop.is_set():
                held = arm()
                self._sleep(min(until, time.monotonic() + self.cfg.hold_s))
                for relay, fault in held:
                    relay.release(fault)   # the late EndTxns go on, into whatever transaction is open now
                self._sleep(min(until, time.monotonic() + 0.5))

        return keep

    def _broker_pause(self, detail: dict[str, Any]) -> Callable[[float], None]:
        node = self.rng.choice(sorted(self.relays))
        detail["node"] = node
        self.cluster.pause_node(node)
        self._paused.add(node)
        return self._sleep

    def _broker_kill(self, detail: dict[str, Any]) -> Callable[[float], None]:
        node = self.rng.choice(sorted(self.relays))
        detail["node"] = node
        self.cluster.kill_node(node)
        self._killed.add(node)
        return self._sleep

    def _proxy_kill(self, detail: dict[str, Any]) -> Callable[[float], None]:
        if self.gateway is None:
            detail["skipped"] = "no proxy in this run"
            return self._sleep
        self.gateway.kill()
        detail["kills"] = 1

        def keep(until: float) -> None:
            self._sleep(min(until, time.monotonic() + self.cfg.proxy_down_s))
            assert self.gateway is not None
            self.gateway.start()
            self._sleep(until)

        return keep

    # -- healing -------------------------------------------------------------------------------------

    def _clear_faults(self) -> None:
        for r in self.relays.values():
            r.clear()

    def _heal_processes(self) -> None:
        signalled = bool(self._paused or self._killed)
        for node in sorted(self._paused):
            self.cluster.resume_node(node)
        self._paused.clear()
        dead = [n.id for n in self.cluster.nodes if not kafka._alive(n.pid)]  # killed here, or died on its own
        self._killed.clear()
        if dead:
            for node in dead:
                self.cluster.start_node(node)
            self.cluster.wait_ready()
        if signalled:
            self._wait_in_sync()

    def _wait_in_sync(self, timeout_s: float = 60.0) -> None:
        """Until every replica of the workload's topics and the transaction log is back in sync (bounded): the
        next window's fault is then the only one in force, not the last one's leftovers. Recorded if not."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with raw.RawClient.connect(self.cluster.live_bootstrap().split(",")[0]) as c:
                    md = c.metadata(None)
                behind = [f"{t.name}-{p.partition_index}" for t in md.topics for p in t.partitions
                          if (str(t.name).startswith("jl-") or t.name == "__transaction_state")
                          and len(p.isr_nodes) < len(p.replica_nodes)]
            except (OSError, raw.RawProtocolError) as e:
                behind = [repr(e)]
            if not behind:
                return
            if time.monotonic() > deadline:
                self.out_of_sync.append(f"after {timeout_s:.0f} s: {behind[:5]}")
                return
            time.sleep(0.5)
        if self.gateway is not None and not self.gateway.alive():
            self.gateway.start()

    def heal(self) -> None:
        with contextlib.suppress(Exception):
            self._clear_faults()
        try:
            self._heal_processes()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"heal: {e!r}")

"""Every dashboard query and every alert expression returns data on a real Prometheus scraping real proxies.

    Prometheus (Debian's, scrape every 1 s) ──▶ proxy A: gateway in front of Kafka 3.5.2 (3 nodes)
                                            ──▶ proxy B: sidecar whose broker becomes unreachable (NotReady)
                                            ──▶ proxy C: sidecar whose broker never answered (NotReady)
                                            ──▶ a port nothing listens on (TxnguardDown)
    through A:  confluent-kafka transactions (commit, commit, abort); a confluent-kafka producer connected
                throughout (the live client inventory)
                S1 a partition never added ─▶ INVALID_TXN_STATE        (not_in_transaction)
                S2 a late write after abort ─▶ INVALID_TXN_STATE       (late_write)
                a frame claiming 2 GiB ─▶ closed                        (frame_too_large)
                S4 coordinator frozen (SIGSTOP) 6 s, requests allowing 4 s ─▶ held 3.2 s, NOT_ENOUGH_REPLICAS,
                   retries, then commits
                a hanging transaction (backdated) ─▶ the proxy's scan (every 1 s) finds it; aborted at the end
    then: each panel query (variables: cluster=it, instance=All, $__rate_interval=15s) and each alert
          expression through /api/v1/query_range over the scenario: an error or an empty answer fails;
          and the states each alert went through (Prometheus' own ALERTS series over the scenario): those
          without `for:` fire at once, never pending; those with one were pending, for the right instances.
          Whether a `for: 2m` alert has also begun firing by the end depends on how long the scenario took,
          so that is not asserted here; promtool's unit tests (grafana/alerts.test.yaml) time it exactly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_coordinator_unavailable import VERIFY_WITH_COORDINATOR, _listeners, s4_sequence
from test_hanging import make_open_transaction, txnguard

from txnguard.testing import clients
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyThread
from txnguard.testing.scenarios import TxnActor, error_name, wait_stable

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RATE_INTERVAL = "15s"  # what Grafana's $__rate_interval is at a 1 s scrape interval, with margin
# Panels this scenario cannot feed, and why (reported, not asserted).
NOT_PRODUCED = {
    "Backpressure: reading paused": "needs a peer that stops reading (write buffer above 4 MiB)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dashboards() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("grafana_dashboards", ROOT / "grafana" / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: build() for name, build in module.DASHBOARDS.items()}


class Relay:
    """A TCP relay to one broker that can be cut: the broker becomes unreachable for the proxy behind it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
                self.sockets += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def cut(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        self.server.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@dataclass
class Prometheus:
    url: str

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1s"})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{params}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{expr}: {e.read().decode()}") from e
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as r:
            return json.load(r)["data"]


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: list[str]) -> Iterator[Prometheus]:
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "grafana" / "alerts.yaml")],
        "scrape_configs": [{"job_name": "txnguard", "static_configs": [
            {"targets": targets, "labels": {"cluster": "it"}}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _workload(cluster: Any, proxy: ProxyThread, unique_name: Any) -> None:
    bootstrap = proxy.bootstrap
    topic = fresh_topic(cluster, unique_name("dash"), partitions=2, replication_factor=3)
    rdkafka = clients.ConfluentKafkaClient()
    for commit in (True, True, False):
        rdkafka.run_transaction(bootstrap, topic, unique_name("txn"), [b"x"] * 20, commit=commit)
    # S1: a partition never added.
    s1 = TxnActor(bootstrap, unique_name("txn"))
    s1.init()
    assert error_name(s1.produce(topic, 0, [b"never-added"]).error_code) == "INVALID_TXN_STATE"
    # S2: a late write after the abort.
    s2 = TxnActor(bootstrap, unique_name("txn"))
    s2.init()
    assert s2.add_partitions(topic, 1) == {1: 0}
    assert s2.produce(topic, 1, [b"in-txn"]).error_code == 0
    assert s2.end(commit=False) == 0
    wait_stable(cluster.bootstrap_servers, topic, 1)
    assert error_name(s2.produce(topic, 1, [b"late"], sequence=1).error_code) == "INVALID_TXN_STATE"
    # A frame claiming 2 GiB: refused, the connection closed.
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"\x7f\xff\xff\xff" + b"\x00" * 16)
        with contextlib.suppress(OSError):
            s.recv(1)


def test_every_panel_and_alert_returns_data_in_the_scenario(kafka_pool, start_proxy, unique_name, tmp_path):
    cluster = kafka_pool.get("3.5.2", 3)
    a = start_proxy(upstream=cluster.bootstrap_servers, mode="gateway", verification=VERIFY_WITH_COORDINATOR,
                    health={"hanging_scan_interval_s": 1.0})
    node = cluster.nodes[0]
    relay = Relay((node.host, node.port))
    b = start_proxy(upstream=f"127.0.0.1:{relay.port}", listen=f"127.0.0.1:{_free_port()}", mode="sidecar")
    # C's broker address: a port nothing listens on. Its /readyz never passed: TxnguardNotReady is for it too.
    c = start_proxy(upstream=f"127.0.0.1:{_free_port()}", listen=f"127.0.0.1:{_free_port()}", mode="sidecar")
    dead = f"127.0.0.1:{_free_port()}"
    admin_of = {name: p.admin_url.split("//")[1] for name, p in (("a", a), ("b", b), ("c", c))}
    targets = [*admin_of.values(), dead]
    with prometheus(tmp_path, targets) as prom:
        started = time.time()
        assert b.proxy is not None
        b.wait_for(lambda: b.proxy.last_metadata_ok is not None, 30, "proxy B reached its broker")
        relay.cut()
        cut_at = time.monotonic()

        _workload(cluster, a, unique_name)
        # A client that stays connected (as most do) across the rest of the scenario's scrapes.
        from confluent_kafka import Producer

        resident = Producer({"bootstrap.servers": a.bootstrap})
        resident.produce(fresh_topic(cluster, unique_name("resident")), b"x")
        assert resident.flush(10) == 0
        hanging_topic = fresh_topic(cluster, unique_name("hang"))
        make_open_transaction(cluster.bootstrap_servers, hanging_topic, unique_name("hung"))
        # Frozen 6 s while the client retries (under the 9 s broker session timeout: no failover). Its
        # requests allow 4 s, so each is held 3.2 s and then refused: the failures span several scrapes,
        # as an outage worth an alert does (with 30 s requests the holds would outlast the freeze).
        run = s4_sequence(cluster, _listeners(a, cluster).__getitem__, stay_frozen_s=6, request_timeout_ms=4000)
        assert run.first_produce[0] == "NOT_ENOUGH_REPLICAS" and run.end_txn == "NONE", run
        # TxnguardNotReady needs the sidecar's Metadata older than 30 s; a few scrapes more for every series.
        time.sleep(max(0.0, 34 - (time.monotonic() - cut_at)))
        time.sleep(4)
        # Then until Prometheus has evaluated every alert this scenario raises (a wait on state, bounded).
        raised = {("TxnguardNotReady", admin_of["b"]), ("TxnguardNotReady", admin_of["c"]), ("TxnguardDown", dead),
                  ("TxnguardWritesOutsideTransaction", admin_of["a"]), ("TxnguardHangingTransaction", admin_of["a"])}
        deadline = time.monotonic() + 60
        while not raised <= {(name, instance) for name, seen in _alert_states(prom, started, time.time()).items()
                             for _, instance in seen}:
            assert time.monotonic() < deadline, _alert_states(prom, started, time.time())
            time.sleep(0.5)
        end = time.time()

        rows, failures = [], []
        variables = {"$cluster": "it", "$instance": ".*", "$__rate_interval": RATE_INTERVAL}
        for board_name, board in _dashboards().items():
            for panel in board["panels"]:
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    for var, value in variables.items():
                        expr = expr.replace(var, value)
                    rows.append((f"{board_name}: {panel['title']} [{target['legendFormat']}]",
                                 *_summary(prom.query_range(expr, started, end))))
                    if rows[-1][1] == 0 and panel["title"] not in NOT_PRODUCED:
                        failures.append(rows[-1][0])
        rules = yaml.safe_load((ROOT / "grafana" / "alerts.yaml").read_text())
        for rule in (r for g in rules["groups"] for r in g["rules"]):
            rows.append((f"alert {rule['alert']}", *_summary(prom.query_range(rule["expr"], started, end))))
            if rows[-1][1] == 0:
                failures.append(rows[-1][0])
        states = {r["name"]: r["state"] for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}
        history = _alert_states(prom, started, end)
        del resident

    print(f"\n{'query':<100} {'series':>6} {'max':>10}")
    for name, series, peak in rows:
        print(f"{name:<100} {series:>6} {peak:>10.4g}")
    print(f"alert states at the end: {states}; during the scenario: {history}; not produced here: {NOT_PRODUCED}")
    done = txnguard("hanging", "--bootstrap", cluster.bootstrap_servers, "--topic", hanging_topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr  # the shared cluster is left without a hanging transaction
    assert not failures, f"no data for: {failures}"
    # And the numbers mean what the scenario did: S1 and S2 each prevented one hanging transaction, and the
    # alerts without a `for:` fired at once (never pending); the others waited out their `for:` (pending).
    peaks = {name: peak for name, _, peak in rows}
    assert peaks["transactions: Hanging transactions prevented (1 h) [{{reason}}]"] == 1
    assert {state for state, _ in history["TxnguardWritesOutsideTransaction"]} == {"firing"}, history
    assert {state for state, _ in history["TxnguardHangingTransaction"]} == {"firing"}, history
    assert peaks["alert TxnguardHangingTransaction"] == 1
    assert ("pending", dead) in history["TxnguardDown"], history
    assert {instance for _, instance in history["TxnguardDown"]} == {dead}, history
    # Not ready: B (its broker cut after it had reached it) and C (never reached one); A, serving, is not.
    assert {("pending", admin_of["b"]), ("pending", admin_of["c"])} <= history["TxnguardNotReady"], history
    assert {instance for _, instance in history["TxnguardNotReady"]} == {admin_of["b"], admin_of["c"]}, history


def _alert_states(prom: Prometheus, start: float, end: float) -> dict[str, set[tuple[str, str]]]:
    """alertname -> every (state, instance) it was in at some rule evaluation in [start, end]."""
    out: dict[str, set[tuple[str, str]]] = {}
    for series in prom.query_range("ALERTS", start, end):
        m = series["metric"]
        out.setdefault(m["alertname"], set()).add((m["alertstate"], m.get("instance", "")))
    return out


def _summary(result: list[dict[str, Any]]) -> tuple[int, float]:
    """(series with at least one number, the largest number) of a range query's answer."""
    values = [float(v) for s in result for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
    series = sum(1 for s in result if any(v not in ("NaN", "+Inf", "-Inf") for _, v in s["values"]))
    return series, max(values, default=float("nan"))

"""`txnguard run` as an operator runs it: check-config, SIGHUP policy reload, SIGTERM drain."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess, ProxyThread
from txnguard.testing.raw import RawClient, RawProtocolError
from txnguard.testing.scenarios import TxnActor, error_name

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(kafka_pool):
    return kafka_pool.get("3.5.2", 1)


def test_check_config_accepts_a_good_file_and_names_what_is_wrong_in_a_bad_one(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:19092\n")
    ok = subprocess.run([sys.executable, "-m", "txnguard.cli", "check-config", str(good)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "ok (gateway mode" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream: 127.0.0.1:9092\nlimits: {idle_timeout_s: soon}\n")
    err = subprocess.run([sys.executable, "-m", "txnguard.cli", "check-config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert err.returncode == 2
    assert "limits.idle_timeout_s: 'soon' is not a positive number" in err.stderr


def test_sighup_reloads_the_policy_without_dropping_connections(cluster, tmp_path, unique_name):
    port = _free_port()
    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {cluster.bootstrap_servers}\nlisten: 127.0.0.1:{port}\npolicy: {{mode: enforce}}\n")
    proxy = ProxyProcess(["--config", str(config)], tmp_path / "proxy.log").start(wait_port=("127.0.0.1", port))
    try:
        bootstrap = f"127.0.0.1:{port}"
        topic = fresh_topic(cluster, unique_name("hup"))
        with RawClient("127.0.0.1", port) as held_open:
            held_open.api_versions()
            enforced = TxnActor(bootstrap, unique_name("txn"))
            enforced.init()
            assert error_name(enforced.produce(topic, 0, [b"x"]).error_code) == "INVALID_TXN_STATE"

            config.write_text(config.read_text().replace("mode: enforce", "mode: monitor"))
            assert proxy.proc is not None
            proxy.proc.send_signal(signal.SIGHUP)
            for _ in range(50):
                if "policy_reloaded" in proxy.log():
                    break
                time.sleep(0.1)
            assert '"mode": "monitor"' in proxy.log()

            monitored = TxnActor(bootstrap, unique_name("txn"))
            monitored.init()
            assert monitored.produce(topic, 0, [b"x"]).error_code == 0  # monitor: decided, logged, forwarded
            assert held_open.metadata().brokers  # the connection opened before the reload still works
        assert '"decision": "forwarded_unenforced"' in proxy.log()
    finally:
        assert proxy.terminate() == 0


def test_sigterm_drains_and_exits(cluster, tmp_path):
    port = _free_port()
    proxy = ProxyProcess(["--upstream", cluster.bootstrap_servers, "--listen", f"127.0.0.1:{port}"],
                         tmp_path / "proxy.log").start(wait_port=("127.0.0.1", port))
    with RawClient("127.0.0.1", port) as c:
        c.api_versions()
        # SIGTERM ─▶ draining ─▶ the idle client closed at once (nothing in flight) ─▶ exit 0, never waiting for
        # the drain's deadline (30 s, as long as this wait: a proxy that waited for it would be killed here).
        assert proxy.terminate(timeout=30) == 0
    log = proxy.log()
    assert '"event": "draining"' in log
    assert '"reason": "draining"' in log  # the idle client was closed by the drain, not killed
    assert '"reason": "drain_deadline"' not in log  # ...and not when the deadline ran out
    assert log.index('"event": "draining"') < log.index('"reason": "draining"')
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_sighup_without_a_config_file_is_logged_and_survived(cluster, tmp_path):
    # `make run` starts the proxy without --config; SIGHUP's default action used to end it.
    port = _free_port()
    proxy = ProxyProcess(["--upstream", cluster.bootstrap_servers, "--listen", f"127.0.0.1:{port}"],
                         tmp_path / "proxy.log").start(wait_port=("127.0.0.1", port))
    try:
        with RawClient("127.0.0.1", port) as c:
            c.api_versions()
            assert proxy.proc is not None
            proxy.proc.send_signal(signal.SIGHUP)
            for _ in range(50):
                if "policy_reload_ignored" in proxy.log():
                    break
                time.sleep(0.1)
            assert '"reason": "no_config_file"' in proxy.log()
            assert proxy.proc.poll() is None
            assert c.metadata().brokers  # the connection open at the signal still works
    finally:
        assert proxy.terminate() == 0


class _Lines:
    """The proxy's JSON log lines as written (a log stream for ProxyThread)."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def events(self, name: str) -> list[dict[str, object]]:
        return [e for e in (json.loads(x) for x in self.text.splitlines() if x.startswith("{"))
                if e.get("event") == name]


def test_a_broker_port_already_taken_refuses_clients_with_a_reason_not_a_stray_address(cluster):
    node = cluster.nodes[0].id
    with socket.socket() as taken:  # what an operator's admin server (or anything else) holds on that port
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = int(taken.getsockname()[1])
        log = _Lines()
        proxy = ProxyThread.from_settings(upstream=cluster.bootstrap_servers, mode="gateway", admin="127.0.0.1:0",
                                          broker_ports={node: port}, log_stream=log).start()
        try:
            host, bootstrap_port = proxy.bootstrap.split(":")
            with pytest.raises(RawProtocolError, match="closed the connection"), \
                    RawClient(host, int(bootstrap_port)) as client:
                client.metadata()  # its answer would name the taken port: the proxy closes instead
            reason = {"reason": "broker_listener_unavailable"}
            proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", reason) >= 1,
                           what="the close counted with its reason")
            [line] = log.events("broker_listener_unavailable")  # once, however many clients it refuses
            assert line["node_id"] == node and line["address"] == f"127.0.0.1:{port}"
            assert any(e.get("reason") == "broker_listener_unavailable" for e in log.events("connection_closed"))
        finally:
            proxy.stop()

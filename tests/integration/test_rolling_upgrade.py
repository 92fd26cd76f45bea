"""Rolling a proxy (a sidecar's or a gateway replica's upgrade): SIGTERM drains, the replacement takes over.

    client ──Fetch(max_wait 3 s)──▶ proxy ──▶ broker (holds it: a request in flight)
    SIGTERM ─▶ proxy: listeners closed at once (a new connection is refused), reading stops,
               the Fetch's answer is delivered, then the connection closes and the process exits
               (bounded by limits.drain_timeout_s)

    confluent-kafka ──transactions──▶ proxy 1 ── SIGTERM ──▶ proxy 1 exits ──▶ proxy 2 on the same ports
               the client's retries reach proxy 2: transactions begun after proxy 1 exited commit (only
               proxy 2 can carry them); every committed transaction is read exactly once

Figures are printed (pytest -s); the assertions are the behaviour, with generous bounds for a loaded machine.
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from txnguard.testing import clients
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import ProxyProcess
from txnguard.testing.raw import RawClient, RawProtocolError

pytestmark = pytest.mark.integration

DRAIN_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(kafka_pool):
    return kafka_pool.get("3.5.2", 1)


def _proxy(cluster: Any, port: int, log: Path) -> ProxyProcess:
    return ProxyProcess(["--upstream", cluster.bootstrap_servers, "--listen", f"127.0.0.1:{port}"], log,
                        env={"TXNGUARD_LIMITS__DRAIN_TIMEOUT_S": str(DRAIN_S)}).start(wait_port=("127.0.0.1", port))


def test_sigterm_answers_the_request_in_flight_refuses_new_connections_and_exits(cluster, tmp_path, unique_name):
    port = _free_port()
    topic = fresh_topic(cluster, unique_name("drain"))
    proxy = _proxy(cluster, port, tmp_path / "proxy.log")
    assert proxy.proc is not None
    with RawClient("127.0.0.1", port, timeout=30) as c:
        c.api_versions()
        # An empty partition: the broker holds the Fetch for max_wait before answering.
        fetch = FetchRequest(replica_id=BrokerId(-1), max_wait=datetime.timedelta(milliseconds=3000),
                             min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0),
                             topics=(FetchTopic(topic=TopicName(topic), partitions=(FetchPartition(
                                 partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),))
        c.send_raw(c.encode(fetch, 4242))
        time.sleep(0.5)  # the Fetch is at the broker
        signalled = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        refused_after = None
        while refused_after is None and time.monotonic() - signalled < 5:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                time.sleep(0.02)
            except ConnectionRefusedError:
                refused_after = time.monotonic() - signalled
        frame = c.read_frame()  # the in-flight Fetch's answer, after the signal
        answered_after = time.monotonic() - signalled
        assert int.from_bytes(frame[:4], "big") == 4242
        with pytest.raises((RawProtocolError, OSError)):  # then the proxy closes the drained connection
            c.read_frame()
    code = proxy.proc.wait(DRAIN_S + 10)
    exited_after = time.monotonic() - signalled
    print(f"\nSIGTERM drain: new connections refused after {refused_after:.3f} s; the Fetch in flight answered "
          f"after {answered_after:.2f} s (the broker's max_wait: 3 s from its send); process exited after "
          f"{exited_after:.2f} s with {code} (drain bound {DRAIN_S:.0f} s)")
    # New connections were refused while the Fetch was still in flight, and the process exited because every
    # connection had finished, not because the drain bound ran out (that closes them with "drain_deadline").
    assert refused_after is not None and refused_after < answered_after
    assert code == 0 and '"event": "draining"' in proxy.log() and "drain_deadline" not in proxy.log()


def test_a_transactional_client_retries_through_a_rolling_restart(cluster, tmp_path, unique_name):
    from confluent_kafka import KafkaException, Producer

    port = _free_port()
    topic = fresh_topic(cluster, unique_name("roll"))
    first = _proxy(cluster, port, tmp_path / "proxy-1.log")
    bootstrap = f"127.0.0.1:{port}"
    roll: dict[str, float] = {}

    def rolling_restart() -> None:
        time.sleep(2)
        assert first.proc is not None
        roll["signalled"] = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)
        roll["exit_code"] = first.proc.wait(DRAIN_S + 10)
        roll["exited"] = time.monotonic()
        second = _proxy(cluster, port, tmp_path / "proxy-2.log")
        roll["listening"] = time.monotonic()
        proxies.append(second)

    proxies: list[ProxyProcess] = []
    restarter = threading.Thread(target=rolling_restart)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn"),
                         "reconnect.backoff.max.ms": 500, "linger.ms": 5})
    producer.init_transactions(60)
    committed: list[int] = []
    after_exit: list[int] = []  # transactions begun once proxy 1 had exited: carried by proxy 2 or by nobody
    errors: list[str] = []
    restarter.start()
    try:
        n = 0
        deadline = time.monotonic() + 120
        # Until three transactions begun after proxy 1 exited have committed (the deadline only bounds a failure).
        while time.monotonic() < deadline and len([t for t in committed if t in after_exit]) < 3:
            if "exited" in roll:
                after_exit.append(n)
            producer.begin_transaction()
            for j in range(5):
                producer.produce(topic, value=f"{n}-{j}".encode(), partition=0)
            try:
                producer.commit_transaction(60)
                committed.append(n)
            except KafkaException as e:
                err = e.args[0]
                errors.append(f"{err.name()} (retriable={err.retriable()}, abortable={err.txn_requires_abort()})")
                assert not err.fatal(), errors
                if err.txn_requires_abort():
                    producer.abort_transaction(60)
                else:  # retriable: the commit is retried as the client's docs say
                    producer.commit_transaction(60)
                    committed.append(n)
            n += 1
        restarter.join(60)
        # Retried through the restart: the client committed transactions that it began after proxy 1 had
        # exited (its connections gone), so through proxy 2 only; and some it began before proxy 1 exited.
        before = [t for t in committed if t not in after_exit]
        crossed = [t for t in committed if t in after_exit]
        assert "listening" in roll and before and len(crossed) >= 3, (roll, committed, after_exit, errors)
        clients.stable_end_offsets(cluster.bootstrap_servers, topic)
        read = clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic)
        assert read == [f"{t}-{j}".encode() for t in committed for j in range(5)]  # each exactly once, in order
        gap = roll["listening"] - roll["signalled"]
        print(f"\nrolling restart: proxy 1 exited {roll['exited'] - roll['signalled']:.2f} s after SIGTERM "
              f"(code {roll['exit_code']:.0f}); proxy 2 listening {gap:.2f} s after SIGTERM; {len(committed)} of {n} "
              f"transactions committed ({len(before)} begun before proxy 1 exited, {len(crossed)} after), read "
              f"back exactly once; client errors: {errors or 'none'}")
        assert roll["exit_code"] == 0
    finally:
        with contextlib.suppress(Exception):
            producer.flush(5)
        for p in proxies:
            p.terminate()

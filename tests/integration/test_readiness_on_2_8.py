"""/readyz knows what the broker lacks before any client comes: a sidecar on Kafka 2.8.2 (ZooKeeper mode).

A sidecar sees a producer's writes but not its AddPartitionsToTxn; the first write of every transaction to a
partition has no leader evidence, and 2.8 has no DescribeTransactions to ask the coordinator. Enforcing, it
would refuse every transaction. So it reads its broker's ApiVersions at start and says so then:

    sidecar ─ApiVersions─▶ broker 2.8.2          (at start, no client yet)
    sidecar: lacks DescribeTransactions ─▶ log `proxy_not_ready`, txnguard_broker_api_missing 1, txnguard_ready 0
    orchestrator ─GET /readyz─▶ sidecar: 503 "... broker <address> lacks DescribeTransactions ..."

In `monitor` mode nothing is refused: 200, and the body says the same. A broker that cannot be reached at
start is retried (not a crash, not a start that never ends) and the sidecar is not ready until it is read.

All of that is without the coordinator's log (`verification.transaction_log_view: false`). Following
`__transaction_state`, a sidecar on 2.8 has the evidence DescribeTransactions would give, and is ready once
it has read the log (tests/integration/test_kafka_28.py carries transactions through such sidecars).
"""

from __future__ import annotations

import io
import json
import socket
import urllib.error
import urllib.request

import pytest

from txnguard.testing.faults import FaultRelay
from txnguard.testing.fixtures import ClusterPool
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread

pytestmark = pytest.mark.integration

VERSION = "2.8.2"
# What /readyz says while its answer is not settled yet: no Metadata answer, or the broker's ApiVersions unread.
UNSETTLED = ("no successful Metadata request", "not read yet", "transaction log: catching up")


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get(VERSION, 1, zookeeper=True)  # the one test_kafka_28.py uses: shared in a session


def readyz(proxy: ProxyThread) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def settled_readyz(proxy: ProxyThread, timeout: float = 60.0) -> tuple[int, str]:
    """/readyz once the proxy has heard from its broker (whatever it then says)."""
    proxy.wait_for(lambda: not any(u in readyz(proxy)[1] for u in UNSETTLED), timeout, "/readyz to settle")
    return readyz(proxy)


def sidecar(cluster: Cluster, start_proxy, stream: io.StringIO, mode: str, upstream: str | None = None, *,
            log: bool = False) -> ProxyThread:
    node = cluster.node(1)
    return start_proxy(mode="sidecar", upstream=upstream or f"{node.host}:{node.port}", listen="127.0.0.1:0",
                       policy={"mode": mode}, log_stream=stream, verification={"transaction_log": log})


def lines(stream: io.StringIO, event: str) -> list[dict]:
    return [d for d in (json.loads(t) for t in stream.getvalue().splitlines() if t.startswith("{"))
            if d.get("event") == event]


def no_client_came(proxy: ProxyThread) -> bool:
    return proxy.metric("txnguard_connections_total", {"listener": "bootstrap"}) == 0 and \
        proxy.metric("txnguard_verification_failures_total", {"reason": "not_in_transaction"}) == 0


def test_an_enforcing_sidecar_on_2_8_is_not_ready_before_any_client_connects(cluster: Cluster, start_proxy) -> None:
    stream = io.StringIO()
    proxy = sidecar(cluster, start_proxy, stream, "enforce")
    broker = f"{cluster.node(1).host}:{cluster.node(1).port}"

    status, body = settled_readyz(proxy)

    assert status == 503, body
    assert "DescribeTransactions" in body and broker in body, body
    assert proxy.metric("txnguard_ready") == 0
    assert proxy.metric("txnguard_broker_api_missing", {"broker": broker, "api": "DescribeTransactions"}) == 1
    (said,) = [d for d in lines(stream, "proxy_not_ready") if "DescribeTransactions" in d["reason"]]
    assert said["broker"] == broker, said
    assert no_client_came(proxy)


def test_a_monitoring_sidecar_on_2_8_stays_ready_and_says_what_it_cannot_verify(cluster: Cluster,
                                                                                start_proxy) -> None:
    stream = io.StringIO()
    proxy = sidecar(cluster, start_proxy, stream, "monitor")
    broker = f"{cluster.node(1).host}:{cluster.node(1).port}"

    status, body = settled_readyz(proxy)

    assert status == 200, body
    assert body.startswith("ok; ") and "DescribeTransactions" in body and broker in body, body
    assert proxy.metric("txnguard_ready") == 1
    assert proxy.metric("txnguard_broker_api_missing", {"broker": broker, "api": "DescribeTransactions"}) == 1
    assert broker in [d["broker"] for d in lines(stream, "broker_lacks_apis")]
    assert lines(stream, "proxy_not_ready") == []
    assert no_client_came(proxy)


def test_a_broker_unreachable_at_start_is_retried_and_the_sidecar_is_not_ready_until_it_is_read(
        cluster: Cluster, start_proxy) -> None:
    """The sidecar starts before its broker listens (here: a relay to the 2.8 broker, opened later on the port
    the sidecar was given): it starts, says why it is not ready, and reads the broker once it answers."""
    with socket.socket() as s:  # a port nothing listens on, for the relay to take later
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stream = io.StringIO()
    proxy = sidecar(cluster, start_proxy, stream, "enforce", upstream=f"127.0.0.1:{port}")
    broker = f"127.0.0.1:{port}"

    proxy.wait_for(lambda: lines(stream, "metadata_refresh_failed"), 30, "a failed first contact logged")
    status, body = readyz(proxy)
    assert status == 503 and "ApiVersions" in body and broker in body, body
    assert lines(stream, "broker_api_versions_unread")[0]["broker"] == broker

    node = cluster.node(1)
    with FaultRelay((node.host, node.port), port=port):
        status, body = settled_readyz(proxy)
        assert status == 503 and "DescribeTransactions" in body and broker in body, body
        assert proxy.metric("txnguard_broker_api_missing", {"broker": broker, "api": "DescribeTransactions"}) == 1
    assert no_client_came(proxy)


def test_an_enforcing_sidecar_on_2_8_that_follows_the_coordinators_log_is_ready_once_it_has_read_it(
        cluster: Cluster, start_proxy) -> None:
    """    sidecar ─ApiVersions─▶ broker 2.8.2: lacks DescribeTransactions (the metric says so, as without the log)
           sidecar ─Metadata, Fetch __transaction_state─▶ read to its end once ─▶ /readyz 200"""
    stream = io.StringIO()
    proxy = sidecar(cluster, start_proxy, stream, "enforce", log=True)
    broker = f"{cluster.node(1).host}:{cluster.node(1).port}"

    status, body = settled_readyz(proxy)

    assert status == 200, body
    assert proxy.metric("txnguard_broker_api_missing", {"broker": broker, "api": "DescribeTransactions"}) == 1
    assert proxy.metric("txnguard_transaction_log_lag_seconds") >= 0  # caught up once (-1 before)
    assert lines(stream, "proxy_not_ready") == [] or all(
        "transaction log" in d["reason"] or "not read yet" in d["reason"] or "Metadata" in d["reason"]
        for d in lines(stream, "proxy_not_ready"))
    assert no_client_came(proxy)

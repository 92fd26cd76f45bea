"""IBM/sarama (Go) as a real client: paced transactions directly against Kafka 3.5.2 and through the gateway.

tools/sarama-paced (built by `make sarama`) runs the transactions with Sarama's default retry settings;
`clients.paced_transactions("sarama", ...)` drives it and runs `on_ack` at each acknowledgement. Each
test checks that every committed record is read back once at read_committed, in order, and nothing else.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, broker_addresses, gateway_for

pytestmark = pytest.mark.integration

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]
T, N = 3, 10


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2")


def _log_end(cluster: Cluster, topic: str) -> int:
    _, host, port = raw.leader_of(cluster.live_bootstrap(), topic, 0)
    with raw.RawClient(host, port) as c:
        return c.list_offsets(topic, 0, read_committed=False)


class AckProbe:
    """on_ack: after record i of transaction t the log ends at exactly t * (N + 1) + i + 1 (each earlier
    transaction left N records and its commit marker), and it still does after a pause: one Produce
    per record, acknowledged before on_ack runs, and nothing sent until on_ack returns."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        self.seen: list[tuple[int, int]] = []
        self.log_ends: list[tuple[int, int]] = []

    def __call__(self, t: int, i: int) -> None:
        self.seen.append((t, i))
        before = _log_end(self.cluster, self.topic)
        if i == N // 2:
            time.sleep(0.3)
        self.log_ends.append((before, _log_end(self.cluster, self.topic)))


def _check(cluster: Cluster, topic: str, txn_id: str, result: clients.PacedResult, probe: AckProbe) -> None:
    expected = [v for t in range(T) for v in clients.paced_values(txn_id, t, N)]
    assert (result.aborted, result.errors) == (0, [])
    assert result.committed == expected
    assert probe.seen == [(t, i) for t in range(T) for i in range(N)]
    assert probe.log_ends == [(t * (N + 1) + i + 1,) * 2 for t in range(T) for i in range(N)]
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == expected


def test_sarama_paced_transactions_directly_against_kafka_3_5_2(cluster: Cluster, unique_name: NameFactory) -> None:
    topic = fresh_topic(cluster, unique_name("sarama"))
    txn_id = unique_name("tid")
    probe = AckProbe(cluster, topic)
    result = clients.paced_transactions("sarama", cluster.bootstrap_servers, topic, txn_id, transactions=T,
                                        per_transaction=N, on_ack=probe, timeout_s=60)
    _check(cluster, topic, txn_id, result, probe)


def test_sarama_paced_transactions_through_the_gateway_classified_as_sarama(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, tmp_path,
) -> None:
    topic = fresh_topic(cluster, unique_name("sarama"))
    txn_id = unique_name("tid")
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit))
    probe = AckProbe(cluster, topic)
    result = clients.paced_transactions("sarama", proxy.bootstrap, topic, txn_id, transactions=T,
                                        per_transaction=N, on_ack=probe, timeout_s=60)
    _check(cluster, topic, txn_id, result, probe)
    assert proxy.wire is not None and proxy.wire.leaks(broker_addresses(cluster)) == []
    proxy.stop()  # closes what is still open: a connection record each

    records = [json.loads(line) for line in audit.read_text().splitlines()]
    connections = [r for r in records if r["kind"] == "connection"]
    # KIP-511: Sarama names itself "sarama" with its Go module version, client id "sarama" by default.
    assert {(r["client_software_name"], r["client_software_version"], r["client_id"], r["client_family"])
            for r in connections} == {("sarama", "v1.61.1", "sarama", "sarama")}
    # Its Produce v9 (Config.Version 2.8) and TxnOffsetCommit none; every write verified and forwarded.
    assert {v for r in connections for v in r["produce_versions"]} == {9}
    decisions = [r for r in records if r["kind"] == "decision"]
    assert len(decisions) == T * N
    assert {(r["outcome"], r["decision"], r["transactional_id"]) for r in decisions} == {
        ("pass", "forwarded", txn_id)}


def test_sarama_settings_reach_sarama_config_and_a_fatal_error_raises(
    cluster: Cluster, unique_name: NameFactory,
) -> None:
    """Settings go by their sarama.Config names: Producer.Retry.Max 0 is refused by Sarama's own validation
    (an idempotent producer needs a retry), a fatal error, so ClientError; an unknown name never runs."""
    topic = fresh_topic(cluster, unique_name("sarama"))
    txn_id = unique_name("tid")
    result = clients.sarama_paced_transactions(
        cluster.bootstrap_servers, topic, txn_id, transactions=1, per_transaction=3, timeout_s=60,
        settings={"Producer.Retry.Max": 10, "Producer.Retry.Backoff": 250, "Version": "3.5.0"})
    assert (result.committed, result.aborted) == (clients.paced_values(txn_id, 0, 3), 0)
    with pytest.raises(clients.ClientError, match=re.escape("Idempotent producer requires Producer.Retry.Max >= 1")):
        clients.sarama_paced_transactions(cluster.bootstrap_servers, topic, txn_id, transactions=1,
                                          per_transaction=1, timeout_s=60, settings={"Producer.Retry.Max": 0})
    with pytest.raises(ValueError, match=r"Producer\.Retry\.Max"):
        clients.sarama_paced_transactions(cluster.bootstrap_servers, topic, txn_id, transactions=1,
                                          per_transaction=1, settings={"retries": 1})


def test_sarama_aborts_and_redoes_a_transaction_the_proxy_rejects_a_late_write_of(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, tmp_path,
) -> None:
    """KIP-890's case through the gateway: after the 3rd ack of transaction 1, someone else ends that
    transaction (EndTxn abort with Sarama's producer id and epoch, as a coordinator timing it out would,
    minus the epoch bump). Sarama's next Produce is a late write: the proxy answers INVALID_TXN_STATE
    (the sarama family's cell), which Sarama makes abortable; the program aborts and redoes transaction 1
    with the same values. Nothing of the first attempt is visible at read_committed, nothing is lost."""
    topic = fresh_topic(cluster, unique_name("sarama"))
    txn_id = unique_name("tid")
    audit = tmp_path / "audit.jsonl"
    proxy = gateway_for(cluster, start_proxy, audit_path=str(audit))
    ended: list[int] = []

    def end_it_elsewhere(t: int, i: int) -> None:
        if (t, i) != (1, 2) or ended:
            return
        _, host, port = raw.coordinator_for(proxy.bootstrap, txn_id)
        with raw.RawClient(host, port) as c:
            state = c.describe_transactions(txn_id).transaction_states[0]
            assert state.transaction_state == "Ongoing"
            producer = raw.ProducerIdentity(int(state.producer_id), int(state.producer_epoch))
            ended.append(int(c.end_txn(txn_id, producer, committed=False).error_code))

    result = clients.paced_transactions("sarama", proxy.bootstrap, topic, txn_id, transactions=T,
                                        per_transaction=N, on_ack=end_it_elsewhere, timeout_s=60)
    proxy.stop()
    print(f"\nsarama: aborted {result.aborted} {result.errors}")
    assert ended == [0]
    assert result.aborted == 1 and "transaction 1: record 3:" in result.errors[0], result.errors
    expected = [v for t in range(T) for v in clients.paced_values(txn_id, t, N)]
    assert result.committed == expected
    clients.stable_end_offsets(cluster.bootstrap_servers, topic)
    assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == expected
    decisions = [json.loads(line) for line in audit.read_text().splitlines()]
    rejected = [(r["outcome"], r["error_name"], r["client_family"]) for r in decisions
                if r["kind"] == "decision" and r["decision"] == "rejected"]
    assert rejected == [("late_write", "INVALID_TXN_STATE", "sarama")]

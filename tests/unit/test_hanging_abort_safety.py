"""`txnguard hanging` never breaks a live transaction (issue 30, items 2, 3, 4 and 6), without brokers.

The real ClusterAdmin and scan run over fake connections: each broker of `FakeCluster` answers the requests the
scan and the abort send from its own replica's view, and refuses what it does not list in its ApiVersions as a
real connection does (`UnsupportedApi`, nothing sent). The integration tests (tests/integration/
test_hanging_live_transactions.py) show the same on real brokers.

    operator ─hanging --abort --yes─▶ leader: DescribeProducers ─▶ an open transaction, 2 h by its timestamp
                                      ListTransactions: not offered (Kafka 2.8)
                                      __transaction_state: the principal may not read it ─▶ unconfirmed
                                      DescribeConfigs: transaction.max.timeout.ms ─▶ the threshold
              ◀─ "left alone ... may be a live transaction": no WriteTxnMarkers

Where the coordinator's log can be read (issue 31 item 5), it confirms or clears each finding instead: the last
tests. `FakeCluster.transaction_log` is what reading it gave (the reading itself, on real brokers:
tests/integration/test_hanging_live_transactions.py).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from types import SimpleNamespace as NS
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard import cli
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.transaction_log import LogRecord, TxnLogValue
from txnguard.proxy import config, hanging_cli, hanging_io, hanging_monitor
from txnguard.proxy.config import HostPort
from txnguard.proxy.kafka_client import UnsupportedApi
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.testing.transaction_log_writer import key, value
from txnguard.verification.hanging import OwnTimeout, ProducerState, TransactionView
from txnguard.verification.transaction_log_view import TransactionLogView

MIN = 60_000
HOUR = 60 * MIN
TOPIC = "t"
WRITE_TXN_MARKERS, DESCRIBE_CONFIGS = ApiKey.WRITE_TXN_MARKERS, ApiKey.DESCRIBE_CONFIGS
# What the one-shot read of __transaction_state gives a principal without DESCRIBE on it.
DENIED = hanging_io.LogRead(
    {}, "the principal may not DESCRIBE or READ __transaction_state (TOPIC_AUTHORIZATION_FAILED)")


class FakeBroker:
    """One broker's connection: it answers from its own replica's view and refuses an API it does not list."""

    def __init__(self, cluster: FakeCluster, broker_id: int) -> None:
        self.cluster = cluster
        self.id = broker_id

    async def request(self, payload: Any, timeout: float = 10.0) -> Any:
        key, version = int(payload.__api_key__), int(payload.__version__)
        offered = self.cluster.offers.get(self.id, {}).get(key, (0, 99))
        if offered is None or not offered[0] <= version <= offered[1]:
            raise UnsupportedApi(key, version, offered)
        self.cluster.asked.append((self.id, type(payload).__name__))
        return getattr(self, type(payload).__name__)(payload)

    def MetadataRequest(self, payload: Any) -> Any:  # named after the request it answers
        c = self.cluster
        return NS(brokers=[NS(node_id=b, host=a.host, port=a.port) for b, a in c.brokers.items()],
                  topics=[NS(name=TOPIC, error_code=ErrorCode.none, partitions=[
                      NS(partition_index=p, leader_id=leader, replica_nodes=replicas)
                      for p, (leader, replicas) in sorted(c.placement.items())])])

    def DescribeProducersRequest(self, payload: Any) -> Any:
        partitions = []
        for t in payload.topics:
            for p in t.partition_indexes:
                held = self.id in self.cluster.placement[int(p)][1]
                partitions.append(NS(
                    partition_index=p, error_code=ErrorCode.none if held else ErrorCode.not_leader_or_follower,
                    active_producers=[NS(producer_id=s.producer_id, producer_epoch=s.producer_epoch,
                                         last_timestamp=s.last_timestamp_ms, coordinator_epoch=s.coordinator_epoch,
                                         current_txn_start_offset=s.current_txn_start_offset,
                                         last_sequence=s.last_sequence)
                                      for s in self.cluster.views.get((self.id, int(p)), [])] if held else []))
        return NS(topics=[NS(name=TOPIC, partitions=partitions)])

    def DescribeConfigsRequest(self, payload: Any) -> Any:
        # A broker describes only itself: another broker's id is INVALID_REQUEST (ConfigHelper, 2.8 to 3.9).
        return NS(results=[
            NS(error_code=ErrorCode.none, resource_name=r.resource_name,
               configs=[NS(name="transaction.max.timeout.ms", value=str(self.cluster.max_timeout_ms))])
            if r.resource_name == str(self.id) else
            NS(error_code=ErrorCode.invalid_request, resource_name=r.resource_name, configs=[])
            for r in payload.resources])

    def ListTransactionsRequest(self, payload: Any) -> Any:
        if self.cluster.on_list_transactions is not None:
            self.cluster.on_list_transactions()
        return NS(error_code=ErrorCode.none, transaction_states=[])  # the coordinator knows no such producer id

    def WriteTxnMarkersRequest(self, payload: Any) -> Any:
        (marker,) = payload.markers
        (topic,) = marker.topics
        (partition,) = topic.partition_indexes
        self.cluster.markers.append((self.id, int(partition), int(marker.producer_id)))
        return NS(markers=[NS(topics=[NS(name=topic.name, partitions=[
            NS(partition_index=partition, error_code=ErrorCode.none)])])])


class FakeCluster:
    """Brokers by id; `placement`: partition -> (leader, replicas); `views`: (broker, partition) -> that replica's
    producer states; `offers`: broker -> API key -> (min, max) or None (not listed; unnamed keys: any version)."""

    def __init__(self, brokers: int = 1, max_timeout_ms: int = 60_000) -> None:
        self.brokers = {b: HostPort(f"b{b}", 9000 + b) for b in range(1, brokers + 1)}
        self.placement: dict[int, tuple[int, tuple[int, ...]]] = {0: (1, tuple(self.brokers))}
        self.views: dict[tuple[int, int], list[ProducerState]] = {}
        self.offers: dict[int, dict[int, tuple[int, int] | None]] = {}
        self.max_timeout_ms = max_timeout_ms
        self.asked: list[tuple[int, str]] = []
        self.markers: list[tuple[int, int, int]] = []
        self.on_list_transactions: Any = None
        self.transaction_log = DENIED  # what reading the coordinator's log gives (where ListTransactions is missing)
        self.log_reads = 0

    async def read_transaction_log(self) -> hanging_io.LogRead:
        self.log_reads += 1
        return self.transaction_log

    def like_kafka_2_8(self) -> FakeCluster:
        for b in self.brokers:
            self.offers.setdefault(b, {}).update({ApiKey.LIST_TRANSACTIONS: None, ApiKey.DESCRIBE_TRANSACTIONS: None})
        return self

    def connections(self) -> Any:
        by_address = {a: FakeBroker(self, b) for b, a in self.brokers.items()}

        async def get(address: HostPort) -> FakeBroker:
            return by_address[address]

        return NS(get=get, close=lambda: None)

    def admin(self, bootstrap: int = 1) -> hanging_io.ClusterAdmin:
        admin = hanging_io.ClusterAdmin([self.brokers[bootstrap]])
        admin._connections = self.connections()  # type: ignore[assignment]  # the fake wire
        admin.read_transaction_log = self.read_transaction_log  # type: ignore[method-assign]  # the fake log
        return admin

    def asked_producers(self) -> list[int]:
        return [b for b, what in self.asked if what == "DescribeProducersRequest"]


def open_transaction(age_ms: int, producer_id: int = 7, start_offset: int = 5) -> ProducerState:
    """An open transaction whose producer's last timestamp is `age_ms` old (CreateTime: the producer's stamp)."""
    return ProducerState(producer_id, 0, hanging_io.now_ms() - age_ms, -1, start_offset)


def run(cluster: FakeCluster, *argv: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setattr(hanging_io, "ClusterAdmin", _admin_factory(cluster))
    parser = argparse.ArgumentParser()
    hanging_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["hanging", "--bootstrap", "b1:9001", *argv])
    out, err = io.StringIO(), io.StringIO()
    status = hanging_cli.run_cli(args, stdin=io.StringIO(""), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _admin_factory(cluster: FakeCluster) -> Any:
    real = hanging_io.ClusterAdmin

    def make(bootstrap: Any, **kw: Any) -> hanging_io.ClusterAdmin:
        admin = real(bootstrap, **kw)
        admin._connections = cluster.connections()  # the fake wire
        admin.read_transaction_log = cluster.read_transaction_log  # type: ignore[method-assign]  # the fake log
        return admin

    return make


# -- item 2: an unconfirmed finding is never aborted by --abort --yes ---------------------------------------------


def test_abort_yes_leaves_an_unconfirmed_finding_alone_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # Kafka 2.8: no ListTransactions. A live transaction of a producer that stamps event time two hours back.
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]

    status, out, err = run(cluster, "--topic", TOPIC, "--abort", "--yes", "--json", monkeypatch=monkeypatch)

    assert cluster.markers == []                                       # nothing written
    assert "WriteTxnMarkersRequest" not in {what for _, what in cluster.asked}
    report = json.loads(out)
    (finding,) = report["findings"]
    assert (finding["reason"], finding["confirmed"]) == ("unconfirmed_coordinator_cannot_be_asked", False)
    assert [a["outcome"] for a in report["aborts"]] == ["left_unconfirmed"]
    assert "left alone" in err and "may be a live transaction" in err and "event-time" in err
    assert "--abort-unconfirmed-i-checked" in err
    assert status == 0


def test_only_the_explicit_flag_aborts_an_unconfirmed_finding_after_saying_why_it_may_be_live(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]

    status, out, err = run(cluster, "--topic", TOPIC, "--abort", "--yes", "--abort-unconfirmed-i-checked",
                           monkeypatch=monkeypatch)

    assert cluster.markers == [(1, 0, 7)]                              # to the leader, for producer 7
    warning = err.index("may be a live transaction")
    assert "aborted the hanging transaction on topic t partition 0 producer id 7" in out
    assert warning >= 0 and "event-time" in err and "clock behind" in err
    assert status == 0


@pytest.mark.parametrize("argv, message", [
    (["--abort-unconfirmed-i-checked"], "go with --abort"),
    (["--transaction-max-timeout-ms", "60000", "--max-transaction-timeout", "15"], "--transaction-max-timeout-ms"),
    (["--transaction-max-timeout-ms", "0"], "positive"),
])
def test_the_new_flags_are_refused_where_they_mean_nothing(argv: list[str], message: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hanging", "--bootstrap", "h:1", "--topic", "t", *argv]) == 2
    assert message in capsys.readouterr().err


# -- item 6: the unconfirmed threshold is the cluster's transaction.max.timeout.ms ---------------------------------


@pytest.mark.parametrize("max_timeout_ms, age_ms, flag, found", [
    (60_000, 2 * MIN, (), True),                # older than the cluster's maximum: found (15 fixed minutes: not)
    (30 * MIN, 20 * MIN, (), False),            # a 30-minute maximum: 20 minutes may be a live transaction
    (30 * MIN, 2 * MIN, ("--transaction-max-timeout-ms", "60000"), True),  # the flag overrides the cluster
])
def test_the_unconfirmed_threshold_is_the_clusters_transaction_max_timeout(
        max_timeout_ms: int, age_ms: int, flag: tuple[str, ...], found: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster(max_timeout_ms=max_timeout_ms).like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(age_ms)]

    status, out, _ = run(cluster, "--topic", TOPIC, "--json", *flag, monkeypatch=monkeypatch)

    report = json.loads(out)
    threshold = int(flag[1]) if flag else max_timeout_ms
    assert [(f["reason"], f["threshold_ms"]) for f in report["findings"]] == \
        ([("unconfirmed_coordinator_cannot_be_asked", threshold)] if found else [])
    assert report["unknown_transaction_timeout_ms"] == threshold
    assert status == 0


def test_a_periodic_scan_reads_transaction_max_timeout_once_not_every_scan() -> None:
    # The proxy's scan may run every second with candidates every time: the brokers' read-only setting is read
    # once (and again after MAX_TIMEOUT_TTL_S, or after the admin was closed on a failure).
    cluster = FakeCluster(brokers=2).like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]
    admin = cluster.admin()

    async def two_scans() -> list[hanging_io.ScanResult]:
        return [await hanging_io.scan(admin, hanging_io.Scope(topic=TOPIC), OwnTimeout()) for _ in range(2)]

    results = asyncio.run(two_scans())
    assert sorted(b for b, what in cluster.asked if what == "DescribeConfigsRequest") == [1, 2]  # each broker once
    assert [r.unknown_timeout_ms for r in results] == [60_000, 60_000]
    asyncio.run(admin.close())
    asyncio.run(hanging_io.scan(admin, hanging_io.Scope(topic=TOPIC), OwnTimeout()))
    assert len([b for b, what in cluster.asked if what == "DescribeConfigsRequest"]) == 4


# -- item 3: leaders only, the second look to the leader of that moment --------------------------------------------


def test_a_broker_scope_asks_each_partitions_leader_not_a_lagging_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    # Partition 0: leader 1 (the transaction committed), follower 2 behind (it still shows the transaction open).
    cluster = FakeCluster(brokers=2)
    cluster.views[(1, 0)] = []
    cluster.views[(2, 0)] = [open_transaction(2 * HOUR)]

    status, out, _ = run(cluster, "--broker-id", "2", "--json", monkeypatch=monkeypatch)

    assert json.loads(out)["findings"] == []
    assert cluster.asked_producers() == [1]                    # the leader, never the follower
    assert status == 0


def test_a_sidecar_scans_only_what_its_broker_leads() -> None:
    cluster = FakeCluster(brokers=2)
    cluster.placement = {0: (1, (1, 2)), 1: (2, (2, 1))}
    cluster.views = {(1, 0): [], (2, 0): [open_transaction(2 * HOUR)],               # 2 lags on 0
                     (2, 1): [open_transaction(2 * HOUR, 8, 9)], (1, 1): [open_transaction(2 * HOUR, 8, 9)]}

    def sidecar_scan(broker: int) -> hanging_io.ScanResult:
        return asyncio.run(hanging_io.scan(cluster.admin(bootstrap=broker), hanging_io.Scope(local_broker=True),
                                        OwnTimeout(unknown_ms=HOUR)))

    # Broker 2's sidecar: partition 1 only (it leads it), asked of its own broker twice (the first look and the
    # second); its stale view of 0 is not asked.
    result = sidecar_scan(2)
    assert [(f.partition, f.producer_id) for f in result.findings] == [(1, 8)]
    assert (result.partitions, cluster.asked_producers()) == (1, [2, 2])
    # Broker 1's sidecar: partition 0, where the transaction is over; partition 1 is not its to report.
    cluster.asked.clear()
    result = sidecar_scan(1)
    assert (result.findings, result.partitions, cluster.asked_producers()) == ((), 1, [1])


def test_the_second_look_asks_the_leader_known_at_that_moment() -> None:
    # First look: leader 1 shows an open transaction with no transactional id. While the coordinators are asked,
    # leadership moves to 2, which has the abort marker; 1 (a follower now, behind) still shows it open.
    cluster = FakeCluster(brokers=2)
    cluster.placement = {0: (1, (1, 2))}
    cluster.views = {(1, 0): [open_transaction(2 * HOUR)], (2, 0): [open_transaction(2 * HOUR)]}

    def leadership_moves() -> None:
        cluster.placement = {0: (2, (2, 1))}
        cluster.views[(2, 0)] = [ProducerState(7, 0, hanging_io.now_ms() - 2 * HOUR, 3, -1)]  # marker written

    cluster.on_list_transactions = leadership_moves
    result = asyncio.run(hanging_io.scan(cluster.admin(), hanging_io.Scope(topic=TOPIC), OwnTimeout()))

    assert cluster.asked_producers() == [1, 2]                 # the leader then, the leader now
    assert result.findings == ()


# -- item 4: a missing API in an abort is one line naming it and the broker ---------------------------------------


def test_an_abort_on_a_broker_without_write_txn_markers_v1_says_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster()
    cluster.offers[1] = {WRITE_TXN_MARKERS: (0, 0)}              # WriteTxnMarkers v0 only
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]          # no transactional id: a confirmed finding

    status, out, err = run(cluster, "--topic", TOPIC, "--max-transaction-timeout", "15", "--abort", "--yes",
                           monkeypatch=monkeypatch)

    assert err.splitlines() == [
        "abort of topic t partition 0 producer id 7 epoch 0 start offset 5 (coordinator epoch 0) failed: "
        "broker 1 (b1:9001) does not offer WriteTxnMarkers v1 (it offers v0-v0)"]
    assert cluster.markers == [] and "aborted" not in out
    assert status == 1                                           # as any other refused abort


def test_a_scan_on_a_broker_without_describe_producers_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster()
    cluster.offers[1] = {ApiKey.DESCRIBE_PRODUCERS: None}        # Kafka before 2.8

    status, _, err = run(cluster, "--topic", TOPIC, monkeypatch=monkeypatch)

    assert err.splitlines() == ["txnguard hanging: broker 1 (b1:9001) does not offer DescribeProducers v0 "
                                "(its ApiVersions does not list it)"]
    assert status == 1


def test_without_describe_configs_the_threshold_is_kafkas_default_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster().like_kafka_2_8()
    cluster.offers[1][DESCRIBE_CONFIGS] = None
    cluster.views[(1, 0)] = [open_transaction(20 * MIN)]

    status, out, _ = run(cluster, "--topic", TOPIC, "--json", monkeypatch=monkeypatch)

    report = json.loads(out)
    assert report["unknown_transaction_timeout_ms"] == 15 * MIN
    assert "no broker described it" in report["unknown_transaction_timeout_source"]
    assert [f["threshold_ms"] for f in report["findings"]] == [15 * MIN]
    assert status == 0


def test_the_proxys_scan_logs_an_unconfirmed_finding_as_unconfirmed_past_the_clusters_threshold() -> None:
    # The proxy's periodic scan never aborts; its log line says whether a person must check before anyone does.
    cfg = config.from_mapping({"upstream": "b1:9001", "health": {"hanging_scan_interval_s": 1}})
    records: list[dict[str, Any]] = []
    monitor = hanging_monitor.attach(cfg, ProxyMetrics(), NS(proxy_id="gw", write=records.append), None)  # type: ignore[arg-type]
    assert monitor is not None
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]
    monitor.admin = cluster.admin()
    logged: list[tuple[str, dict[str, Any]]] = []
    monitor.log = NS(warning=lambda event, **facts: logged.append((event, facts)), info=None)  # type: ignore[assignment]

    asyncio.run(monitor.scan_once())

    [facts] = [facts for event, facts in logged if event == "hanging_transaction_found"]
    assert (facts["reason"], facts.get("confirmed"), facts["threshold_ms"]) == \
        ("unconfirmed_coordinator_cannot_be_asked", False, 60_000)
    assert [r["reason"] for r in records] == ["unconfirmed_coordinator_cannot_be_asked"]


# -- issue 31 item 5: on 2.8 the coordinator's log confirms, where it may be read ------------------------------------


def logged_transaction(state: str, *partitions: tuple[str, int], producer_id: int = 7) -> hanging_io.LogRead:
    """The log read to its end holds `app` (producer 7) in `state` with `partitions`, its timeout 60 s."""
    return hanging_io.LogRead({producer_id: TransactionView("app", state, producer_id, 0, frozenset(partitions), 60_000,
                                                         -1 if not partitions else 1)})


def test_on_2_8_a_log_the_principal_may_not_read_is_one_line_and_the_finding_stays_unconfirmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]

    status, out, err = run(cluster, "--topic", TOPIC, "--json", monkeypatch=monkeypatch)

    assert cluster.log_reads == 1
    report = json.loads(out)
    (finding,) = report["findings"]
    assert (finding["reason"], finding["confirmed"]) == ("unconfirmed_coordinator_cannot_be_asked", False)
    assert report["transaction_log"] == DENIED.problem and report["unconfirmed"] is True
    [line] = [line for line in err.splitlines() if "coordinator's log" in line]
    assert "TOPIC_AUTHORIZATION_FAILED" in line and "nothing is confirmed" in line
    assert status == 0


def test_on_2_8_the_log_confirms_a_write_its_transaction_never_added_and_abort_yes_aborts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]
    cluster.transaction_log = logged_transaction("Empty")  # InitProducerId, and no AddPartitionsToTxn since

    status, out, err = run(cluster, "--topic", TOPIC, "--abort", "--yes", "--json", monkeypatch=monkeypatch)

    report = json.loads(out)
    (finding,) = report["findings"]
    assert (finding["reason"], finding["confirmed"], finding["transactional_id"]) == \
        ("confirmed_by_transaction_log", True, "app")
    assert (finding["threshold_ms"], report["transaction_log"], report["unconfirmed"]) == (70_000, "read", False)
    assert [a["outcome"] for a in report["aborts"]] == ["NONE"]
    assert cluster.markers == [(1, 0, 7)]                              # to the leader, for producer 7
    assert "coordinator's log" not in err and status == 0


def test_on_2_8_a_live_transaction_the_log_lists_is_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]  # two hours old by its event-time timestamp
    cluster.transaction_log = logged_transaction("Ongoing", (TOPIC, 0))

    status, out, _ = run(cluster, "--topic", TOPIC, "--abort", "--yes", "--json", monkeypatch=monkeypatch)

    report = json.loads(out)
    assert (report["findings"], report["aborts"], cluster.markers, status) == ([], [], [], 0)


def test_the_proxys_scan_on_2_8_reads_its_followers_view_to_the_end_not_the_log_again() -> None:
    # The proxy already follows the log: the scan reads the follower's partitions to their end (after
    # DescribeProducers answered) and judges from its view; no one-shot read of its own.
    view = TransactionLogView()
    view.apply(3, LogRecord(0, key("app"), value(TxnLogValue(7, 0, 60_000, "Empty", frozenset(), 1, -1))))
    follower = LogFollower(view, ProxyMetrics(), lambda: (), HostPort)
    follower.leaders, follower.caught_up_at, view.partition_count = {3: HostPort("b1", 9001)}, {3: 0.0}, 4
    follower.caught_up_once = True  # it has read the log once (a proxy just started waits for that first)
    read_asked: list[list[int]] = []

    async def read_to_end(partitions: Any, budget_s: float) -> set[int]:
        read_asked.append(sorted(partitions))
        return {3}

    follower.read_to_end = read_to_end  # type: ignore[method-assign]
    cfg = config.from_mapping({"upstream": "b1:9001", "health": {"hanging_scan_interval_s": 1}})
    records: list[dict[str, Any]] = []
    monitor = hanging_monitor.attach(cfg, ProxyMetrics(), NS(proxy_id="gw", write=records.append), None,  # type: ignore[arg-type]
                                     follower)
    assert monitor is not None
    cluster = FakeCluster().like_kafka_2_8()
    cluster.views[(1, 0)] = [open_transaction(2 * HOUR)]
    monitor.admin = cluster.admin()

    result = asyncio.run(monitor.scan_once())

    assert result is not None and cluster.log_reads == 0 and read_asked == [[3]]
    assert [(r["reason"], r["transactional_id"]) for r in records] == [("confirmed_by_transaction_log", "app")]
    assert result.transaction_log_unread == (0, 1, 2)  # its other partitions: not read, their ids unconfirmed

"""The hanging-transaction shell without brokers: config, the audit record, the CLI's rules, and the
proxy's monitor over a fake admin (metrics, once-only logs and audit records)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from txnguard import cli
from txnguard.proxy import config, hanging_cli, hanging_io, hanging_monitor
from txnguard.proxy.config import ConfigError, HostPort
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.audit import HANGING, hanging_record, record_key
from txnguard.verification.hanging import (
    NO_TRANSACTIONAL_ID,
    NOT_IN_TRANSACTION,
    Finding,
    MaxTimeout,
    OwnTimeout,
    ProducerState,
    TransactionView,
)

NOW = 1_700_000_000_000
MIN = 60_000


def test_health_is_off_by_default_and_validated():
    base = {"upstream": "127.0.0.1:9092"}
    assert config.from_mapping(base).health.hanging_scan_interval_s is None
    cfg = config.from_mapping({**base, "health": {"hanging_scan_interval_s": 60}})
    assert cfg.health.hanging_scan_interval_s == 60.0 and cfg.health.hanging_max_transaction_timeout_s is None
    assert cfg.health.hanging_timeout_margin_s == 10.0
    # Unset: each transaction's own timeout plus the margin; set: find-hanging's one threshold.
    assert hanging_monitor.rule_of(None, 10.0) == OwnTimeout(margin_ms=10_000)
    assert hanging_monitor.rule_of(900.0, 10.0) == MaxTimeout(900_000)
    with pytest.raises(ConfigError, match=r"health\.hanging_scan_interval_s: -1 is not a positive number"):
        config.from_mapping({**base, "health": {"hanging_scan_interval_s": -1}})
    with pytest.raises(ConfigError, match=r"health\.scan: unknown setting"):
        config.from_mapping({**base, "health": {"scan": 1}})
    env = config.load(None, {"upstream": "127.0.0.1:9092"}, environ={"TXNGUARD_HEALTH__HANGING_SCAN_INTERVAL_S": "5"})
    assert env.health.hanging_scan_interval_s == 5.0


def test_the_audit_record_names_the_transaction():
    f = Finding("orders", 3, 7, 1, -1, 42, NOW - 20 * MIN, NO_TRANSACTIONAL_ID)
    r = hanging_record(time_ms=NOW, proxy_id="gw", finding=f, max_transaction_timeout_ms=15 * MIN)
    assert r["kind"] == HANGING and r["schema_version"] == 2 and r["target"] == "orders-3"
    assert (r["producer_id"], r["producer_epoch"], r["start_offset"], r["age_ms"]) == (7, 1, 42, 20 * MIN)
    assert r["transactional_id"] is None and record_key(r) is None
    # Without the keyword, the threshold the finding passed (its own timeout plus the margin, here).
    own = Finding("orders", 3, 7, 1, -1, 42, NOW - 71_000, NOT_IN_TRANSACTION, "app", "Empty", 70_000, 60_000)
    assert hanging_record(time_ms=NOW, proxy_id="gw", finding=own)["max_transaction_timeout_ms"] == 70_000


@pytest.mark.parametrize("argv, message", [
    (["hanging", "--bootstrap", "h:1", "--partition", "0"], "--partition needs --topic"),
    (["hanging", "--bootstrap", "h:1", "--topic", "t", "--yes"], "go with --abort"),
    (["hanging", "--bootstrap", "nohostport"], "is not host:port"),
    (["hanging", "--bootstrap", "h:1", "--timeout-margin", "-1"], "are not negative"),
])
def test_cli_refuses_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


class FakeAdmin:
    """Answers as a one-broker cluster whose producer states the test sets."""

    bootstrap = (HostPort("b", 1),)

    def __init__(self) -> None:
        self.producers: dict[tuple[str, int], list[ProducerState]] = {}
        self.listings: list[tuple[str, int]] = []
        self.descriptions: dict[str, TransactionView | None] = {}
        self.fail = False

    async def metadata(self, topic: str | None = None) -> hanging_io.ClusterView:
        if self.fail:
            raise hanging_io.HangingScanError("down")
        return hanging_io.ClusterView({1: HostPort("b", 1)},
                                   {tp: hanging_io.PartitionInfo(1, (1,)) for tp in self.producers})

    async def describe_producers(self, address: HostPort, tps: Any) -> Any:
        return {tp: self.producers[tp] for tp in tps}, {}

    async def list_transactions(self, brokers: Any, pids: Any) -> list[tuple[str, int]]:
        return self.listings

    async def describe_transactions(self, ids: Any) -> dict[str, TransactionView | None]:
        return {i: self.descriptions.get(i) for i in ids}

    async def transaction_max_timeout_ms(self, view: Any) -> tuple[int, str]:
        return 15 * MIN, "the fake cluster's"

    async def own_broker_id(self, view: Any) -> int:
        return 1

    async def close(self) -> None:
        pass


class Audit:
    proxy_id = "gw"

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.events.append(event)

    info = warning


def test_the_monitor_exports_gauges_and_reports_each_finding_once():
    cfg = config.from_mapping({"upstream": "127.0.0.1:9092", "health": {"hanging_scan_interval_s": 1}})
    metrics, audit, admin = ProxyMetrics(), Audit(), FakeAdmin()
    monitor = hanging_monitor.attach(cfg, metrics, audit, None)  # type: ignore[arg-type]
    assert monitor is not None and monitor.rule == OwnTimeout()  # by default: each transaction's own timeout
    monitor.admin = admin  # type: ignore[assignment]
    monitor.log = log = Log()
    old = 20 * 60 * 1000
    clock_now = hanging_io.now_ms()
    admin.producers = {("t", 0): [ProducerState(7, 0, clock_now - old, -1, 5)], ("t", 1): []}
    g = metrics.registry.get_sample_value

    asyncio.run(monitor.scan_once())
    assert g("txnguard_hanging_transactions", {"topic": "t", "partition": "0"}) == 1
    assert g("txnguard_oldest_open_transaction_age_seconds") >= old / 1000
    assert [r["start_offset"] for r in audit.records] == [5]
    asyncio.run(monitor.scan_once())          # the same finding: no second record
    assert len(audit.records) == 1
    assert g("txnguard_hanging_scans_total", {"outcome": "ok"}) == 2

    admin.producers = {("t", 0): [ProducerState(7, 0, clock_now - old, 3, -1)], ("t", 1): []}  # aborted
    asyncio.run(monitor.scan_once())
    assert g("txnguard_hanging_transactions", {"topic": "t", "partition": "0"}) is None
    assert g("txnguard_oldest_open_transaction_age_seconds") == 0
    admin.fail = True
    asyncio.run(monitor.scan_once())
    assert g("txnguard_hanging_scans_total", {"outcome": "failed"}) == 1
    assert log.events == ["hanging_transaction_found", "hanging_transaction_resolved", "hanging_scan_failed"]


def test_the_cli_prints_the_tools_table_and_a_dry_run(monkeypatch: pytest.MonkeyPatch):
    admin = FakeAdmin()
    admin.producers = {("t", 0): [ProducerState(7, 0, hanging_io.now_ms() - 20 * MIN, -1, 5)]}
    aborts: list[Any] = []

    async def plan(a: Any, f: Finding) -> hanging_io.AbortPlan:
        return hanging_io.AbortPlan(f, hanging_io.abort_spec(f.topic, f.partition, admin.producers[("t", 0)],
                                                      f.start_offset), HostPort("b", 1))

    async def do_abort(a: Any, p: hanging_io.AbortPlan) -> str:
        aborts.append(p.spec)
        return "NONE"

    monkeypatch.setattr(hanging_io, "ClusterAdmin", lambda *a, **k: admin)
    monkeypatch.setattr(hanging_io, "plan_abort", plan)
    monkeypatch.setattr(hanging_io, "abort", do_abort)
    out, err = io.StringIO(), io.StringIO()
    args = cli_args("--topic", "t", "--abort")
    assert hanging_cli.run_cli(args, stdin=io.StringIO(""), stdout=out, stderr=err) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split()[0] == "Topic" and lines[1].split()[:6] == ["t", "0", "7", "0", "-1", "5"]
    assert lines[2].startswith("dry run: would abort the hanging transaction on topic t partition 0 producer id 7 "
                               "epoch 0 start offset 5")
    assert aborts == []

    # At a terminal: a prompt naming the transaction; anything but y/yes leaves it.
    err = io.StringIO()
    assert hanging_cli.run_cli(cli_args("--topic", "t", "--abort"), stdin=Tty("n\n"), stdout=io.StringIO(),
                               stderr=err) == 0
    assert "Abort the hanging transaction on topic t partition 0 producer id 7 epoch 0 start offset 5" in err.getvalue()
    assert aborts == []
    assert hanging_cli.run_cli(cli_args("--topic", "t", "--abort"), stdin=Tty("y\n"), stdout=io.StringIO(),
                               stderr=err) == 0
    assert len(aborts) == 1
    # --dry-run wins over --yes; --start-offset picks none here.
    for extra in (["--yes", "--dry-run"], ["--yes", "--start-offset", "6"]):
        assert hanging_cli.run_cli(cli_args("--topic", "t", "--abort", *extra), stdin=Tty("y\n"), stdout=io.StringIO(),
                               stderr=err) == 0
    assert len(aborts) == 1
    aborts.clear()

    out = io.StringIO()
    assert hanging_cli.run_cli(cli_args("--topic", "t", "--abort", "--yes"), stdin=io.StringIO(""), stdout=out,
                           stderr=err) == 0
    assert "aborted the hanging transaction on topic t partition 0 producer id 7" in out.getvalue()
    assert [(s.producer_id, s.coordinator_epoch) for s in aborts] == [(7, 0)]


def test_default_flags_pick_each_transactions_own_timeout_and_the_flag_picks_find_hangings_rule():
    assert hanging_cli.rule_of_args(cli_args()) == OwnTimeout(margin_ms=10_000)
    assert hanging_cli.rule_of_args(cli_args("--timeout-margin", "2.5")) == OwnTimeout(margin_ms=2_500)
    assert hanging_cli.rule_of_args(cli_args("--max-transaction-timeout", "15")) == MaxTimeout(15 * MIN)
    assert hanging_cli.rule_of_args(cli_args("--max-transaction-timeout", "0")) == MaxTimeout(0)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def cli_args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    hanging_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["hanging", "--bootstrap", "b:1", *argv])


class TwoBrokerAdmin(FakeAdmin):
    """Partition t-0 led by broker 1, t-1 by broker 2; broker 1 holds t-0 only."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[HostPort, list[tuple[str, int]]]] = []

    async def metadata(self, topic: str | None = None) -> hanging_io.ClusterView:
        return hanging_io.ClusterView({1: HostPort("b", 1), 2: HostPort("c", 2)},
                                      {("t", 0): hanging_io.PartitionInfo(1, (1,)),
                                       ("t", 1): hanging_io.PartitionInfo(2, (2,))})

    async def describe_producers(self, address: HostPort, tps: Any) -> Any:
        self.asked.append((address, list(tps)))
        if address == HostPort("b", 1):
            return ({tp: self.producers[tp] for tp in tps if tp == ("t", 0)},
                    {tp: "NOT_LEADER_OR_FOLLOWER" for tp in tps if tp != ("t", 0)})
        raise hanging_io.UpstreamError("c is down")


def test_scopes_pick_the_broker_asked():
    old = hanging_io.now_ms() - 20 * MIN
    admin = TwoBrokerAdmin()
    admin.producers = {("t", 0): [ProducerState(7, 0, old, -1, 5)], ("t", 1): [ProducerState(8, 0, old, -1, 9)]}
    run = lambda scope: asyncio.run(hanging_io.scan(admin, scope, MaxTimeout(15 * MIN)))  # type: ignore[arg-type]  # noqa: E731

    # Leaders: t-1's leader does not answer, which is an error for t-1, not the end of the scan.
    result = run(hanging_io.Scope(topic="t"))
    assert [f.partition for f in result.findings] == [0]
    assert {a for a, _ in admin.asked} == {HostPort("b", 1), HostPort("c", 2)}
    assert list(result.errors) == [("t", 1)] and result.described == 1

    # A sidecar asks its own broker about what it leads only (t-1 is broker 2's, and its sidecar's to report).
    admin.asked.clear()
    result = run(hanging_io.Scope(local_broker=True))
    assert admin.asked == [(HostPort("b", 1), [("t", 0)])]
    assert [f.partition for f in result.findings] == [0] and result.errors == {}

    # --broker-id: the partitions with a replica there, asked of their leader (here the same broker).
    admin.asked.clear()
    result = run(hanging_io.Scope(broker_id=1))
    assert admin.asked == [(HostPort("b", 1), [("t", 0)])]
    with pytest.raises(hanging_io.HangingScanError, match="broker 5"):
        run(hanging_io.Scope(broker_id=5))


class MarkerMeanwhileAdmin(FakeAdmin):
    """The coordinator writes t-0's marker while it answers DescribeTransactions (PrepareCommit, t-0 dropped)."""

    def __init__(self, write_marker: bool) -> None:
        super().__init__()
        self.write_marker = write_marker
        self.described: list[list[tuple[str, int]]] = []

    async def describe_producers(self, address: HostPort, tps: Any) -> Any:
        self.described.append(list(tps))
        return await super().describe_producers(address, tps)

    async def describe_transactions(self, ids: Any) -> dict[str, TransactionView | None]:
        if self.write_marker:
            self.producers[("t", 0)] = [ProducerState(7, 0, self.producers[("t", 0)][0].last_timestamp_ms, 3, -1)]
        return await super().describe_transactions(ids)


def test_the_scan_looks_at_the_partition_again_after_the_coordinator_answered():
    for write_marker, found in ((True, []), (False, [0])):
        admin = MarkerMeanwhileAdmin(write_marker)
        admin.producers = {("t", 0): [ProducerState(7, 0, hanging_io.now_ms() - 5 * MIN, -1, 5)]}
        admin.listings = [("app", 7)]
        admin.descriptions = {"app": TransactionView("app", "PrepareCommit", 7, 0, frozenset({("t", 1)}), 60_000)}
        result = asyncio.run(hanging_io.scan(admin, hanging_io.Scope(topic="t"), OwnTimeout()))  # type: ignore[arg-type]
        assert admin.described == [[("t", 0)], [("t", 0)]]  # leader, coordinator, leader again
        assert [f.partition for f in result.findings] == found
        # find-hanging's rule never looks twice (and at 5 minutes it has no candidate at all).
        admin.described.clear()
        assert asyncio.run(hanging_io.scan(admin, hanging_io.Scope(topic="t"), MaxTimeout())).findings == ()  # type: ignore[arg-type]
        assert admin.described == [[("t", 0)]]

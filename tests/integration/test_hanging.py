"""Hanging transactions on a real Kafka 3.5.2: `txnguard hanging` against Kafka's own find-hanging, the abort,
and the proxy's periodic scan.

The hanging transaction is the one the harness already makes (tests/integration/test_smoke_direct.py's
negative control): a transactional batch written straight to the leader of a partition never added to
the transaction (a 3.5 broker appends it anyway), its record timestamps set 30 minutes back. Both
tools measure a transaction's age from the producer's last timestamp, which the broker takes from the
batch, so it is older than the default 15-minute --max-transaction-timeout at once: no waiting.

Beside it, a transaction that is just as old-looking but was added to its transaction (AddPartitionsToTxn)
is a candidate for both tools and not hanging for either: the coordinator lists its partition.

The comparisons with the tool run `txnguard hanging --max-transaction-timeout 15` (find-hanging's rule, its
default threshold). With default flags, and in the proxy's scan by default, a transaction hangs after its
own timeout (plus a margin, 10 s by default) instead: the last test makes one with a 15 s timeout and a current
timestamp (and one with 5 s), and waits for both to report them, with an idle healthy transaction beside.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing import clients, raw
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.proxy import ProxyThread

pytestmark = [pytest.mark.integration, pytest.mark.java]

NameFactory = Callable[[str], str]
BACKDATE = datetime.timedelta(minutes=30)


@dataclasses.dataclass(frozen=True)
class Made:
    producer_id: int
    producer_epoch: int
    start_offset: int
    stamp: datetime.datetime


def _produce_ok(client: raw.RawClient, topic: str, partition: int, batch: bytes,
                transactional_id: str | None = None) -> int:
    """Produce one batch (retrying while a just-created partition's leader is not ready); its base offset."""
    deadline = time.monotonic() + 15
    while True:
        resp = client.produce({(topic, partition): batch}, transactional_id=transactional_id)
        (part,) = resp.responses[0].partition_responses
        if part.error_code == ErrorCode.none:
            return int(part.base_offset)
        assert part.error_code.retriable and time.monotonic() < deadline, part
        time.sleep(0.1)


def make_open_transaction(bootstrap: str, topic: str, txn_id: str, partition: int = 0, *, added: bool = False,
                          before: int = 3, after: int = 2, timeout_ms: int = 60_000,
                          backdate: datetime.timedelta = BACKDATE) -> Made:
    """A transactional batch stamped `backdate` ago on `partition` between plain records, its producer initialised
    with `timeout_ms`; `added`: the coordinator knows (AddPartitionsToTxn, so an ongoing transaction lists it)."""
    _, coord_host, coord_port = raw.coordinator_for(bootstrap, txn_id)
    with raw.RawClient(coord_host, coord_port) as coordinator:
        init = coordinator.init_producer_id(txn_id, timeout_ms)
        assert init.error_code == ErrorCode.none
        producer = raw.ProducerIdentity(int(init.producer_id), int(init.producer_epoch))
        if added:
            resp = coordinator.add_partitions_to_txn(txn_id, producer, {topic: [partition]})
            assert all(p.partition_error_code == ErrorCode.none
                       for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition), resp
    _, host, port = raw.leader_of(bootstrap, topic, partition)
    stamp = datetime.datetime.now(datetime.UTC) - backdate
    with raw.RawClient(host, port) as leader:
        _produce_ok(leader, topic, partition, raw.build_batch([b"before-%d" % i for i in range(before)]))
        start = _produce_ok(leader, topic, partition, raw.build_batch(
            [b"open-0", b"open-1"], producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
            base_sequence=0, transactional=True, timestamp=stamp), transactional_id=txn_id)
        if after:
            _produce_ok(leader, topic, partition, raw.build_batch([b"after-%d" % i for i in range(after)]))
    return Made(producer.producer_id, producer.producer_epoch, start, stamp)


def txnguard(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`txnguard ...` as a user runs it (its own process)."""
    return subprocess.run([sys.executable, "-m", "txnguard.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def hanging_table(*args: str) -> list[clients.HangingTransaction]:
    run = txnguard("hanging", *args)
    assert run.returncode == 0, run.stderr
    return clients.parse_find_hanging(run.stdout)  # the very table Kafka's tool prints


def tool_table(*args: str) -> list[clients.HangingTransaction]:
    """`txnguard hanging` under find-hanging's own rule (its default threshold, given explicitly)."""
    run = txnguard("hanging", "--max-transaction-timeout", "15", *args)
    assert run.returncode == 0, run.stderr
    return clients.parse_find_hanging(run.stdout)  # the very table Kafka's tool prints


def same(rows: list[clients.HangingTransaction]) -> set[clients.HangingTransaction]:
    """Rows without the age in whole minutes (the two runs are seconds apart, so it may tick)."""
    return {dataclasses.replace(r, duration_min=0) for r in rows}


def lso_and_hw(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    _, host, port = raw.leader_of(bootstrap, topic, partition)
    with raw.RawClient(host, port) as leader:
        return (leader.list_offsets(topic, partition, read_committed=True),
                leader.list_offsets(topic, partition, read_committed=False))


def test_txnguard_hanging_finds_exactly_what_find_hanging_finds(
    kafka_pool: ClusterPool, unique_name: NameFactory, start_proxy: Callable[..., ProxyThread],
) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("hang"), partitions=3)
    hung = make_open_transaction(bootstrap, topic, unique_name("tid"), partition=0)
    listed = make_open_transaction(bootstrap, topic, unique_name("tid"), partition=1, added=True)
    # Partition 2: a committed transaction of a real client.
    clients.ConfluentKafkaClient().run_transaction(bootstrap, topic, unique_name("tid"), [b"x"], True, partition=2)

    kafka_rows = clients.transactions_find_hanging(bootstrap, topic=topic)
    ours = tool_table("--bootstrap", bootstrap, "--topic", topic)
    assert [(r.partition, r.producer_id, r.producer_epoch, r.coordinator_epoch, r.start_offset) for r in kafka_rows] \
        == [(0, hung.producer_id, hung.producer_epoch, -1, hung.start_offset)]
    assert same(ours) == same(kafka_rows)
    assert ours[0].last_timestamp_ms == int(hung.stamp.timestamp() * 1000)
    # The transaction on partition 1 is as old, but its coordinator lists the partition: not hanging.
    assert listed.producer_id not in {r.producer_id for r in kafka_rows}

    # The other scopes of the tool: one partition, a broker (every topic on it, internal ones too).
    assert same(tool_table("--bootstrap", bootstrap, "--topic", topic, "--partition", "0")) == \
        same(clients.transactions_find_hanging(bootstrap, topic=topic, partition=0)) == same(kafka_rows)
    assert tool_table("--bootstrap", bootstrap, "--topic", topic, "--partition", "1") == []
    broker = cluster.nodes[0].id
    assert same(tool_table("--bootstrap", bootstrap, "--broker-id", str(broker))) == \
        same(clients.transactions_find_hanging(bootstrap, broker_id=broker))

    # Through a txnguard gateway: the same answer (its requests pass the proxy like any client's).
    proxy = start_proxy(upstream=bootstrap, mode="gateway")
    assert same(tool_table("--bootstrap", proxy.bootstrap, "--topic", topic)) == same(kafka_rows)
    # With default flags (each transaction's own timeout: 60 s, the backdated write is 30 min old), the same.
    assert same(hanging_table("--bootstrap", bootstrap, "--topic", topic)) == same(kafka_rows)

    # JSON names why: the coordinator has no transactional id for this producer id's partition.
    run = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--json")
    report = json.loads(run.stdout)
    (finding,) = report["findings"]
    assert finding["reason"] == "partition_not_in_transaction" and finding["start_offset"] == hung.start_offset
    assert report["scanned_partitions"] == 3
    assert report["oldest_open_transaction_age_ms"] >= BACKDATE.total_seconds() * 1000


def test_nothing_is_found_on_a_clean_topic(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("clean"), partitions=2)
    for commit in (True, False):
        clients.ConfluentKafkaClient().run_transaction(bootstrap, topic, unique_name("tid"), [b"a", b"b"], commit)
    clients.stable_end_offsets(bootstrap, topic)
    # A 0-minute threshold makes any open transaction a candidate: still nothing, in either tool.
    assert clients.transactions_find_hanging(bootstrap, topic=topic, max_transaction_timeout_minutes=0) == []
    assert hanging_table("--bootstrap", bootstrap, "--topic", topic, "--max-transaction-timeout", "0") == []
    assert hanging_table("--bootstrap", bootstrap, "--topic", topic) == []


def test_abort_unblocks_the_last_stable_offset(kafka_pool: ClusterPool, unique_name: NameFactory) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("abort"))
    hung = make_open_transaction(bootstrap, topic, unique_name("tid"), before=3, after=2)
    assert lso_and_hw(bootstrap, topic) == (3, 7)
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, topic) == [b"before-0", b"before-1", b"before-2"]

    # --abort alone (no terminal, no --yes) is a dry run that names the transaction; nothing changes.
    dry = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort")
    assert dry.returncode == 0, dry.stderr
    assert (f"dry run: would abort the hanging transaction on topic {topic} partition 0 producer id "
            f"{hung.producer_id} epoch {hung.producer_epoch} start offset 3 (coordinator epoch 0)") in dry.stdout
    assert lso_and_hw(bootstrap, topic) == (3, 7)

    done = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"aborted the hanging transaction on topic {topic} partition 0 producer id {hung.producer_id}" in done.stdout
    # The abort marker is at 7: the LSO moves past it, and read_committed readers read on.
    assert lso_and_hw(bootstrap, topic) == (8, 8)
    assert clients.ConfluentKafkaClient().consume_committed(bootstrap, topic) == \
        [b"before-0", b"before-1", b"before-2", b"after-0", b"after-1"]
    assert clients.Kcat().consume_committed(bootstrap, topic) == \
        [b"before-0", b"before-1", b"before-2", b"after-0", b"after-1"]
    assert clients.transactions_find_hanging(bootstrap, topic=topic) == []
    # Nothing left to abort: a second run says so and sends nothing.
    again = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort", "--yes")
    assert again.returncode == 0 and clients.parse_find_hanging(again.stdout) == []


def test_the_proxy_scans_continuously_and_exports_the_gauge(
    kafka_pool: ClusterPool, unique_name: NameFactory, start_proxy: Callable[..., ProxyThread], tmp_path: Path,
) -> None:
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("scan"))
    audit = tmp_path / "audit.jsonl"
    p = start_proxy(upstream=bootstrap, mode="gateway", audit_path=str(audit), health={"hanging_scan_interval_s": 0.5})
    labels = {"topic": topic, "partition": "0"}
    p.wait_for(lambda: p.metric("txnguard_hanging_scans_total", {"outcome": "ok"}) >= 1,
               timeout=30, what="a first scan")
    assert p.metric("txnguard_hanging_transactions", labels) == 0

    hung = make_open_transaction(bootstrap, topic, unique_name("tid"))
    p.wait_for(lambda: p.metric("txnguard_hanging_transactions", labels) == 1,
               timeout=30, what="the hanging transaction's gauge")
    assert p.metric("txnguard_oldest_open_transaction_age_seconds") >= BACKDATE.total_seconds()
    scans = p.metric("txnguard_hanging_scans_total", {"outcome": "ok"})
    p.wait_for(lambda: p.metric("txnguard_hanging_scans_total", {"outcome": "ok"}) >= scans + 2,
               timeout=30, what="two more scans")
    # One audit record for it, however many scans saw it.
    ours = [r for r in map(json.loads, audit.read_text().splitlines())
            if r["kind"] == "hanging" and r["topic"] == topic]
    assert [(r["producer_id"], r["start_offset"], r["reason"]) for r in ours] == \
        [(hung.producer_id, hung.start_offset, "partition_not_in_transaction")]

    # Aborted (by the command, through the proxy), the partition's series goes away.
    done = txnguard("hanging", "--bootstrap", p.bootstrap, "--topic", topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30
    assert p.proxy is not None
    while p.proxy.metrics.registry.get_sample_value("txnguard_hanging_transactions", labels) is not None:
        assert time.monotonic() < deadline, "the gauge outlived the abort"
        time.sleep(0.1)


def test_parity_on_three_brokers(
    kafka_pool: ClusterPool, unique_name: NameFactory, start_proxy: Callable[..., ProxyThread],
) -> None:
    # Leaders and coordinators spread over three brokers: DescribeProducers goes to three leaders (or to
    # one broker with --broker-id, followers included) and ListTransactions to every broker.
    cluster = kafka_pool.get("3.5.2", 3)
    bootstrap = cluster.live_bootstrap()
    topic = fresh_topic(cluster, unique_name("hang3"), partitions=3)
    assert len({cluster.leader(topic, p) for p in range(3)}) > 1
    hung = [make_open_transaction(bootstrap, topic, unique_name("tid"), partition=p) for p in (0, 2)]
    listed = make_open_transaction(bootstrap, topic, unique_name("tid"), partition=1, added=True)

    kafka_rows = clients.transactions_find_hanging(bootstrap, topic=topic)
    assert {(r.partition, r.producer_id) for r in kafka_rows} == {(0, hung[0].producer_id), (2, hung[1].producer_id)}
    assert listed.producer_id not in {r.producer_id for r in kafka_rows}
    assert same(tool_table("--bootstrap", bootstrap, "--topic", topic)) == same(kafka_rows)
    proxy = start_proxy(upstream=bootstrap, mode="gateway")
    assert same(tool_table("--bootstrap", proxy.bootstrap, "--topic", topic)) == same(kafka_rows)
    follower = next(n.id for n in cluster.nodes if n.id != cluster.leader(topic, 0))
    ours = [r for r in tool_table("--bootstrap", bootstrap, "--broker-id", str(follower)) if r.topic == topic]
    theirs = [r for r in clients.transactions_find_hanging(bootstrap, broker_id=follower) if r.topic == topic]
    assert same(ours) == same(theirs)


def _idle_still_open(bootstrap: str, topic: str, txn_id: str, idle: Made, partition: int) -> bool:
    """The control holds: its coordinator lists its partition in an ongoing transaction and the leader shows it
    open at its start offset (a healthy transaction, idle on the partition)."""
    _, host, port = raw.coordinator_for(bootstrap, txn_id)
    with raw.RawClient(host, port) as coordinator:
        (desc,) = coordinator.describe_transactions(txn_id).transaction_states
    listed = desc.transaction_state == "Ongoing" and any(
        t.topic == topic and partition in t.partitions for t in desc.topics)
    _, host, port = raw.leader_of(bootstrap, topic, partition)
    with raw.RawClient(host, port) as leader:
        (states,) = leader.describe_producers(topic, [partition]).topics[0].partitions
    return listed and any((int(p.producer_id), int(p.current_txn_start_offset)) == (idle.producer_id, idle.start_offset)
                          for p in states.active_producers)


# The own-timeout test's transactions: two hanging (15 s and 5 s timeouts) and a healthy one left idle (60 s, the
# harness's transaction.max.timeout.ms). Its coordinators look for timed-out transactions every second
# (transaction.abort.timed.out.transaction.cleanup.interval.ms=1000), so a 2 s margin is enough there.
HUNG_TIMEOUT_MS, SHORT_TIMEOUT_MS, IDLE_TIMEOUT_MS = 15_000, 5_000, 60_000
MARGIN_MS = 2_000
# How long past the last threshold the wait may run: a scan every second and a command run every few seconds
# report within a few seconds on an idle machine; the rest is room for a loaded one. Never the claim itself.
SLACK = datetime.timedelta(seconds=60)


def test_a_hanging_transaction_is_reported_after_its_own_timeout_not_15_minutes(
    kafka_pool: ClusterPool, unique_name: NameFactory, start_proxy: Callable[..., ProxyThread], tmp_path: Path,
) -> None:
    # The claim: made stamped now, hanging transactions with 15 s (p0) and 5 s (p1) timeouts are reported by the
    # proxy's scan (every second, default rule) and by `txnguard hanging` with default flags once older than their
    # own timeout plus the margin, and not before (each finding's age is past its threshold). The control: a
    # healthy transaction (p2, its partition added, 60 s timeout) left idle for longer than p1's threshold is
    # never reported, and is checked to be still open when p1 has been reported by both. The wait is bounded
    # from the transactions' own timestamps: the last threshold (p0's) plus SLACK. (A transaction held in
    # PrepareCommit/PrepareAbort is covered by the unit tests with the coordinator's answer: a real broker writes
    # its markers at once, and a frozen leader cannot be described.)
    cluster = kafka_pool.get("3.5.2", 1)
    bootstrap = cluster.bootstrap_servers
    topic = fresh_topic(cluster, unique_name("own"), partitions=3)
    audit = tmp_path / "audit.jsonl"
    p = start_proxy(upstream=bootstrap, mode="gateway", audit_path=str(audit),
                    health={"hanging_scan_interval_s": 1, "hanging_timeout_margin_s": MARGIN_MS / 1000})
    now = datetime.timedelta(0)
    hung = make_open_transaction(bootstrap, topic, unique_name("tid"), partition=0, timeout_ms=HUNG_TIMEOUT_MS,
                                 backdate=now)
    short = make_open_transaction(bootstrap, topic, unique_name("tid"), partition=1, timeout_ms=SHORT_TIMEOUT_MS,
                                  backdate=now)
    idle_id = unique_name("tid")
    idle = make_open_transaction(bootstrap, topic, idle_id, partition=2, added=True, timeout_ms=IDLE_TIMEOUT_MS,
                                 backdate=now)
    expected = {0: (hung.producer_id, hung.start_offset), 1: (short.producer_id, short.start_offset)}
    deadline = hung.stamp + datetime.timedelta(milliseconds=HUNG_TIMEOUT_MS + MARGIN_MS) + SLACK

    def age_s(made: Made) -> float:
        return (datetime.datetime.now(datetime.UTC) - made.stamp).total_seconds()

    seen: dict[tuple[str, int], float] = {}          # (reporter, partition) -> age of its transaction, seconds
    findings: dict[int, dict[str, Any]] = {}
    idle_s_at_short: float | None = None
    runs = 0
    made = {0: hung, 1: short}
    while len(seen) < 4:
        assert datetime.datetime.now(datetime.UTC) < deadline, f"not all reported by the deadline: {seen}"
        if {("command", 0), ("command", 1)} - seen.keys():
            run = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--json",
                           "--timeout-margin", str(MARGIN_MS / 1000))
            assert run.returncode == 0, run.stderr
            runs += 1
            for f in json.loads(run.stdout)["findings"]:
                assert expected.get(f["partition"]) == (f["producer_id"], f["start_offset"]), f  # never the idle one
                seen.setdefault(("command", f["partition"]), age_s(made[f["partition"]]))
                findings.setdefault(f["partition"], f)
        for partition in (0, 1):
            if p.metric("txnguard_hanging_transactions", {"topic": topic, "partition": str(partition)}) == 1:
                seen.setdefault(("scan", partition), age_s(made[partition]))
        assert p.metric("txnguard_hanging_transactions", {"topic": topic, "partition": "2"}) == 0
        if idle_s_at_short is None and {("command", 1), ("scan", 1)} <= seen.keys():
            # Both have reported the 5 s one: the control has been idle longer than its threshold, and is healthy.
            idle_s_at_short = age_s(idle)
            assert idle_s_at_short > (SHORT_TIMEOUT_MS + MARGIN_MS) / 1000
            assert _idle_still_open(bootstrap, topic, idle_id, idle, 2)
        time.sleep(1)
    when = ", ".join(f"{r} p{q}: {t:.1f}" for (r, q), t in sorted(seen.items()))
    print(f"\nreported at (age of the transaction, s): {when} ({runs} runs of txnguard hanging); the idle transaction "
          f"({IDLE_TIMEOUT_MS // 1000} s timeout) was idle {idle_s_at_short:.1f} s when the 5 s one had been reported "
          "by both, still open, and was never reported")

    # Each reported for the reason the rule names, past the threshold it names: its own timeout plus the margin.
    for partition, timeout in ((0, HUNG_TIMEOUT_MS), (1, SHORT_TIMEOUT_MS)):
        f = findings[partition]
        assert (f["reason"], f["coordinator_state"]) == ("partition_not_in_transaction", "Empty")
        assert (f["transaction_timeout_ms"], f["threshold_ms"]) == (timeout, timeout + MARGIN_MS)
        assert f["age_ms"] > timeout + MARGIN_MS
    # The scan wrote one audit record per hanging transaction and none for the idle one (one per new finding:
    # none means never).
    records = [r for r in map(json.loads, audit.read_text().splitlines())
               if r["kind"] == "hanging" and r["topic"] == topic]
    assert sorted((r["partition"], r["producer_id"], r["start_offset"], r["max_transaction_timeout_ms"])
                  for r in records) == [(0, *expected[0], HUNG_TIMEOUT_MS + MARGIN_MS),
                                        (1, *expected[1], SHORT_TIMEOUT_MS + MARGIN_MS)]
    # Leave the session's cluster clean: abort both (the idle one ends by its own timeout).
    done = txnguard("hanging", "--bootstrap", bootstrap, "--topic", topic, "--abort", "--yes")
    assert done.returncode == 0, done.stderr

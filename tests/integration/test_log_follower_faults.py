"""The follower of the coordinator's log under faults, with the S6 copier running through the proxies (issue 31,
item 8): the leadership of the copier's `__transaction_state` partition moves, or its leader (the copier's
transaction coordinator) is SIGKILLed and restarted.

    Java 3.5.2 TransactionalMessageCopier ──▶ sidecar 1, 2, 3 (in this process) ──▶ Kafka 3.5.2 KRaft, 3 brokers
                                              (__transaction_state: 3 partitions, RF 3)
    every sidecar's follower ─Fetch __transaction_state─▶ each partition's leader (its own broker directly, the
                                                         others through their sidecars)
    copier ─Produce, TxnOffsetCommit─▶ a leader's sidecar: a sidecar never reuses its own evidence, so the
                                        coordinator's log, as its follower read it, passes them (evidence "log")
    ══ once the output holds ~30 % of the copy, the copier's __transaction_state partition P: ══
       move:    AlterPartitionReassignments (another replica first), ElectLeaders PREFERRED; no broker stops
       sigkill: its leader SIGKILLed, started again 3 s later
    follower ─Fetch P─▶ old leader: NOT_LEADER_OR_FOLLOWER (or a reset) ─▶ Metadata again ─▶ Fetch P ─▶ new leader
    copier ─▶ NOT_COORDINATOR ─FindCoordinator─▶ the new coordinator (which loaded P), and copies on
    afterwards: the output at read_committed == the input, in order (no loss, no duplicate), its last stable offset
                == its high watermark (nothing hanging), the offsets committed to the end; no write refused on the
                log, none refused but retriably; every follower reads P from its new leader, lag 0, no problem
    printed: how long after the fault each follower read P from its new leader to its end (lag 0)

The proxy's own restart (it reads the log again): test_proxy_bounce.py. Bounded: one copy of 3,000 records,
whole test about a minute on two cores (the cluster, of its own kind, starts once for both cells).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from txnguard.codecs.groups import coordinator_partition_for
from txnguard.codecs.transaction_log import TOPIC
from txnguard.proxy.config import HostPort
from txnguard.proxy.log_follower import LogFollower
from txnguard.testing import clients, raw
from txnguard.testing.bounce import high_watermark
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.kafka import Cluster
from txnguard.testing.proxy import ProxyThread, direct_bootstrap

pytestmark = [pytest.mark.integration, pytest.mark.java]

NameFactory = Callable[[str], str]
StartProxy = Callable[..., ProxyThread]

PARTITIONS = 3  # of __transaction_state: the copier's partition is known, each broker leads about one
RECORDS = 3000
TRANSACTION_SIZE = 50  # 60 transactions: the log keeps moving after the fault
FAULT_AT = 0.3
DOWN_S = 3.0
COPY_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(kafka_pool: ClusterPool) -> Cluster:
    return kafka_pool.get("3.5.2", 3, {"transaction.state.log.num.partitions": str(PARTITIONS)}, sidecars=True)


@pytest.fixture
def restarts_killed_nodes(cluster: Cluster) -> object:
    """Whatever happens, the shared cluster gets every node back."""
    yield
    for n in cluster.nodes:
        cluster.start_node(n.id)  # a no-op for a node that runs
    cluster.wait_ready()


def follower(proxy: ProxyThread) -> LogFollower:
    assert proxy.proxy is not None and proxy.proxy.guard.follower is not None
    return proxy.proxy.guard.follower


def node_of(cluster: Cluster, address: HostPort | None) -> int | None:
    """The broker behind an address a follower reads from (its own broker's, or another's sidecar)."""
    if address is None:
        return None
    real = cluster.real_address(address.host, address.port)
    return next((n.id for n in cluster.nodes if (n.host, n.port) == real), None)


def reads_from(cluster: Cluster, proxy: ProxyThread, partition: int, leader: int) -> bool:
    """The follower reads `partition` from `leader`, to its end (lag 0 in its metric), and has no problem."""
    f = follower(proxy)
    return (node_of(cluster, f.leaders.get(partition)) == leader and f.partition_usable(partition)
            and f.problem is None and proxy.metric("txnguard_transaction_log_lag_records") == 0)


def log_end(cluster: Cluster, partition: int) -> int | None:
    """`__transaction_state`-P's high watermark at its leader, asked of the broker itself (None: not answered)."""
    try:
        _, host, port = raw.leader_of(cluster.live_bootstrap(), TOPIC, partition)
        with raw.RawClient(*cluster.real_address(host, port)) as c:
            return c.list_offsets(TOPIC, partition, read_committed=False)
    except (OSError, raw.RawProtocolError):
        return None


def follower_state(cluster: Cluster, proxy: ProxyThread, partition: int) -> dict[str, object]:
    """What a follower knows of `partition`, beside the log's end at its leader (for a failure's message)."""
    f = follower(proxy)
    address = f.leaders.get(partition)
    session = f._sessions.get(address) if address is not None else None
    return {"leader": address, "node": node_of(cluster, address), "position": f.view.positions.get(partition),
            "high_watermark": f.high_watermarks.get(partition), "behind": partition in f._behind,
            "session": None if session is None else (session.id, session.epoch, session._held.get(partition)),
            "log_end": log_end(cluster, partition),
            "fetches": proxy.metric("txnguard_transaction_log_fetches_total"), "problem": f.problem,
            "idle": f._idle()}


def wait_view_complete(cluster: Cluster, proxy: ProxyThread, partition: int, txn_id: str,
                       timeout_s: float = 30.0) -> None:
    """The follower's view comes to hold the copier's last transaction committed (its records read, not only
    "lag 0"). Waited for, not read once: a follower no write has asked for idle_after_s is idle and reads to
    the end every idle_read_s, and its lag is counted against the watermark of its last read (the gate saw a
    view one idle read behind, lag 0, after the copy ended on local evidence)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = follower(proxy).view.describe(txn_id)
        if state is not None and state.state == "CompleteCommit":
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the follower's view after {timeout_s:.0f}s: {state}; what it knows of "
                        f"{TOPIC}-{partition}: {follower_state(cluster, proxy, partition)}")
        time.sleep(0.05)


def leader_now(cluster: Cluster, partition: int) -> int | None:
    """P's leader as a running broker names it (None while none answers: one may be starting)."""
    for n in cluster.nodes:
        try:
            return raw.leader_of(f"{n.host}:{n.broker_port or n.port}", TOPIC, partition, deadline_s=1)[0]
        except (OSError, raw.RawProtocolError):
            continue
    return None


def summed(proxies: list[ProxyThread], metric: str, **labels: str) -> float:
    """A counter summed over its series (every label not given) and over the proxies."""
    total = 0.0
    for proxy in proxies:
        assert proxy.proxy is not None
        total += sum(s.value for m in proxy.proxy.metrics.registry.collect() if m.name == metric.removesuffix("_total")
                     for s in m.samples if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()))
    return total


@dataclass
class Fault:
    kind: str
    partition: int
    old_leader: int
    new_leader: int = -1
    at_output: int = 0
    started_s: float = 0.0   # from the start of the copy
    moved_s: float = 0.0     # how long the move (or kill, wait, restart) took
    led_s: float | None = None  # from the fault until Metadata named P's new leader
    recovered_s: dict[int, float] | None = None  # sidecar's broker -> from the fault to reading P from its new leader


@pytest.mark.parametrize("kind", ["move", "sigkill"])
@pytest.mark.usefixtures("restarts_killed_nodes")
def test_s6_copier_exact_while_the_coordinators_log_partition_changes_leader(
    cluster: Cluster, start_proxy: StartProxy, unique_name: NameFactory, kind: str,
) -> None:
    direct = direct_bootstrap(cluster)
    source = fresh_topic(cluster, unique_name("in"), replication_factor=3)
    sink = fresh_topic(cluster, unique_name("out"), replication_factor=3)
    group = unique_name("group")
    # The copier's coordinator leads neither the output nor the input where it can (the fault hits the coordinator
    # alone), else not the output (after a move one broker leads two of the log's three partitions, another none).
    log_leaders = {q: raw.leader_of(direct, TOPIC, q)[0] for q in range(PARTITIONS)}
    data = (cluster.leader(source, 0), cluster.leader(sink, 0))
    p = min(log_leaders, key=lambda q: (log_leaders[q] == data[1], log_leaders[q] == data[0]))
    txn_id = next(t for t in (f"{unique_name('tid')}-{i}" for i in range(1000)) if coordinator_partition_for(
        t, PARTITIONS) == p)
    fault = Fault(kind, p, raw.leader_of(direct, TOPIC, p)[0])
    assert fault.old_leader == cluster.transaction_coordinator(txn_id)
    values = [f"{source}-{i:05d}".encode() for i in range(RECORDS)]
    clients.ConfluentKafkaClient().produce(direct, source, values, partition=0)
    sidecars = {n.id: start_proxy(mode="sidecar", upstream=f"{n.host}:{n.port}", listen=f"{n.host}:{n.sidecar_port}")
                for n in cluster.nodes}
    proxies = list(sidecars.values())
    for s in proxies:
        s.wait_for(lambda s=s: s.metric("txnguard_ready") == 1, 30, "ready")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # copier ─▶ sidecars ─▶ brokers, 50 records a transaction, the offsets in each
        copier = pool.submit(clients.java_transactional_copier, cluster.sidecar_bootstrap, source, sink, txn_id,
                             group, RECORDS, "3.5.2", transaction_size=TRANSACTION_SIZE, timeout_s=COPY_TIMEOUT_S)
        deadline = time.monotonic() + COPY_TIMEOUT_S
        while high_watermark(cluster, sink) < FAULT_AT * RECORDS:
            assert not copier.done(), f"the copy ended before the fault: {copier.result()}"
            assert time.monotonic() < deadline, "no progress towards the fault"
            time.sleep(0.05)
        for s in proxies:
            s.wait_for(lambda s=s: reads_from(cluster, s, p, fault.old_leader), 10, f"the follower on {TOPIC}-{p}")
        log_passes_before = summed(proxies, "txnguard_verifications_total", evidence="log", outcome="pass")
        read_before = summed(proxies, "txnguard_transaction_log_records_total", outcome="state")
        fault.at_output, fault.started_s = high_watermark(cluster, sink), time.monotonic() - started
        hit = time.monotonic()
        if kind == "move":
            # ══ P's leadership moves to another replica; every broker stays up ══
            fault.new_leader = next(n.id for n in cluster.nodes if n.id != fault.old_leader)
            assert raw.move_leader(direct, TOPIC, p, fault.new_leader) == fault.old_leader
        else:
            # ══ P's leader, the copier's coordinator, SIGKILLed; started again DOWN_S later (main thread: the
            # node dies with the thread that started it) ══
            cluster.kill_node(fault.old_leader)
            time.sleep(DOWN_S)
            cluster.start_node(fault.old_leader)
        fault.moved_s = time.monotonic() - hit
        if kind == "move":
            fault.led_s = fault.moved_s  # move_leader returned once Metadata named the new leader
        # each follower ─Fetch P─▶ the new leader, to its end: lag 0
        recovered: dict[int, float] = {}
        while len(recovered) < len(sidecars):
            leader = leader_now(cluster, p)  # the restarted broker may lead again (a new incarnation)
            if fault.led_s is None and leader is not None and leader != fault.old_leader:
                fault.led_s = time.monotonic() - hit
            for node, s in sidecars.items():
                if node not in recovered and leader is not None and reads_from(cluster, s, p, leader):
                    recovered[node] = time.monotonic() - hit
                    fault.new_leader = leader
            where = {n: (node_of(cluster, follower(s).leaders.get(p)), follower(s).problem)
                     for n, s in sidecars.items()}
            assert time.monotonic() - hit < RECOVERY_TIMEOUT_S, \
                f"followers not on {TOPIC}-{p}'s leader {leader} within {RECOVERY_TIMEOUT_S:.0f}s: {where}"
            time.sleep(0.01)
        fault.recovered_s = recovered
        result = copier.result(COPY_TIMEOUT_S + 30)
    seconds = time.monotonic() - started
    if kind == "sigkill":
        cluster.wait_ready()

    # The copy is exact: every input record once in the output, in order, nothing left open.
    assert result.shutdown_complete and (result.total_processed, result.remaining) == (RECORDS, 0), result
    ends = clients.stable_end_offsets(direct, sink, timeout_s=60)  # last stable offset == high watermark
    reader = clients.ConfluentKafkaClient()
    out = reader.consume_committed(direct, sink, timeout_s=60)
    lost, duplicated = len(set(values) - set(out)), len(out) - len(set(out))
    assert (lost, duplicated) == (0, 0) and out == values, (lost, duplicated)
    assert reader.committed_offsets(direct, group, source) == {0: RECORDS}
    # No false refusal: nothing refused on the log; whatever was refused, the client retries (the coordinator
    # moving or down), and the copy shows it was retried.
    failures = {r: summed(proxies, "txnguard_verification_failures_total", reason=r)
                for r in ("not_in_transaction", "late_write", "coordinator_unavailable", "producer_fenced",
                          "producer_id_mapping", "invalid_record")}
    log_rejected = summed(proxies, "txnguard_verifications_total", evidence="log", decision="rejected")
    assert log_rejected == 0
    assert {r: n for r, n in failures.items() if r != "coordinator_unavailable" and n} == {}, failures
    # The follower's part: it kept passing writes on the log after the fault (the log really was the evidence),
    # read on from the new leader, and every follower is on P's leader with lag 0, no problem left.
    log_passes_after = summed(proxies, "txnguard_verifications_total", evidence="log", outcome="pass") \
        - log_passes_before
    read_after = summed(proxies, "txnguard_transaction_log_records_total", outcome="state") - read_before
    assert log_passes_after > 0 and read_after > 0
    leader = raw.leader_of(direct, TOPIC, p)[0]
    for s in proxies:
        s.wait_for(lambda s=s: reads_from(cluster, s, p, leader), 30, f"the follower on {TOPIC}-{p}'s leader")
        wait_view_complete(cluster, s, p, txn_id)
    print(f"\n{kind}: {TOPIC}-{p} (the copier's coordinator) broker {fault.old_leader} -> {fault.new_leader} "
          f"at {fault.started_s:.1f}s into the copy (output at {fault.at_output}), "
          f"the fault took {fault.moved_s:.2f}s, Metadata named the new leader after {fault.led_s or 0:.2f}s; "
          f"followers at lag 0 on the new leader after (s from the fault, by sidecar) "
          f"{ {n: round(t, 2) for n, t in sorted(recovered.items())} }, after the new leader was named "
          f"{ {n: round(t - (fault.led_s or 0), 2) for n, t in sorted(recovered.items())} }; copy {seconds:.1f}s, "
          f"{RECORDS} records: {lost} lost, {duplicated} duplicated, output ends {ends}; writes passed on the log "
          f"{log_passes_before:.0f} before, {log_passes_after:.0f} after; log records read after {read_after:.0f}; "
          f"refused {failures}, on the log {log_rejected:.0f}")

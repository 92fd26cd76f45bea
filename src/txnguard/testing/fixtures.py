"""pytest fixtures over the Kafka harness: one cluster per (version, nodes) per test session.

Clusters are expensive (5-20 s each), so a session shares them and every test
takes a fresh topic and fresh transactional ids instead. A test that kills or
stops a node restarts it before it returns (see `Cluster.restart_node`), or asks
for a private cluster with `kafka_factory`.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txnguard.testing import kafka, raw

_counter = itertools.count()


class ClusterPool:
    """Clusters shared by the session, at most `max_alive` running at once (least recently used stops).

    Each node is a JVM with a 512 MiB heap; a dozen idle ones already load two cores. Test files
    use one or two clusters each, so evicting the least recently used one costs little.
    """

    def __init__(self, root: Path, max_alive: int | None = None) -> None:
        self.root = root
        self.max_alive = max_alive or int(os.environ.get("TXNGUARD_MAX_CLUSTERS", "3"))
        self._clusters: OrderedDict[tuple[str, int, bool, tuple[tuple[str, str], ...]], kafka.Cluster] = \
            OrderedDict()

    def get(self, version: str, nodes: int = 1, config: dict[str, str] | None = None,
            sidecars: bool = False, scram_users: dict[str, str] | None = None, acls: bool = False,
            zookeeper: bool = False) -> kafka.Cluster:
        # SCRAM users, ACLs and ZooKeeper mode make a cluster of its own kind: the key holds them (users
        # sorted, in the config part).
        key = (version, nodes, sidecars, tuple(sorted({**(config or {}), **{
            f"scram-user:{u}": pw for u, pw in (scram_users or {}).items()}, **({"acls": "on"} if acls else {}),
            **({"mode": "zookeeper"} if zookeeper else {})}.items())))
        cluster = self._clusters.get(key)
        if cluster is None:
            while len(self._clusters) >= self.max_alive:
                _, oldest = self._clusters.popitem(last=False)
                oldest.down(grace_s=0)  # never used again: its data goes with the session's folder
            directory = self.root / (f"kafka-{version}-{nodes}n{'-zk' if zookeeper else ''}"
                                     f"{'-sidecar' if sidecars else ''}-{next(_counter)}")
            cluster = kafka.up(version, nodes, directory, config, sidecars=sidecars, die_with_parent=True,
                               scram_users=scram_users, acls=acls, zookeeper=zookeeper, quick_jit=True)
            self._clusters[key] = cluster
        else:
            # A test may have stopped a node and failed before restarting it.
            cluster.start_zookeeper()
            for n in cluster.nodes:
                if not kafka._alive(n.pid):
                    cluster.start_node(n.id)
            cluster.wait_ready()
            self._clusters.move_to_end(key)
        return cluster

    def close(self) -> None:
        for cluster in self._clusters.values():
            cluster.down()


# The brokers' and ZooKeeper's own logs, kept when a test of the session failed (their data is not).
BROKER_LOGS = ("server.log", "zookeeper.log")
# Lines of each kept log that `keep_broker_logs` prints: the last errors and warnings, for a report that outlives the
# run's folder (a CI's clean clone).
PRINTED_LINES = 15


def keep_broker_logs(root: Path, into: Path) -> list[Path]:
    """Copy the broker and ZooKeeper logs under `root` (one folder per cluster, one per node) to `into`, keeping
    their paths below `root`; the copies. A failure that happened once in many runs (a coordinator that answered
    CONCURRENT_TRANSACTIONS for two minutes after a leader move) cannot be diagnosed once the session's temporary
    folder is gone."""
    kept = []
    for log in sorted(p for name in BROKER_LOGS for p in root.rglob(name)):
        target = into / log.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, target)
        kept.append(target)
    return kept


def last_problems(log: Path, lines: int = PRINTED_LINES) -> list[str]:
    """The last `lines` ERROR and WARN lines of a broker log."""
    found: list[str] = []
    with log.open(errors="replace") as f:
        for line in f:
            if " ERROR " in line or " WARN " in line:
                found.append(line.rstrip()[:300])
                del found[:-lines]
    return found


def failed_logs_root() -> Path:
    return Path(os.environ.get("TXNGUARD_FAILED_LOGS", ".run/failed-test-logs"))


def report_kept_logs(since: float, say: Callable[[str], None]) -> None:
    """Name the broker logs kept since `since` (a time.time()) and print their last errors and warnings: from the
    pytest session that runs the workers (xdist shows none of a worker's teardown output)."""
    root = failed_logs_root()
    if not root.is_dir():
        return
    for run in sorted(d for d in root.iterdir() if d.is_dir() and d.stat().st_mtime >= since):
        logs = sorted(p for name in BROKER_LOGS for p in run.rglob(name))
        say(f"broker logs of a session with failed tests, kept in {run.resolve()}: {len(logs)}")
        for log in logs:
            problems = last_problems(log)
            if problems:
                say(f"-- {log.relative_to(run)}: its last errors and warnings")
                for line in problems:
                    say(line)


@pytest.fixture(scope="session")
def kafka_pool(request: pytest.FixtureRequest) -> Iterator[ClusterPool]:
    keep = os.environ.get("TXNGUARD_TEST_DIR")
    root = Path(keep or tempfile.mkdtemp(prefix="txnguard-kafka-"))
    pool = ClusterPool(root)
    try:
        yield pool
    finally:
        pool.close()
        if request.session.testsfailed and not keep:
            into = failed_logs_root() / root.name
            keep_broker_logs(root, into)  # the controller's summary names them (`report_kept_logs`)
        if not keep:  # a named directory is kept for post-mortems; a temporary one is not
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("topic")` -> a name no other test (or rerun) uses."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:60]

    def make(kind: str) -> str:
        return f"{kind}-{base}-{uuid.uuid4().hex[:8]}"

    return make


def fresh_topic(cluster: kafka.Cluster, name: str, partitions: int = 1, replication_factor: int = -1,
                configs: dict[str, str] | None = None) -> str:
    raw.create_topic(cluster.live_bootstrap(), name, partitions, replication_factor, configs)
    return name

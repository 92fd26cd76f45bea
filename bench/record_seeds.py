"""Record real Kafka frames from real clients: the seed corpus of the structure-aware fuzzer.

    .venv/bin/python bench/record_seeds.py                     # Kafka 3.5.2 and 3.9.2, ~3-5 minutes
    .venv/bin/python bench/record_seeds.py --versions 3.5.2 --out /tmp/frames

Layout per Kafka version: a 1-node cluster whose broker advertises a "sidecar" port
(`kafka.up(sidecars=True)`); a recording relay listens there and forwards to the
broker, so every connection a client (or the proxy's own verification client) opens
after bootstrap passes through it, and the relay sees both directions. Requests
carry (api key, version, correlation id); responses are matched by correlation id.

Each Python client family (kafka-python, confluent-kafka, aiokafka) runs twice:
straight to the relay (its own ApiVersions choices), and through a txnguard gateway
whose upstream is the relay (the proxy's capped versions, plus its own
DescribeTransactions / DescribeProducers / AddPartitionsToTxn v4 VerifyOnly).

A raw client adds what real clients never make a gateway do: a transaction
begun behind the proxy's back, so that its Produce makes the proxy ask the
partition leader and the coordinator.

Only the APIs the proxy decodes are kept, at most a few small frames per
(api key, version, direction, shape). Output: `<out>/corpus.json`, one entry per
frame (api key, version, direction, Kafka version, client, the frame in hex
*without* its 4-byte length prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.header import peek_request, produce_acks_and_txn_id_null
from txnguard.codecs.schemas import api_name
from txnguard.testing import fuzz, kafka
from txnguard.testing.clients import PYTHON_CLIENTS
from txnguard.testing.proxy import ProxyThread
from txnguard.testing.raw import ProducerIdentity, RawClient, build_batch, coordinator_for, create_topic

# Every API key whose request or response some part of the proxy decodes (codecs/ and proxy/).
DECODED_KEYS = frozenset({
    ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.API_VERSIONS,
    ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN,
    ApiKey.TXN_OFFSET_COMMIT, ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_PRODUCERS, ApiKey.DESCRIBE_TRANSACTIONS,
})
PER_SHAPE = 3  # frames kept per (key, version, direction, shape)
MAX_FRAME = 24 * 1024  # larger frames add bytes, not structure
CORPUS_FILE = "corpus.json"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "frames"


@dataclass
class Seed:
    api_key: int
    api_version: int
    direction: str  # "request" | "response"
    shape: str  # a sub-kind worth keeping apart (transactional Produce, batched FindCoordinator, ...)
    kafka: str
    via: str  # "direct" (client -> broker) or "proxy" (client -> txnguard -> broker)
    client: str  # the adapter that was running (the proxy's own requests happen while one runs)
    client_id: str  # the request header's client id: who really sent it (txnguard's own, rdkafka, ...)
    frame: bytes

    @property
    def name(self) -> str:
        digest = hashlib.sha1(self.frame).hexdigest()[:10]
        return f"{self.direction[:3]}-{self.api_key:02d}-{api_name(self.api_key)}-v{self.api_version}-{digest}"


@dataclass
class Corpus:
    kafka: str = ""
    via: str = ""
    client: str = ""
    seeds: dict[str, Seed] = field(default_factory=dict)
    counts: dict[tuple[int, int, str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, api_key: int, api_version: int, direction: str, frame: bytes, client_id: str) -> None:
        if api_key not in DECODED_KEYS or len(frame) > MAX_FRAME:
            return
        if not _follows_schema(api_key, api_version, direction, frame):
            return
        shape = _shape(api_key, api_version, direction, frame)
        key = (api_key, api_version, direction, shape)
        with self.lock:
            if self.counts.get(key, 0) >= PER_SHAPE:
                return
            seed = Seed(api_key, api_version, direction, shape, self.kafka, self.via, self.client, client_id, frame)
            if seed.name in self.seeds:
                return
            self.seeds[seed.name] = seed
            self.counts[key] = self.counts.get(key, 0) + 1


def _follows_schema(api_key: int, api_version: int, direction: str, frame: bytes) -> bool:
    """False for a frame its own schema cannot walk, such as the v0-shaped ApiVersions answer to a newer request."""
    try:
        fuzz.structure(fuzz.Seed("", api_key, api_version, direction, frame))
    except (fuzz.SeedParseError, ValueError):
        return False
    return True


def _shape(api_key: int, api_version: int, direction: str, frame: bytes) -> str:
    """Kinds that the proxy treats differently and so must each have seeds."""
    if direction == "request" and api_key == ApiKey.PRODUCE:
        with contextlib.suppress(Exception):
            acks, txn_null = produce_acks_and_txn_id_null(frame, peek_request(frame))
            return f"{'plain' if txn_null else 'transactional'}-acks{acks}"
    if api_key == ApiKey.FIND_COORDINATOR:
        return "batched" if api_version >= 4 else "single"
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN and direction == "request":
        return "verify_only" if api_version >= 4 else "client"
    return ""


class RecordingRelay:
    """Forward sidecar port -> broker port for every node, offering each whole frame to the corpus."""

    def __init__(self, cluster: kafka.Cluster, corpus: Corpus) -> None:
        self.cluster, self.corpus = cluster, corpus
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.base_events.Server] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="relay", daemon=True)

    def start(self) -> RecordingRelay:
        self.thread.start()
        for n in self.cluster.nodes:
            assert n.sidecar_port is not None
            server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(self._make_handler(n.host, n.port), n.host, n.sidecar_port), self.loop,
            ).result(10)
            self.servers.append(server)
        return self

    def stop(self) -> None:
        for s in self.servers:
            self.loop.call_soon_threadsafe(s.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _make_handler(self, host: str, port: int) -> Any:
        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            try:
                broker_r, broker_w = await asyncio.open_connection(host, port)
            except OSError:
                client_w.close()
                return
            inflight: dict[int, tuple[int, int, str]] = {}
            await asyncio.gather(self._pump(client_r, broker_w, inflight, True),
                                 self._pump(broker_r, client_w, inflight, False), return_exceptions=True)

        return handle

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, inflight: dict[int, tuple[int, int, str]],
                    requests: bool) -> None:
        try:
            while True:
                prefix = await r.readexactly(4)
                body = await r.readexactly(struct.unpack(">i", prefix)[0])
                self._observe(body, inflight, requests)
                w.write(prefix + body)
                await w.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                w.close()

    def _observe(self, body: bytes, inflight: dict[int, tuple[int, int, str]], requests: bool) -> None:
        if requests:
            if len(body) < 10:
                return
            api_key, api_version, correlation, n = struct.unpack_from(">hhih", body, 0)
            client_id = body[10:10 + max(n, 0)].decode("utf-8", "replace")
            inflight[correlation] = (api_key, api_version, client_id)
            self.corpus.offer(api_key, api_version, "request", body, client_id)
        elif len(body) >= 4:
            known = inflight.pop(struct.unpack_from(">i", body, 0)[0], None)
            if known is not None:
                self.corpus.offer(known[0], known[1], "response", body, known[2])


def _exercise(client_name: str, bootstrap: str, run: str) -> list[str]:
    """Every client call that reaches an API the proxy decodes; failures are reported, not fatal."""
    client = PYTHON_CLIENTS[client_name]
    topic, source, sink = f"seed-{run}", f"seed-src-{run}", f"seed-sink-{run}"
    steps: list[tuple[str, Any]] = [
        ("create_topic", lambda: client.create_topic(bootstrap, topic, 2, 1)),
        ("create_source", lambda: client.create_topic(bootstrap, source, 1, 1)),
        ("create_sink", lambda: client.create_topic(bootstrap, sink, 1, 1)),
        ("produce", lambda: client.produce(bootstrap, topic, [b"plain-1", b"plain-2"], partition=0)),
        ("produce_source", lambda: client.produce(bootstrap, source, [b"s%d" % i for i in range(6)])),
        ("commit", lambda: client.run_transaction(bootstrap, topic, f"t-{run}", [b"c1", b"c2"], True, partition=1)),
        ("abort", lambda: client.run_transaction(bootstrap, topic, f"t-{run}", [b"a1"], False, partition=0)),
        ("copy", lambda: client.copy_transactionally(bootstrap, source, sink, f"copy-{run}", f"g-{run}", 6,
                                                     batch_size=3)),
        ("consume", lambda: client.consume_committed(bootstrap, topic)),
        ("describe_cluster", lambda: client.describe_cluster(bootstrap)),
    ]
    failures = []
    for what, step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - a failed step only costs seeds; say which
            failures.append(f"{client_name} {what}: {e!r}"[:300])
    return failures


def _raw_verification(relay: str, proxy: str | None, run: str) -> list[str]:
    """A transaction begun behind the proxy's back: its Produce makes the proxy ask the leader and coordinator.

    The gateway trusts the AddPartitionsToTxn it forwarded itself, so real clients
    never make it ask; here AddPartitionsToTxn goes straight to the broker (the
    relay) and only the Produce goes through the proxy. Without a proxy, the same
    questions are asked directly, so the corpus has them either way.
    """
    topic, txn = f"seed-raw-{run}", f"raw-{run}"
    failures: list[str] = []
    try:
        create_topic(relay, topic, 1)
        with RawClient.connect(relay) as direct:
            c = coordinator_for(relay, txn)
            with RawClient(c[1], c[2]) as coordinator:
                r = coordinator.init_producer_id(txn, 60000)
                who = ProducerIdentity(int(r.producer_id), int(r.producer_epoch))
                coordinator.add_partitions_to_txn(txn, who, {topic: [0]})
                batch = build_batch([b"raw"], producer_id=who.producer_id, producer_epoch=who.producer_epoch,
                                    base_sequence=0, transactional=True)
                if proxy is None:
                    direct.produce({(topic, 0): batch}, transactional_id=txn, version=3)
                    direct.describe_producers(topic, [0])
                    coordinator.describe_transactions(txn)
                    # (AddPartitionsToTxn v4 VerifyOnly comes from the proxy's own run on 3.9.2:
                    # RawClient.verify_partitions_in_txn passes v3 fields to kio's v4 schema.)
                else:
                    with RawClient.connect(proxy) as proxied:
                        proxied.produce({(topic, 0): batch}, transactional_id=txn, version=9)
                coordinator.end_txn(txn, who, committed=True)
    except Exception as e:  # noqa: BLE001 - a failed step only costs seeds; say which
        failures.append(f"raw verification ({'proxy' if proxy else 'direct'}): {e!r}"[:300])
    return failures


def record_version(version: str, corpus: Corpus, workdir: Path) -> list[str]:
    cluster = kafka.up(version, 1, workdir / f"kafka-{version}", sidecars=True, die_with_parent=True)
    relay = RecordingRelay(cluster, corpus).start()
    failures: list[str] = []
    try:
        corpus.kafka = version
        for client_name in PYTHON_CLIENTS:
            corpus.via, corpus.client = "direct", client_name
            failures += _exercise(client_name, cluster.sidecar_bootstrap, f"d-{client_name}-{uuid.uuid4().hex[:6]}")
        corpus.client = "raw"
        failures += _raw_verification(cluster.sidecar_bootstrap, None, uuid.uuid4().hex[:6])
        # VerifyOnly exists for non-brokers from 3.6 on; 3.5 gets DescribeTransactions/DescribeProducers.
        evidence = "verify_only" if version >= "3.6" else "describe_transactions"
        with ProxyThread.from_settings(record_wire=False, upstream=cluster.sidecar_bootstrap, mode="gateway",
                                       verification={"coordinator_evidence": evidence}) as proxy:
            for client_name in PYTHON_CLIENTS:
                corpus.via, corpus.client = "proxy", client_name
                failures += _exercise(client_name, proxy.bootstrap, f"p-{client_name}-{uuid.uuid4().hex[:6]}")
            corpus.via, corpus.client = "proxy", "raw"
            failures += _raw_verification(cluster.sidecar_bootstrap, proxy.bootstrap, uuid.uuid4().hex[:6])
            time.sleep(1)  # the proxy's own verification answers may still be in flight
    finally:
        relay.stop()
        cluster.down()
    return failures


def write(corpus: Corpus, out: Path) -> None:
    """One JSON file: small in git, one read for the tests."""
    out.mkdir(parents=True, exist_ok=True)
    frames = [{"name": name, "api_key": s.api_key, "api": api_name(s.api_key), "api_version": s.api_version,
               "direction": s.direction, "shape": s.shape, "kafka": s.kafka, "via": s.via, "client": s.client,
               "client_id": s.client_id,
               "hex": s.frame.hex()}
              for name, s in sorted(corpus.seeds.items())]
    doc = {"about": "Kafka frames recorded by bench/record_seeds.py from real clients; hex is the frame "
                    "without its 4-byte length prefix. Seeds of txnguard.testing.fuzz.", "frames": frames}
    (out / CORPUS_FILE).write_text(json.dumps(doc, indent=0) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", nargs="+", default=["3.5.2", "3.9.2"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    corpus = Corpus()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="txnguard-seeds-") as tmp:
        for version in args.versions:
            failures += record_version(version, corpus, Path(tmp))
    write(corpus, args.out)
    total = sum(len(s.frame) for s in corpus.seeds.values())
    print(f"{len(corpus.seeds)} frames, {total / 1024:.1f} KiB -> {args.out}")
    for (key, version, direction, shape), n in sorted(corpus.counts.items()):
        print(f"  {direction:8} {key:3} {api_name(key):24} v{version:<3} {shape:22} {n}")
    for f in failures:
        print(f"  step failed: {f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

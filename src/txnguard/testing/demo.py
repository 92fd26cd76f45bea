"""`txnguard demo` (`make demo`): the failure txnguard prevents, on a real Kafka 3.5.2, in about a minute.

    old client ──InitProducerId──▶ coordinator
    old client ──Produce(transactional batch, partition never added)──▶ leader
        direct:          written; no marker will ever end it: the last stable offset stops there, and a
                         read_committed consumer sees none of the transactions committed after it
        through txnguard: INVALID_TXN_STATE, nothing written; the committed records flow to the consumer
    then what an operator sees: the metric (/metrics) and the audit record of the refusal; then everything
    the demo started is stopped and its temporary folder removed.

The write is the raw actor's (`scenarios.TxnActor`), which orders the requests itself: on Kafka 3.5.2 (no
KIP-890 verification in the broker) the hanging transaction happens every time, not by a race. The well-behaved
producer is the same actor doing AddPartitionsToTxn first; the victim is a real read_committed consumer
(librdkafka, confluent-kafka). Every figure printed is read from the run: the broker's offsets (ListOffsets),
the records the consumer received, the proxy's /metrics and its audit file.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kio.schema.errors import ErrorCode

from txnguard.proxy import logs
from txnguard.testing import kafka, raw
from txnguard.testing.proxy import ProxyThread
from txnguard.testing.scenarios import TxnActor, error_name, offsets

VERSION = "3.5.2"  # the newest line without KIP-890 part 1 in the broker: the failure is real here
FAILURE_METRIC = "txnguard_verification_failures_total"
AUDIT_FIELDS = ("transactional_id", "producer_id", "producer_epoch", "api", "api_version", "target", "outcome",
                "decision", "evidence", "error_name", "error_sent", "client_id", "mode")


@dataclass
class Side:
    """What one path (direct, or through txnguard) showed."""

    key: str   # direct or proxied
    name: str
    topic: str
    write_error: int = -1
    write_error_name: str = ""
    write_message: str | None = None
    write_offset: int = -1
    producer_id: int = -1
    high_watermark: int = -1
    last_stable: int = -1
    committed: int = 0
    consumed: int = 0
    consumer_end: int | None = None  # where the consumer's partition EOF said the readable data ends
    consumer_s: float = 0.0


@dataclass
class Result:
    version: str
    records: int
    direct: Side
    proxied: Side
    metric_line: str = ""
    metric_value: float = -1.0
    audit: dict[str, Any] = field(default_factory=dict)
    kafka_pids: list[int] = field(default_factory=list)
    folder: str = ""
    seconds: float = 0.0


class Demo:
    def __init__(self, out: TextIO, *, version: str = VERSION, records: int = 3, watch_s: float = 5.0,
                 temp_dir: str | None = None) -> None:
        if records < 1:
            raise ValueError("--records must be at least 1")
        self.out, self.version, self.records, self.watch_s = out, version, records, watch_s
        self.temp_dir = temp_dir
        self.tag = uuid.uuid4().hex[:6]
        self.cluster: kafka.Cluster | None = None
        self.proxy: ProxyThread | None = None

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> Result:
        started = time.monotonic()
        folder = Path(tempfile.mkdtemp(prefix="txnguard-demo-", dir=self.temp_dir))
        direct = Side("direct", "direct to Kafka", f"orders-direct-{self.tag}")
        proxied = Side("proxied", "through txnguard", f"orders-proxied-{self.tag}")
        result = Result(self.version, self.records, direct, proxied, folder=str(folder))
        self.say("txnguard demo: a transactional write outside its transaction, sent straight to Kafka and then "
                 "through txnguard.")
        self.say(f"(temporary folder {folder}; everything started here is stopped and removed at the end)")
        self.say("txnguard's own log lines appear as they happen, " + (
            "rendered for this terminal." if logs.is_terminal(self.out)
            else "one JSON object a line (this output is not a terminal)."))
        try:
            self._start(folder, result)
            self._direct(direct)
            self._proxied(proxied)
            self._operator(result, folder / "audit.jsonl")
            self._summary(result)
        finally:
            self._clean_up(folder, result)
        result.seconds = round(time.monotonic() - started, 1)
        self.say(f"Done in {result.seconds:.0f} s.")
        return result

    def _start(self, folder: Path, result: Result) -> None:
        self.say()
        self.say(f"[1/5] Starting Kafka {self.version} (one KRaft node) and txnguard in front of it")
        t = time.monotonic()
        self.cluster = kafka.up(self.version, 1, folder / "kafka", die_with_parent=True, quick_jit=True)
        result.kafka_pids = [n.pid for n in self.cluster.nodes if n.pid is not None]
        self.say(f"      Kafka {self.version} is up at {self.cluster.bootstrap_servers} in "
                 f"{time.monotonic() - t:.1f} s (pid {', '.join(map(str, result.kafka_pids))})")
        self.proxy = ProxyThread.from_settings(
            record_wire=False, log_stream=self.out, log_render="auto", upstream=self.cluster.bootstrap_servers,
            mode="gateway", admin="127.0.0.1:0", audit_path=str(folder / "audit.jsonl")).start()
        self.say(f"      txnguard (gateway) listens at {self.proxy.bootstrap}; "
                 f"metrics at {self.proxy.admin_url}/metrics")

    def _direct(self, side: Side) -> None:
        assert self.cluster is not None
        self.say()
        self.say("[2/5] Direct to Kafka: nothing checks the write")
        self._scenario(self.cluster.bootstrap_servers, side)
        stuck = side.last_stable < side.high_watermark
        self.say(f"      partition {side.topic}-0: high watermark {side.high_watermark}, last stable offset "
                 f"{side.last_stable}" + ("   <- stuck at the write nobody will end" if stuck else ""))
        self._consume(self.cluster.bootstrap_servers, side, wait_for_all=False)

    def _proxied(self, side: Side) -> None:
        assert self.proxy is not None and self.cluster is not None
        self.say()
        self.say("[3/5] The same, through txnguard")
        self._scenario(self.proxy.bootstrap, side)
        self.say(f"      partition {side.topic}-0: high watermark {side.high_watermark}, last stable offset "
                 f"{side.last_stable}")
        self._consume(self.proxy.bootstrap, side, wait_for_all=True)

    def _scenario(self, bootstrap: str, side: Side) -> None:
        """The old client's write outside its transaction, then a well-behaved producer's committed records."""
        assert self.cluster is not None
        raw.create_topic(self.cluster.bootstrap_servers, side.topic)
        old = TxnActor(bootstrap, f"demo-old-client-{side.key}-{self.tag}", client_id="demo-old-client")
        producer = old.init()
        side.producer_id = producer.producer_id
        self.say(f"      old client (transactional id {old.transactional_id}, producer id {producer.producer_id}) "
                 f"writes 1 record to {side.topic}-0, a partition it never added to its transaction")
        r = old.produce(side.topic, 0, [b"written outside its transaction"])
        side.write_error, side.write_error_name, side.write_message = r.error_code, error_name(r.error_code), \
            r.error_message
        side.write_offset = r.base_offset
        if r.error_code == ErrorCode.none:
            self.say(f"      -> the broker answered NONE (error code 0): written at offset {r.base_offset}")
        else:
            self.say(f"      -> refused: {side.write_error_name} (error code {r.error_code}): "
                     f"\"{r.error_message}\"; nothing written")
        good = TxnActor(bootstrap, f"demo-good-client-{side.key}-{self.tag}", client_id="demo-good-client")
        good.init()
        if good.add_partitions(side.topic, 0) != {0: 0}:
            raise RuntimeError(f"AddPartitionsToTxn {side.topic}-0 failed")
        values = [f"order {i + 1}".encode() for i in range(self.records)]
        w = good.produce(side.topic, 0, values)
        if w.error_code != ErrorCode.none:
            raise RuntimeError(f"the well-behaved producer's write failed: {error_name(w.error_code)}")
        end = good.end(commit=True)
        if end != ErrorCode.none:
            raise RuntimeError(f"EndTxn(commit) failed: {error_name(end)}")
        side.committed = self.records
        self.say(f"      a well-behaved producer commits {self.records} records to {side.topic}-0 "
                 f"(AddPartitionsToTxn first, then EndTxn: committed)")
        # EndTxn answers before the commit marker is appended: wait for it (the high watermark counts it).
        want = (1 if r.error_code == ErrorCode.none else 0) + self.records + 1
        deadline = time.monotonic() + 20
        while True:
            side.high_watermark, side.last_stable = offsets(self.cluster.bootstrap_servers, side.topic, 0)
            if side.high_watermark >= want or time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def _consume(self, bootstrap: str, side: Side, *, wait_for_all: bool) -> None:
        """A read_committed consumer from the beginning: all the committed records, or what `watch_s` brings."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-reader-{self.tag}",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             # librdkafka's end of partition is the last stable offset when read_committed
                             "enable.partition.eof": True, "client.id": "demo-reader"})
        t = time.monotonic()
        deadline = t + (30.0 if wait_for_all else self.watch_s)
        try:
            consumer.assign([TopicPartition(side.topic, 0, OFFSET_BEGINNING)])
            while time.monotonic() < deadline and not (wait_for_all and side.consumed >= side.committed):
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                err = msg.error()
                if err is None:
                    side.consumed += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    side.consumer_end = int(msg.offset() or 0)
                elif not err.retriable():
                    raise RuntimeError(f"consumer error: {err}")
        finally:
            consumer.close()
        side.consumer_s = time.monotonic() - t
        if wait_for_all:
            self.say(f"      read_committed consumer: {side.consumed} of the {side.committed} committed records, "
                     f"in {side.consumer_s:.1f} s")
        else:
            end = "" if side.consumer_end is None else f"; it was told the partition ends at offset {side.consumer_end}"
            stalled = ": stalled" if side.consumed < side.committed else ""
            self.say(f"      read_committed consumer: {side.consumed} of the {side.committed} committed records "
                     f"in {side.consumer_s:.1f} s{end}{stalled}")

    def _operator(self, result: Result, audit: Path) -> None:
        assert self.proxy is not None
        self.say()
        self.say("[4/5] What the operator sees")
        with urllib.request.urlopen(f"{self.proxy.admin_url}/metrics", timeout=10) as r:
            text = r.read().decode()
        lines = [line for line in text.splitlines() if line.startswith(FAILURE_METRIC + "{")]
        hit = [line for line in lines if 'reason="not_in_transaction"' in line]
        result.metric_line = hit[0] if hit else ""
        result.metric_value = float(result.metric_line.rsplit(" ", 1)[1]) if hit else -1.0
        self.say(f"      GET /metrics: {result.metric_line}")
        others = [line for line in lines if line not in hit and float(line.rsplit(" ", 1)[1]) != 0]
        self.say(f"      (the other {len(lines) - 1} reasons of {FAILURE_METRIC}: "
                 + ("all 0)" if not others else f"{'; '.join(others)})"))
        record = self._refusal(audit, result.proxied.topic)
        result.audit = record
        self.say(f"      audit record of the refusal ({audit.name}, one JSON object a line):")
        for k in AUDIT_FIELDS:
            self.say(f"        {k:>16}: {json.dumps(record.get(k))}")

    def _refusal(self, audit: Path, topic: str, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            if audit.exists():
                for line in audit.read_text().splitlines():
                    rec = json.loads(line)
                    if rec.get("kind", "decision") == "decision" and rec.get("target") == f"{topic}-0" \
                            and rec.get("decision") == "rejected":
                        return dict(rec)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no audit record of the refusal in {audit}")
            time.sleep(0.1)

    def _summary(self, result: Result) -> None:
        d, p = result.direct, result.proxied
        rows = [
            ("", d.name, p.name),
            ("write outside its transaction", _fate(d), _fate(p)),
            ("high watermark", str(d.high_watermark), str(p.high_watermark)),
            ("last stable offset", f"{d.last_stable}" + (" (stuck)" if d.last_stable < d.high_watermark else ""),
             f"{p.last_stable}" + (" (stuck)" if p.last_stable < p.high_watermark else "")),
            ("read_committed consumer got", f"{d.consumed} of {d.committed}", f"{p.consumed} of {p.committed}"),
        ]
        self.say()
        self.say("      Side by side:")
        for label, a, b in rows:
            self.say(f"      {label:<30}{a:<32}{b}")

    def _clean_up(self, folder: Path, result: Result) -> None:
        self.say()
        self.say("[5/5] Cleaning up")
        if self.proxy is not None:
            self.proxy.stop()
            self.say("      txnguard stopped")
        if self.cluster is not None:
            self.cluster.down()
            alive = [pid for pid in result.kafka_pids if kafka._alive(pid)]
            self.say(f"      Kafka stopped (pid {', '.join(map(str, result.kafka_pids))}: "
                     + ("gone)" if not alive else f"STILL RUNNING: {alive})"))
        shutil.rmtree(folder, ignore_errors=True)
        self.say(f"      {folder} " + ("removed" if not folder.exists() else "could NOT be removed"))


def _fate(side: Side) -> str:
    return f"{side.write_error_name} ({side.write_error}): " + ("written" if side.write_error == 0 else "refused")


def main(version: str = VERSION, records: int = 3, watch_s: float = 5.0, temp_dir: str | None = None,
         out: TextIO | None = None) -> int:
    """0 when the demo ran; 1 when something failed (said on stderr, after the clean-up); 130 on Ctrl-C; 2 when
    confluent-kafka (the demo's consumer, an optional dependency) is not installed, before anything starts."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("txnguard demo: needs confluent-kafka, the read_committed consumer it shows: "
              "pip install 'txnguard[demo]'", file=sys.stderr)
        return 2
    try:
        Demo(out or sys.stdout, version=version, records=records, watch_s=watch_s, temp_dir=temp_dir).run()
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, OSError, raw.RawProtocolError) as e:  # the harness's errors are RuntimeErrors
        print(f"txnguard demo: {e}", file=sys.stderr)
        return 1
    return 0

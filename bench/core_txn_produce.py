"""What does one transactional Produce with local evidence cost the proxy's CPU? The core alone, and the core
with the shell's recording (metrics, the audit record), no sockets, no event loop.

Run: `.venv/bin/python bench/core_txn_produce.py [--requests 20000] [--rounds 7] [--partitions 1] [--audit]
     [--txn-offset-commit] [--paths fast,general]`

--txn-offset-commit: a TxnOffsetCommit v3 of the group's offsets (one per partition) instead of each Produce (the
registry saw AddOffsetsToTxn answered: local evidence; the __consumer_offsets partition count is known).
--paths fast,general: each mode with the relay's fast path on (the default) and off (`Settings.fast_path`: every
frame through `receive_from_*`, a `Decided` per checked request recorded by `record`), and the ratio.

One connection core plays what a transactional producer sends once its transaction is open: a Produce v9 of
one 512-byte record per partition (the registry saw the partitions added: local evidence) and the broker's
answer, each read as the shell calls the core (`relay_from_*` first, `receive_from_*` with what it left).
Requests go in runs of 90, then their responses; each run is timed as a whole.

  core alone        the core's calls only. What the core books in its ledger for the shell (a tuple per
                    write, a window per answer) is thrown away after each run, untimed: left to pile up, its
                    tuples would make the garbage collector's passes, and so this mode, slower and slower.
  core + recording  what proxy/session.py does besides: the core books in the guard's one ledger; after a
                    read that left something in it, `guard.booked()` (which records the ledger at once past
                    its bound, else arms the guard's timer); before a call's commands `guard.flush_ledger()`
                    and the commands' own recording (`record` of a Decided); at the end of each run,
                    `guard.flush_ledger()` as the timer would within its bound (timed with the run). With
                    --audit, an audit record per partition is written to /dev/null. On a checkout without
                    batching (no `guard.booked`), the ledger is recorded after every read, as its shell did.

Runs in an event loop (the guard's timer needs one; it is let run between runs, untimed). Prints thread CPU
per request, median of rounds; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import time
from typing import Any

from core_harness import DirectCluster
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection import commands as c
from txnguard.connection.core import Connection, Settings
from txnguard.connection.relay import relay_requests, relay_responses
from txnguard.policies.policy import policy_from_config
from txnguard.proxy.config import HostPort, ProxyConfig
from txnguard.proxy.guard import SystemClock, TransactionGuard
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.testing.raw import build_batch
from txnguard.verification.inventory import ConnectionInventory

TXN, PID, EPOCH, TOPIC = "bench", 7, 0, "orders"


def _mod(cls: Any) -> Any:
    import sys
    return sys.modules[cls.__module__]


GROUP = "bench-group"


def txn_offset_commit_pair(cid: int, partitions: int) -> tuple[bytes, bytes]:
    """A TxnOffsetCommit v3 of `partitions` offsets of TOPIC, and its answer."""
    key = ApiKey.TXN_OFFSET_COMMIT
    qm, rm = _mod(schemas.request_schema(key, 3)), _mod(schemas.response_schema(key, 3))
    req = schemas.encode_request(qm.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id=GROUP, producer_id=i64(PID), producer_epoch=i16(EPOCH), generation_id=i32(-1),
        member_id="", group_instance_id=None, topics=(qm.TxnOffsetCommitRequestTopic(name=TOPIC, partitions=tuple(
            qm.TxnOffsetCommitRequestPartition(partition_index=i32(p), committed_offset=i64(cid),
                                               committed_leader_epoch=i32(-1), committed_metadata="")
            for p in range(partitions))),)), cid, "bench")
    resp = schemas.encode(schemas.response_header_for(ApiKey.TXN_OFFSET_COMMIT, 3, cid), rm.TxnOffsetCommitResponse(
        throttle_time=datetime.timedelta(0), topics=(rm.TxnOffsetCommitResponseTopic(name=TOPIC, partitions=tuple(
            rm.TxnOffsetCommitResponsePartition(partition_index=i32(p), error_code=ErrorCode.none)
            for p in range(partitions))),)))
    return req, resp


def pair(cid: int, partitions: int) -> tuple[bytes, bytes]:
    pm, pr = _mod(schemas.request_schema(ApiKey.PRODUCE, 9)), _mod(schemas.response_schema(ApiKey.PRODUCE, 9))
    batch = build_batch([b"v" * 512], producer_id=PID, producer_epoch=EPOCH, base_sequence=0, transactional=True,
                        timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    req = schemas.encode_request(pm.ProduceRequest(
        transactional_id=TXN, acks=i16(-1), timeout=datetime.timedelta(seconds=30),
        topic_data=(pm.TopicProduceData(name=TOPIC, partition_data=tuple(
            pm.PartitionProduceData(index=i32(p), records=batch) for p in range(partitions))),)), cid, "bench")
    resp = schemas.encode(schemas.response_header_for(ApiKey.PRODUCE, 9, cid), pr.ProduceResponse(responses=(
        pr.TopicProduceResponse(name=TOPIC, partition_responses=tuple(pr.PartitionProduceResponse(
            index=i32(p), error_code=ErrorCode.none, base_offset=i64(0), log_append_time=None,
            log_start_offset=i64(0), record_errors=(), error_message=None) for p in range(partitions))),),
        throttle_time=datetime.timedelta(0)))
    return req, resp


class _Log:
    def info(self, *a: Any, **k: Any) -> None:
        pass


class _Shell:
    """What proxy/session.py does around its calls into the core ("recorded" mode), or nothing ("core alone")."""

    def __init__(self, guard: TransactionGuard, conn: Connection, recorded: bool) -> None:
        self.guard, self.conn, self.recorded = guard, conn, recorded
        self.log = _Log()
        self.batched = hasattr(guard, "booked")  # the shell records the ledger in batches (proxy/guard.py)
        if self.batched and recorded:
            conn.ledger = guard.ledger  # as proxy/session.py: every core books in the guard's one ledger
        self.ledger = getattr(conn, "ledger", None)  # absent before the fast path for transactional writes

    def after(self, out: list[c.Command]) -> None:
        """After one call into the core: its ledger (booked, or recorded first when commands follow), then
        its commands' recording."""
        if not self.recorded:
            return
        ledger = self.ledger
        if ledger is not None and (ledger.passed or ledger.windows or getattr(ledger, "offsets", None)):
            if not self.batched:
                self.guard.record_fast(ledger)  # the shell before batching: after every read
            elif out:
                self.guard.flush_ledger()
            else:
                self.guard.booked()
        for command in out:
            if isinstance(command, c.Decided):
                self.guard.record(command.decision, self.log)

    def run_ends(self) -> None:
        """Recorded: the timer's flush, due within its bound (timed with the run). Core alone: the ledger
        thrown away (untimed)."""
        if self.recorded:
            if self.batched:
                self.guard.flush_ledger()
        elif self.ledger is not None:
            self.ledger.take()


def _timed(shell: _Shell, frames: list[bytes], relay: Any, receive: Any) -> float:
    """Thread CPU seconds of one run of reads through the core, and the shell's part when recorded."""
    started = time.thread_time()
    for data in frames:
        done = relay(shell.conn, data)  # as the shell calls it (proxy/session.py)
        shell.after([] if done == len(data) else receive(data, done))
    if shell.recorded:
        shell.run_ends()
    took = time.thread_time() - started
    if not shell.recorded:
        shell.run_ends()
    return took


async def run(n: int, partitions: int, recorded: bool, audit: bool, offsets: bool = False,
              fast: bool = True) -> tuple[float, float]:
    """Seconds of thread CPU per Produce (or TxnOffsetCommit): (the request, its response). Requests go in runs
    of 90 (the in-flight limit is 100), then their responses, each run timed as a whole."""
    metrics = ProxyMetrics()
    config = ProxyConfig(upstream=(HostPort("127.0.0.1", 9),), audit_path="/dev/null" if audit else None)
    guard = TransactionGuard(config, metrics, policy_from_config({}), None)
    now = int(time.time() * 1000)
    guard.registry.init_producer_id(TXN, PID, EPOCH, 60_000, now)
    guard.registry.added(TXN, PID, EPOCH, now, partitions={(TOPIC, p) for p in range(partitions)})
    guard.registry.added(TXN, PID, EPOCH, now, group=GROUP)  # AddOffsetsToTxn answered
    guard.rules.offsets_partitions = 50  # asked once per proxy
    make = txn_offset_commit_pair if offsets else pair
    settings = dict(connection_id=1, listener="b", max_frame_bytes=1 << 20, pre_auth_max_frame_bytes=None,
                    max_in_flight=100, partial_frame_timeout_s=30.0, idle_timeout_s=600.0)
    if not fast:
        settings["fast_path"] = False
    conn = Connection(Settings(**settings),  # type: ignore[arg-type]
                      guard.rules, DirectCluster(), SystemClock(), metrics.traffic, ConnectionInventory("c", now))
    shell = _Shell(guard, conn, recorded)
    conn.receive_from_client(pair(0, partitions)[0])  # the first request names the client
    conn.receive_from_broker(pair(0, partitions)[1])
    pairs = [make(cid, partitions) for cid in range(1, 91)]
    requests, responses = [req for req, _ in pairs], [resp for _, resp in pairs]
    requests_s = responses_s = 0.0
    for _ in range(n // len(pairs)):
        requests_s += _timed(shell, requests, relay_requests, conn.receive_from_client)
        responses_s += _timed(shell, responses, relay_responses, conn.receive_from_broker)
        await asyncio.sleep(0)  # the loop runs the guard's timer when due (untimed)
    assert not conn.closed and conn.in_flight == 0
    done_n = n // len(pairs) * len(pairs)
    return requests_s / done_n, responses_s / done_n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--audit", action="store_true", help="write audit records (to /dev/null)")
    ap.add_argument("--txn-offset-commit", action="store_true",
                    help="TxnOffsetCommit v3 (one offset per partition) instead of Produce v9")
    ap.add_argument("--paths", default="fast", help="fast, general or fast,general (the relay's fast path on/off)")
    args = ap.parse_args()
    paths = [p == "fast" for p in args.paths.split(",")]
    results: dict[tuple[bool, bool], list[tuple[float, float]]] = {(r, f): [] for r in (False, True) for f in paths}
    loop = asyncio.new_event_loop()
    for _ in range(args.rounds):
        for recorded in (False, True):
            for fast in paths:  # alternated: a drift of the machine's speed falls on both alike
                results[recorded, fast].append(loop.run_until_complete(run(
                    args.requests, args.partitions, recorded, args.audit, args.txn_offset_commit, fast)))
    loop.close()
    kind = "TxnOffsetCommit v3" if args.txn_offset_commit else "Produce v9"
    print(f"{args.requests} transactional {kind} ({args.partitions} partition(s), local evidence) x "
          f"{args.rounds} rounds, thread CPU per request, per response and both, median (min-max) of rounds:")
    medians: dict[tuple[bool, bool], float] = {}
    for recorded, name in ((False, "core alone"), (True, "core + recording" + (" + audit" if args.audit else ""))):
        for fast in paths:
            line = f"  {name + ('' if len(paths) == 1 else (', fast path' if fast else ', general path')):40s}"
            for what, pick in (("request", lambda x: x[0]), ("response", lambda x: x[1]), ("both", sum)):
                r = [pick(x) * 1e6 for x in results[recorded, fast]]
                line += f"  {what} {statistics.median(r):6.2f} us ({min(r):.1f}-{max(r):.1f})"
                medians[recorded, fast] = statistics.median(r)  # "both" last
            print(line)
        if len(paths) == 2:
            print(f"  {name}: general/fast, both: {medians[recorded, False] / medians[recorded, True]:.2f}x")


if __name__ == "__main__":
    main()

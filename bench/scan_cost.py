"""What do the in-place readers of the transactional path cost per call, warm? `scan_transactional` (the relay's
fast path for a transactional Produce) and `read_txn_request` / `read_txn_response` (the transaction life cycle;
in this tree the native readers, before them Python ones),
on real frames built with kio, this tree's readers beside another revision's.

Run: `.venv/bin/python bench/scan_cost.py [--before main] [--number 20000] [--repeat 7]`

The other revision's `produce_scan.py` and `lifecycle_scan.py` are read with `git show REV:path` into a temporary
directory and imported under other names (they import the rest of txnguard from this tree). Both sides are
first checked to give the same answer on every frame, then timed alternately: thread CPU per call (timeit with
`time.thread_time`, so time the scheduler gives to other processes is not counted), median of `--repeat`
rounds of `--number` calls, and the best round (the least disturbed by the rest of the machine). Prints
microseconds per call and the ratios after/before; nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from txnguard.codecs import lifecycle_scan, native, schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.header import peek_request, request_body_offset
from txnguard.testing.raw import build_batch

ROOT = Path(__file__).resolve().parent.parent
TXN, PID, EPOCH = "bench-transactional-id", 4711, 3
STAMP = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _mod(cls: Any) -> Any:
    return sys.modules[cls.__module__]


def _old(rev: str, name: str, tmp: Path) -> ModuleType:
    if name != "runs" and "txnguard.codecs.runs" not in sys.modules:
        try:
            import txnguard.codecs.runs  # noqa: F401 - an older tree
        except ImportError:  # gone with the Python readers: the old ones import it from their revision
            sys.modules["txnguard.codecs.runs"] = _old(rev, "runs", tmp)
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/txnguard/codecs/{name}.py"],
                            check=True, capture_output=True, text=True).stdout
    path = tmp / f"before_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"before_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def produce(version: int, topics: int, partitions: int, *, value: int = 512, batches: int = 1,
            transactional: bool = True, pid: int = PID, txn: str = TXN, topic: str = "orders-", index: int = 1
            ) -> memoryview:
    """The Produce body from its transactional id, as the relay passes it: by default one 512-byte record per
    partition (partitions 0, 1, ... of topics orders-0, orders-1, ...); `index=0` names partition 0 each time."""
    m = _mod(schemas.request_schema(ApiKey.PRODUCE, version))
    batch = build_batch([b"v" * value], producer_id=pid, producer_epoch=EPOCH, base_sequence=0,
                        transactional=transactional, timestamp=STAMP) * batches
    frame = schemas.encode_request(m.ProduceRequest(
        transactional_id=txn, acks=i16(-1), timeout=datetime.timedelta(seconds=30),
        topic_data=tuple(m.TopicProduceData(name=f"{topic}{t}", partition_data=tuple(
            m.PartitionProduceData(index=i32(p * index), records=batch) for p in range(partitions)))
            for t in range(topics))),
        17, "producer-1")
    body = memoryview(frame)[4:]
    return body[request_body_offset(body, peek_request(body)):]


def request(key: int, version: int, partitions: int = 1, topics: int = 1, txn: str | None = TXN) -> bytes:
    cls = schemas.request_schema(key, version)
    m = _mod(cls)
    pid, epoch = i64(PID), i16(EPOCH)
    if key == ApiKey.INIT_PRODUCER_ID:
        ids = {"producer_id": pid, "producer_epoch": epoch} if version >= 3 else {}
        body = cls(transactional_id=txn, transaction_timeout=datetime.timedelta(seconds=60), **ids)
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        body = cls(v3_and_below_transactional_id=TXN, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                   v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(name=f"orders-{t}", partitions=tuple(
                       i32(p) for p in range(partitions))) for t in range(topics)))
    elif key == ApiKey.ADD_OFFSETS_TO_TXN:
        body = cls(transactional_id=TXN, producer_id=pid, producer_epoch=epoch, group_id="copier")
    else:
        body = cls(transactional_id=TXN, producer_id=pid, producer_epoch=epoch, committed=True)
    return schemas.encode_request(body, 17, "producer-1")[4:]


def response(key: int, version: int, partitions: int = 1, topics: int = 1, error: ErrorCode = ErrorCode.none
             ) -> bytes:
    cls = schemas.response_schema(key, version)
    m = _mod(cls)
    throttle = datetime.timedelta(0)
    if key == ApiKey.INIT_PRODUCER_ID:
        body = cls(throttle_time=throttle, error_code=error, producer_id=i64(PID), producer_epoch=i16(EPOCH))
    elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
        body = cls(throttle_time=throttle, results_by_topic_v3_and_below=tuple(m.AddPartitionsToTxnTopicResult(
            name=f"orders-{t}", results_by_partition=tuple(m.AddPartitionsToTxnPartitionResult(
                partition_index=i32(p), partition_error_code=error) for p in range(partitions)))
            for t in range(topics)))
    else:
        body = cls(throttle_time=throttle, error_code=error)
    return schemas.encode(schemas.response_header_for(key, version, 17), body)[4:]


def _native_scan(body: memoryview, flexible: bool) -> Any:
    """The native reader (native/src/produce.rs) as the old Python one was called: the whole body."""
    return native.scan_transactional(body, 0, len(body), flexible)


def cases() -> list[tuple[str, str, Any]]:
    """(label, reader, its arguments)."""
    out: list[tuple[str, str, Any]] = []
    for version in (3, 7, 9):
        for topics, parts in ((1, 1), (2, 3)):
            out.append((f"Produce v{version} {topics}x{parts}", "scan_transactional",
                        (produce(version, topics, parts), version >= 9)))
    lifecycle = [(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 1), (ApiKey.ADD_PARTITIONS_TO_TXN, 3, 1),
                 (ApiKey.ADD_PARTITIONS_TO_TXN, 3, 3), (ApiKey.END_TXN, 0, 1), (ApiKey.END_TXN, 3, 1),
                 (ApiKey.ADD_OFFSETS_TO_TXN, 3, 1), (ApiKey.INIT_PRODUCER_ID, 4, 1)]
    for key, version, parts in lifecycle:
        name = f"{ApiKey(key).name} v{version}" + (f" {parts}p" if key == ApiKey.ADD_PARTITIONS_TO_TXN else "")
        body = memoryview(request(key, version, parts))
        out.append((name, "read_txn_request", (body, peek_request(body))))
    for key, version, parts in lifecycle:
        name = f"{ApiKey(key).name} v{version}" + (f" {parts}p" if key == ApiKey.ADD_PARTITIONS_TO_TXN else "")
        out.append((name + " answer", "read_txn_response", (memoryview(response(key, version, parts)), key, version)))
    return out


def lifecycle_shapes() -> list[tuple[str, Any]]:
    """Every version the life-cycle readers read, with the shapes around the common one (no, three and two
    topics of AddPartitionsToTxn, a null InitProducerId id, answers with an error)."""
    shapes: list[tuple[str, Any]] = []
    for key, last in lifecycle_scan._LAST_READ.items():  # every version read, and shapes around the common
        for version in range(last + 1):
            for kw in ({}, {"partitions": 0}, {"partitions": 3, "topics": 2}, {"topics": 0}):
                if kw and key != ApiKey.ADD_PARTITIONS_TO_TXN:
                    continue
                body = memoryview(request(key, version, **kw))
                shapes.append(("read_txn_request", (body, peek_request(body))))
                for error in (ErrorCode.none, ErrorCode.concurrent_transactions):
                    shapes.append(("read_txn_response", (memoryview(response(key, version, error=error, **kw)),
                                                         key, version)))
            if key == ApiKey.INIT_PRODUCER_ID:
                body = memoryview(request(key, version, txn=None))
                shapes.append(("read_txn_request", (body, peek_request(body))))
    return shapes


def differential(before: dict[str, Any], after: dict[str, Any], n: int, seed: int) -> None:
    """Both revisions on `n` mutated frames (1-4 bytes changed, some cut short) of every case and of the shapes
    around the common one: the same answer, or the same exception type, every time."""
    rng = random.Random(seed)
    shapes = [("scan_transactional", (produce(v, t, p, **kw), v >= 9)) for v in (3, 8, 9, 11)
              for t, p, kw in ((1, 1, {}), (1, 1, {"value": 20}), (1, 1, {"batches": 2}), (1, 2, {}),
                               (2, 1, {}), (1, 1, {"transactional": False}), (1, 1, {"pid": -1}),
                               (1, 2, {"index": 0}), (1, 1, {"txn": "t" * 200}), (1, 1, {"topic": ""}),
                               (1, 1, {"value": 20000}))]
    shapes += [(reader, call) for _, reader, call in cases()]
    shapes += lifecycle_shapes()
    answered = Counter[str]()
    for reader, call in shapes:
        frame = bytes(call[0])
        for _ in range(n):
            mutated = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            if rng.random() < 0.3:
                mutated = mutated[:rng.randrange(len(mutated) + 1)]
            args = (memoryview(bytes(mutated)), *call[1:])
            if reader == "read_txn_request" and len(mutated) >= 8:
                args = (args[0], peek_request(args[0]))  # the key and version as mutated
            results = []
            for side in (before, after):
                try:
                    results.append(repr(side[reader](*args)).split("(", 1)[-1])
                except Exception as e:  # noqa: BLE001 - compared, not judged
                    results.append(type(e).__name__)
            assert results[0] == results[1], (reader, bytes(mutated).hex(), results)
            answered[reader] += results[1] != "None" and not results[1].isidentifier()
    print(f"differential: {len(shapes)} frames x {n} mutations, the same answer each time; answered (not None): "
          + ", ".join(f"{k} {v}" for k, v in sorted(answered.items())))


def _time(fn: Any, args: Any, number: int) -> float:
    return timeit.Timer(lambda: fn(*args), timer=time.thread_time).timeit(number) / number * 1e6


def _counted(before: dict[str, Any], after: dict[str, Any], only: str, n: int) -> None:
    """Run under callgrind with --dump-before=time_sleep: each time.sleep(0) closes a part of the profile. The
    parts: start-up, an empty loop of n (the baseline), then n calls of each reader, before then after, per case.
    Prints the labels in that order for the parent."""
    calls = []
    for label, reader, call in cases():
        if only in label:
            calls += [(label, reader, "before", before[reader], call), (label, reader, "after", after[reader], call)]
    for *_, fn, call in calls:
        fn(*call)  # warm
    sleep, r = time.sleep, range(n)
    sleep(0)
    for _ in r:
        pass
    sleep(0)
    for *_, fn, call in calls:
        for _ in r:
            fn(*call)
        sleep(0)
    print(json.dumps([c[:3] for c in calls]))


def instructions(args: argparse.Namespace) -> None:
    """Instructions per call counted by callgrind (valgrind): the same on a busy machine as on a quiet one."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              "--dump-before=time_sleep", sys.executable, __file__, "--counted", "--before",
                              args.before, "--only", args.only, "--number", str(args.number)],
                             capture_output=True, text=True, check=True, env=os.environ | {"PYTHONHASHSEED": "0"})
        labels = json.loads(run.stdout.strip().splitlines()[-1])
        parts = []
        for k in range(1, len(labels) + 3):  # start-up, the baseline, then one part per (case, side)
            text = Path(f"{out}.{k}").read_text()
            parts.append(int(next(line for line in text.splitlines() if line.startswith("totals:")).split()[1]))
    baseline = parts[1]
    per_call = {(label, side): (part - baseline) / args.number
                for (label, _, side), part in zip(labels, parts[2:], strict=True)}
    print(f"instructions per call (callgrind, {args.number} calls, less an empty loop's); before = {args.before}")
    print(f"{'frame':34} {'reader':18} {'before':>8} {'after':>8} {'ratio':>5}")
    for label, reader, side in labels:
        if side == "after":
            b, a = per_call[label, "before"], per_call[label, "after"]
            print(f"{label:34} {reader:18} {b:8.0f} {a:8.0f} {a / b:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="main", help="the revision to compare with (git show REV:path)")
    ap.add_argument("--number", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--only", default="", help="only the frames whose label contains this")
    ap.add_argument("--differential", type=int, default=0, metavar="N",
                    help="first compare both revisions' answers on N mutations of each frame")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per call under callgrind instead of timing (needs valgrind)")
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    args = ap.parse_args()
    if args.instructions:
        if args.differential:
            main_args = [a for a in sys.argv[1:] if a != "--instructions"]
            subprocess.run([sys.executable, __file__, *main_args, "--number", "0"], check=False)
        instructions(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        before = {"scan_transactional": _old(args.before, "produce_scan", Path(tmp)).scan_transactional}
        old_lifecycle = _old(args.before, "lifecycle_scan", Path(tmp))
        before |= {"read_txn_request": old_lifecycle.read_txn_request,
                   "read_txn_response": old_lifecycle.read_txn_response}
    after = {"scan_transactional": _native_scan,
             "read_txn_request": lifecycle_scan.read_txn_request,
             "read_txn_response": lifecycle_scan.read_txn_response}
    if args.counted:
        _counted(before, after, args.only, args.number)
        return
    if args.differential:
        differential(before, after, args.differential, args.seed)
    if not args.number:
        return
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], capture_output=True,
                          text=True).stdout.strip()
    print(f"warm thread CPU per call, us: median and best of {args.repeat} rounds of {args.number} calls; "
          f"before = {args.before} ({head})")
    print(f"{'frame':34} {'reader':18} {'before':>6} {'after':>6} {'ratio':>5}   {'best: before':>12} {'after':>6} "
          f"{'ratio':>5}")
    for label, reader, call in cases():
        if args.only not in label:
            continue
        old, new = before[reader](*call), after[reader](*call)
        # The same answer (the old dataclasses are other classes: compare their fields).
        assert repr(old).split("(", 1)[-1] == repr(new).split("(", 1)[-1], (label, old, new)
        assert new is not None, label
        b_runs, a_runs = [], []
        for _ in range(args.repeat):
            b_runs.append(_time(before[reader], call, args.number))
            a_runs.append(_time(after[reader], call, args.number))
        b, a, b_best, a_best = statistics.median(b_runs), statistics.median(a_runs), min(b_runs), min(a_runs)
        print(f"{label:34} {reader:18} {b:6.2f} {a:6.2f} {a / b:5.2f}   {b_best:12.2f} {a_best:6.2f} "
              f"{a_best / b_best:5.2f}")


if __name__ == "__main__":
    main()

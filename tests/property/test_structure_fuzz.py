"""Structure-aware fuzzing of every decoding entry point, seeded with frames recorded from real clients.

Each case is a real frame (tests/data/frames, bench/record_seeds.py) with one of
its counts, lengths, varints, tagged fields or record-batch headers made to lie
(txnguard.testing.fuzz). The proxy's decoders (and the in-place Produce scan) must either succeed or raise a
CodecError: never another exception, never an abort (kio's native decoder
sizes allocations from the counts a frame claims), never unbounded memory or
time. Long runs against a live proxy process: bench/fuzz.py.
"""

from __future__ import annotations

import contextlib
import random
import resource
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txnguard.codecs import native
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.batches import batch_heads
from txnguard.codecs.errors import CodecError
from txnguard.codecs.framing import DEFAULT_MAX_FRAME, FrameSplitter
from txnguard.codecs.header import (
    peek_client_id,
    peek_correlation_id,
    peek_request,
    produce_acks_and_txn_id_null,
    request_body_offset,
)
from txnguard.codecs.produce_scan import scan_produce
from txnguard.codecs.schemas import decode_request, decode_response, kio_version_range
from txnguard.testing.fuzz import MUTATIONS, Case, Mutator, load_seeds

SEEDS = load_seeds(Path(__file__).resolve().parents[1] / "data" / "frames")
# A flood of 2M empty tagged fields is bench/fuzz.py's job; here 100k keep each case fast.
MUTATOR = Mutator(SEEDS, max_tags=100_000, frame_lies=0.1)
# Generous bounds: a case that needs more is a stall or a leak, not a slow machine.
MAX_SECONDS_PER_CASE = 5.0
MAX_TRACED_BYTES = 32 * 1024 * 1024
MAX_RSS_GROWTH_KIB = 256 * 1024

# The API keys the proxy decodes, each of which must have request or response seeds.
DECODED = {ApiKey.PRODUCE: "Produce", ApiKey.FETCH: "Fetch", ApiKey.METADATA: "Metadata",
           ApiKey.FIND_COORDINATOR: "FindCoordinator", ApiKey.API_VERSIONS: "ApiVersions",
           ApiKey.INIT_PRODUCER_ID: "InitProducerId", ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
           ApiKey.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn", ApiKey.END_TXN: "EndTxn",
           ApiKey.TXN_OFFSET_COMMIT: "TxnOffsetCommit", ApiKey.DESCRIBE_CLUSTER: "DescribeCluster",
           ApiKey.DESCRIBE_PRODUCERS: "DescribeProducers", ApiKey.DESCRIBE_TRANSACTIONS: "DescribeTransactions"}


def _warm_up() -> None:
    """Import and compile every schema a case can name, once, outside tracemalloc.

    kio imports a schema module on first use and both kio and the bounds check compile
    a reader per schema; under tracemalloc that first use takes ~100x longer, which
    would be charged to whichever case happened to name the schema first.
    """
    for key in DECODED:
        versions = kio_version_range(key)
        assert versions is not None
        for version in range(versions[0], versions[1] + 1):
            with contextlib.suppress(CodecError):
                decode_request(struct.pack(">hhih", key, version, 0, -1) + b"\x00" * 8)
            with contextlib.suppress(CodecError):
                decode_response(b"\x00" * 12, key, version)


_warm_up()


def _decode_frame(case: Case, frame: memoryview) -> None:
    """Every entry point the proxy has for a frame of this direction, each on its own (one refusing skips none)."""
    calls: list[Callable[[], object]]
    if case.direction == "request":
        calls = [lambda: peek_client_id(frame), lambda: decode_request(frame)]
        with contextlib.suppress(CodecError):
            head = peek_request(frame)
            calls.append(lambda: request_body_offset(frame, head))
            if head.api_key == ApiKey.PRODUCE:
                calls.append(lambda: produce_acks_and_txn_id_null(frame, head))
                if head.api_version >= 3:  # the verification's in-place reader of transactional Produce
                    calls.append(lambda: scan_produce(frame, head))
                    # The relay's native reader: from the transactional id to the frame's end. It raises nothing
                    # (None: the general path judges); a panic is a BaseException and fails the test.
                    calls.append(lambda: native.scan_transactional(
                        frame, request_body_offset(frame, head), len(frame), head.api_version >= 9))
    else:
        calls = [lambda: peek_correlation_id(frame), lambda: decode_response(frame, case.api_key, case.api_version)]
    for call in calls:
        with contextlib.suppress(CodecError):
            call()


def _feed(case: Case, split: int) -> None:
    """The wire bytes through the frame splitter (in two chunks), each frame through the decoders."""
    splitter = FrameSplitter(DEFAULT_MAX_FRAME)
    frames: list[memoryview] = []
    with contextlib.suppress(CodecError):
        frames += splitter.feed(case.stream[:split])
        frames += splitter.feed(case.stream[split:])
    for f in frames:
        _decode_frame(case, f[4:])
    # The entry points directly too: a frame need not have come through the splitter.
    _decode_frame(case, memoryview(case.frame))
    if case.records is not None:
        with contextlib.suppress(CodecError):
            batch_heads(case.records)


def _bounded(case: Case, split: int) -> None:
    """Run one case and hold it to the bounds; any non-codec exception propagates (and fails the test)."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    started = time.perf_counter()
    try:
        _feed(case, split)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ru_maxrss is a high-water mark: a case whose native (untraced) allocations jump it is caught here.
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert elapsed < MAX_SECONDS_PER_CASE, f"{elapsed:.1f} s for {case.describe()[:600]}"
    assert peak < MAX_TRACED_BYTES + 8 * len(case.stream), f"{peak} bytes traced for {case.describe()[:600]}"
    assert rss_growth < MAX_RSS_GROWTH_KIB, f"RSS grew {rss_growth} KiB for {case.describe()[:600]}"


def test_every_seed_follows_its_schema_and_the_corpus_covers_the_decoded_apis():
    assert not MUTATOR.skipped
    keys = {s.api_key for s, _ in MUTATOR.seeds}
    assert not set(DECODED) - keys, [DECODED[k] for k in set(DECODED) - keys]
    directions = {(s.api_key, s.direction) for s, _ in MUTATOR.seeds}
    assert {(k, d) for k in (0, 24, 28) for d in ("request", "response")} <= directions


def test_every_seed_decodes():
    """The unmutated frames are valid, so a codec error on a mutation is the mutation's doing."""
    for seed, _ in MUTATOR.seeds:
        if seed.is_request:
            decode_request(seed.frame)
        else:
            decode_response(seed.frame, seed.api_key, seed.api_version)


def test_the_walker_finds_the_structure_the_mutations_target():
    """A transactional Produce seed has array counts, lengths and a record batch header where kio puts them."""
    produce = [(s, st_) for s, st_ in MUTATOR.seeds if s.api_key == ApiKey.PRODUCE and s.direction == "request"
               and any(m.kind == "batch.attributes" and m.value & 0x10 for m in st_.landmarks)]
    assert produce
    seed, structure = produce[0]
    kinds = {m.kind for m in structure.landmarks}
    assert {"array", "string", "records", "batch.batch_length", "batch.producer_id"} <= kinds
    for m in structure.landmarks:
        if m.kind == "batch.magic":
            assert m.value == 2
    (records_at,) = [r for r in structure.records][:1]
    assert batch_heads(seed.frame[records_at[0]:records_at[1]])


def test_the_mutator_is_deterministic_by_seed():
    a, b = Mutator(SEEDS, seed=7), Mutator(SEEDS, seed=7)
    assert [c.stream for c in a.cases(30)] == [c.stream for c in b.cases(30)]
    assert [c.stream for c in a.cases(30)] != [c.stream for c in Mutator(SEEDS, seed=8).cases(30)]


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_every_seed_under_every_mutation(kind):
    """A deterministic sweep: each seed, each mutation kind, a few variants."""
    for index, (seed, structure) in enumerate(MUTATOR.seeds):
        for variant in range(2):
            rng = random.Random(f"sweep:{kind}:{index}:{variant}")
            case = MUTATOR.mutate(seed, structure, rng, kind=kind)
            _bounded(case, rng.randrange(len(case.stream) + 1))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(MUTATOR.seeds) - 1), st.integers(0, 2**32 - 1), st.floats(0, 1))
def test_mutated_frames_decode_or_raise_codec_errors_within_bounds(seed_index, n, split_at):
    seed, structure = MUTATOR.seeds[seed_index]
    case = MUTATOR.mutate(seed, structure, random.Random(n))
    _bounded(case, int(split_at * len(case.stream)))

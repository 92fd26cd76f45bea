"""A JSONL file split into byte ranges: every line is read by exactly one range, whatever the split.

    file ──split at any byte──▶ ranges ──read_range──▶ lines that start in each ──▶ every line once, in order
"""

from __future__ import annotations

import random

import pytest

from txnguard.pipeline import ranges


def _lines_read(path, cut: int, batch_bytes: int) -> list[bytes]:
    size = path.stat().st_size
    got: list[bytes] = []
    for start in range(0, size, cut):
        data = ranges.read_range(str(path), start, min(size, start + cut))
        for batch in ranges.line_batches(data, batch_bytes):
            assert all(line.endswith("\n") for line in batch.to_pylist())  # each keeps its newline
            got += [line.encode()[:-1] for line in batch.to_pylist()]
    return got


@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize("cut", [1, 2, 7, 64, 1000, 10**6])
def test_every_line_is_read_once_whatever_the_cut(tmp_path, cut, trailing_newline):
    rng = random.Random(cut)
    lines = [("é" * rng.randrange(0, 40)).encode() for _ in range(500)]  # blank lines and multi-byte characters too
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    assert _lines_read(path, cut, batch_bytes=100) == lines


def test_a_line_longer_than_a_batch_is_a_batch_of_its_own(tmp_path):
    path = tmp_path / "audit.jsonl"
    lines = [b"a", b"x" * 5000, b"b"]
    path.write_bytes(b"\n".join(lines) + b"\n")
    batches = list(ranges.line_batches(ranges.read_range(str(path), 0, path.stat().st_size), 100))
    assert [len(b) for b in batches] == [1, 1, 1]


def test_a_folder_is_its_data_files_and_anything_not_local_goes_to_spark(tmp_path):
    (tmp_path / "b.jsonl").write_text("{}\n")
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".hidden").write_text("")
    assert ranges.input_files(str(tmp_path)) == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert ranges.input_files(f"file://{tmp_path}/a.jsonl") == [str(tmp_path / "a.jsonl")]
    assert ranges.input_files(str(tmp_path / "*.jsonl")) is None  # a glob: Spark's text source expands it
    assert ranges.input_files("hdfs://namenode/audit") is None


@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize(("cut", "batch_bytes"), [(1, 1), (7, 3), (64, 10), (1000, 64), (10**6, 100)])
def test_a_range_read_a_batch_at_a_time_gives_its_lines_once(tmp_path, cut, batch_bytes, trailing_newline):
    rng = random.Random(cut)
    lines = [("é" * rng.randrange(0, 40)).encode() for _ in range(500)]
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    size = path.stat().st_size
    got = [line.encode()[:-1] for start in range(0, size, cut)
           for batch in ranges.range_batches(str(path), start, min(size, start + cut), batch_bytes)
           for line in batch.to_pylist()]
    assert got == lines


def test_ranges_cover_every_byte_once_large_first_small_last(tmp_path):
    files = []
    for name, size in (("a", 30 * ranges.MIN_RANGE_BYTES + 3), ("b", 5), ("c", 0)):
        path = tmp_path / name
        with path.open("wb") as f:
            f.truncate(size)
        files.append(str(path))
    found = ranges.split(files, parallelism=2)
    for f in files:
        spans = [(s, e) for p, s, e in found if p == f]
        covered = sum(e - s for s, e in spans)
        assert covered == (tmp_path / f.rsplit("/", 1)[1]).stat().st_size
        assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    sizes = [e - s for _, s, e in found]
    assert max(sizes) <= ranges.MAX_RANGE_BYTES
    # Guided: each range is what was left / (2 x cores), so they shrink (down to the floor) and the tail is small.
    assert sizes[0] == (30 * ranges.MIN_RANGE_BYTES + 3 + 5) // 4 and sizes == sorted(sizes, reverse=True)
    assert all(size == ranges.MIN_RANGE_BYTES for size in sizes[-4:-2])


def test_a_range_is_never_larger_than_the_cap(tmp_path):
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.truncate(3 * ranges.MAX_RANGE_BYTES)  # sparse: no bytes written
    sizes = [e - s for _, s, e in ranges.split([str(path)], parallelism=1)]
    assert sizes[0] == ranges.MAX_RANGE_BYTES < 3 * ranges.MAX_RANGE_BYTES // 2  # what is left / 2 would be more
    assert sum(sizes) == 3 * ranges.MAX_RANGE_BYTES and sizes == sorted(sizes, reverse=True)

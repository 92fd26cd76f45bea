"""A JSONL input read by the tasks themselves: each task gets a byte range of a file and parses the lines that start
in it, straight from the file's bytes.

Spark's text source made every line a JVM string, then a row, then Arrow again to reach the Python worker: about
half of the ingest's CPU before the parse began. Here the bytes read are the buffer the JSON reader parses (the
lines keep their newlines: `arrow_parse.route_batch(terminated=True)`), with no copy per line.

A range [start, end) owns the lines that *start* in it (Hadoop's rule for splitting text): a range that does not
begin right after a newline skips to the next one (that line belongs to the range before), and its last line runs
on past `end` to its newline. Every line is read by exactly one task, whatever the split.

Local files only (a path, or a folder of files): `job.ingest` gives any other location (hdfs://, s3a://, a glob)
to Spark's text source as before. Nothing here imports pyspark (shipped to the executors by value).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

# Ranges shrink as the input is handed out ("guided" scheduling): each is the bytes still unassigned divided by
# GUIDED_SHARE times the cores, between MIN_ and MAX_RANGE_BYTES. Spark starts a stage's tasks in partition order,
# so the large ranges run first and the last ones are small: the cores finish together, with few tasks. A worker
# was measured idle 0.06-0.14 s between two tasks (not broken down: Spark's task launch, the worker's round trip);
# with 85 equal ranges of 64 MiB for 10M records (5.7 GB) that is ~3.4 s of a 44 s ingest (42 tasks a core x
# 0.08 s, an estimate); the guided split makes 25.
GUIDED_SHARE = 2
MAX_RANGE_BYTES = 1024 * 1024 * 1024
MIN_RANGE_BYTES = 4 * 1024 * 1024
# Lines handed to the JSON reader at once, and what a task reads at a time (its memory does not grow with its
# range): each batch also costs ~30 Arrow calls of fixed cost (routing, columns, files); 16 MiB batches measured
# 6% less CPU per record than 4 MiB (9.8 against 10.5 us, one 35 MB range).
BATCH_BYTES = 16 * 1024 * 1024

Range = tuple[str, int, int]


def input_files(location: str) -> list[str] | None:
    """The files to read, or None when `location` is not a local file or folder (Spark's reader takes it)."""
    path = location[len("file://"):] if location.startswith("file://") else location
    if "://" in path or not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    # A folder: its files, as Spark's text source lists them (hidden and _-prefixed names are not data).
    return sorted(os.path.join(os.path.abspath(path), name) for name in os.listdir(path)
                  if not name.startswith((".", "_")) and os.path.isfile(os.path.join(path, name)))


def split(files: list[str], parallelism: int) -> list[Range]:
    """Byte ranges over every file, in order, each the unassigned bytes / (GUIDED_SHARE x cores), between MIN_ and
    MAX_RANGE_BYTES: large first, small last."""
    sizes = [(f, os.path.getsize(f)) for f in files]
    remaining = sum(size for _, size in sizes)
    out: list[Range] = []
    for f, size in sizes:
        start = 0
        while start < size:
            target = max(MIN_RANGE_BYTES, min(MAX_RANGE_BYTES, remaining // (GUIDED_SHARE * max(1, parallelism))))
            end = min(size, start + target)
            out.append((f, start, end))
            remaining -= end - start
            start = end
    return out


def range_batches(path: str, start: int, end: int, batch_bytes: int = BATCH_BYTES) -> Iterator[pa.Array]:
    """The lines that start in [start, end), as string arrays, read `batch_bytes` at a time: the range is cut into
    sub-ranges of that size and each is read as a range (the rule composes: every line once, in order)."""
    for at in range(start, end, batch_bytes):
        data = read_range(path, at, min(end, at + batch_bytes))
        yield from line_batches(data, max(len(data), 1))  # one array per read (its last line may run past)


def read_range(path: str, start: int, end: int) -> bytes | bytearray:
    """The lines that start in [start, end), each ending with a newline (one is added after a last line without).
    Read into one buffer that grows in place (no copy of the range to append its last line)."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the rest of a line that started before `start`: the range before owns it
        first = f.tell()
        if first >= end:
            return b""
        data = bytearray(end - first)
        got = f.readinto(data)
        del data[got:]
        if data and data[-1] != 10:
            data += f.readline()  # the last line that starts in the range runs on past its end
    if data and data[-1] != 10:
        data += b"\n"  # the file's last line had no newline
    return data


def line_batches(data: bytes | bytearray, batch_bytes: int = BATCH_BYTES) -> Iterator[pa.Array]:
    """`data`'s lines (each ending with its newline) as string arrays of about `batch_bytes`, no copy of the text."""
    if not data:
        return
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1  # one past each newline
    buffer = pa.py_buffer(data)
    lo = 0
    while lo < len(ends):
        begin = int(ends[lo - 1]) if lo else 0
        hi = int(np.searchsorted(ends, begin + batch_bytes, side="right"))
        hi = max(hi, lo + 1)  # a line longer than a batch is a batch of its own
        offsets = np.empty(hi - lo + 1, dtype=np.int64)
        offsets[0] = begin
        offsets[1:] = ends[lo:hi]
        offsets -= begin
        size = int(offsets[-1])
        width = pa.string() if size < 2**31 else pa.large_string()
        numpy_width = np.int32 if width == pa.string() else np.int64
        yield pa.Array.from_buffers(width, hi - lo, [None, pa.py_buffer(offsets.astype(numpy_width)),
                                                     buffer.slice(begin, size)])
        lo = hi

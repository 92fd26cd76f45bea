"""kcat, a librdkafka command-line tool: plain produce, metadata and a read_committed consumer. It cannot run
transactions."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from txnguard.testing.clients.base import (
    DEFAULT_TIMEOUT_S,
    ClientError,
    describe_run,
    partitions_of,
    run_tool,
)

KCAT = os.environ.get("TXNGUARD_KCAT", "kcat")


class Kcat:
    """kcat (librdkafka). It has no transactional producer, so it only ever reads transactions."""

    name = "kcat"

    def __init__(self, executable: str = KCAT) -> None:
        self.executable = executable

    def consume_committed(
        self, bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None,
        *, timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes]:
        got: list[tuple[int, int, bytes]] = []
        for p in partitions_of(bootstrap_servers, topic, partitions):
            # -e: exit at end of partition, which read_committed puts at the last stable offset.
            # -J: one JSON envelope per message, so values may contain newlines.
            run = run_tool(
                [self.executable, "-C", "-b", bootstrap_servers, "-t", topic, "-p", str(p), "-o", "beginning",
                 "-e", "-q", "-J", "-X", "isolation.level=read_committed"],
                timeout_s=timeout_s,
            )
            for line in run.stdout.splitlines():
                if line.strip():
                    m = json.loads(line)
                    value = m["payload"]
                    got.append((int(m["partition"]), int(m["offset"]), b"" if value is None else value.encode()))
        return [v for _, _, v in sorted(got)]

    def produce(
        self, bootstrap_servers: str, topic: str, values: Sequence[bytes], *, partition: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """One message per value (newline-delimited on kcat's stdin), acks=all."""
        if any(b"\n" in v for v in values):
            raise ValueError("kcat produce takes newline-delimited values; a value contains a newline")
        args = [self.executable, "-P", "-b", bootstrap_servers, "-t", topic, "-X", "acks=all"]
        if partition is not None:
            args += ["-p", str(partition)]
        run = run_tool(args, timeout_s=timeout_s, input_bytes=b"".join(v + b"\n" for v in values))
        # kcat reports delivery failures on stderr but may still exit 0.
        if "ERROR" in run.stderr:
            raise ClientError("kcat produce reported errors\n" + describe_run(run.args, run.stdout, run.stderr))

    def metadata(self, bootstrap_servers: str, *, topic: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """kcat -L -J: {"brokers": [{"id", "name"}...], "topics": [{"topic", "partitions": [...]}...], ...}."""
        args = [self.executable, "-L", "-J", "-b", bootstrap_servers]
        if topic is not None:
            args += ["-t", topic]
        result: dict[str, Any] = json.loads(run_tool(args, timeout_s=timeout_s).stdout)
        return result

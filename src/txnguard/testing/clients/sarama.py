"""IBM/sarama (Go), through sarama-paced (tools/sarama-paced, built by `make sarama`): paced transactions only."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from txnguard.testing.clients.base import (
    AckHook,
    ClientError,
    PacedResult,
    describe_run,
    kill_group,
    no_ack,
)

# IBM/sarama (Go), built by `make sarama` from tools/sarama-paced.
SARAMA_PACED = os.environ.get("TXNGUARD_SARAMA_PACED", str(Path.home() / ".cache/txnguard/bin/sarama-paced"))
# The Sarama settings sarama-paced takes, by their names in sarama.Config, and its flag for each.
SARAMA_SETTINGS = {"Producer.Retry.Max": "--retries", "Producer.Retry.Backoff": "--backoff-ms",
                   "Version": "--kafka-version"}


class SaramaClient:
    name = "sarama"

    def paced_transactions(
        self, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int, per_transaction: int,
        partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None, timeout_s: float = 120.0,
        settings: dict[str, Any] | None = None,
    ) -> PacedResult:
        """paced_transactions("sarama", ...), with `settings` on top of Sarama's defaults: Producer.Retry.Max
        (default 3), Producer.Retry.Backoff (in milliseconds here; default 100) and Version ("2.8.0").

        The Go program prints `ACK t i` after each acknowledgement and waits for a line on stdin; `on_ack(t, i)`
        runs here, in the calling thread, before that line is written, so the next Produce leaves only after
        the hook returned. Killed (with anything it started) after `timeout_s`.
        """
        args = [SARAMA_PACED, "--bootstrap", bootstrap_servers, "--topic", topic, "--transactional-id",
                transactional_id, "--partition", str(partition), "--transactions", str(transactions),
                "--per-transaction", str(per_transaction), "--gap-ms", str(round(gap_s * 1000)), "--ack-handshake",
                "--timeout-s", str(timeout_s)]
        for name, value in (settings or {}).items():
            if name not in SARAMA_SETTINGS:
                raise ValueError(f"sarama-paced takes {', '.join(SARAMA_SETTINGS)}, not {name}")
            args += [SARAMA_SETTINGS[name], str(value)]
        if not os.access(SARAMA_PACED, os.X_OK):
            raise ClientError(f"{SARAMA_PACED} is missing: run `make sarama`")
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        stderr: list[bytes] = []
        drain = threading.Thread(target=lambda: stderr.extend(proc.stderr or ()), name="sarama-stderr", daemon=True)
        drain.start()
        try:
            out = _sarama_handshake(proc, on_ack or no_ack, time.monotonic() + timeout_s, timeout_s)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                kill_group(proc)
                proc.wait()
            drain.join(5)
        result = json.loads(out[-1]) if out and out[-1].startswith("{") else None
        if proc.returncode != 0 or result is None or result.get("fatal") is not None:
            raise ClientError(f"sarama-paced exited with {proc.returncode}: "
                              f"{result.get('fatal') if result else None}\n"
                              + describe_run(args, "\n".join(out), b"".join(stderr).decode(errors="replace")))
        return PacedResult([v.encode() for v in result["committed"]], result["aborted"], result["errors"])


def _sarama_handshake(proc: subprocess.Popen[bytes], on_ack: AckHook, deadline: float, timeout_s: float) -> list[str]:
    """Read the program's stdout to its end: run on_ack for each ACK line and answer it; the other lines."""
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="sarama-stdout", daemon=True).start()
    out: list[str] = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ClientError(f"sarama-paced did not finish within {timeout_s:.0f}s and was killed; "
                              f"last output {out[-3:]}") from None
        if line is None:
            return out
        text = line.decode(errors="replace").strip()
        if not text.startswith("ACK "):
            out.append(text)
            continue
        _, t, i = text.split()
        on_ack(int(t), int(i))
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # it exited: its last line says why
                proc.stdin.write(b"\n")
                proc.stdin.flush()


# The tests' name for SaramaClient().paced_transactions.
sarama_paced_transactions = SaramaClient().paced_transactions

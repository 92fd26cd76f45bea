"""`txnguard demo` end to end, as `make demo` runs it (its own Kafka 3.5.2, its own proxy, a real consumer).

    txnguard demo --records 4 ──▶ Kafka 3.5.2 up, txnguard in front
        direct:   old client's write outside its transaction NONE; LSO 0 < HW 6; read_committed consumer 0 of 4
        proxied:  the same write INVALID_TXN_STATE (48); LSO = HW = 5; consumer 4 of 4
        /metrics failures{not_in_transaction} 1; the audit record and the proxy's own log line name that write
        Kafka's pid gone, the temporary folder gone, no process left that names it

Four records, not the default three: a figure that did not come from the run would not follow. The figures are
cross-checked against each other where two sources say the same thing (the producer id the client got, the
audit record, the proxy's JSON log line).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from txnguard.testing import kafka

pytestmark = pytest.mark.integration

RECORDS = 4


def _one(pattern: str, text: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text, re.MULTILINE))
    assert len(found) == 1, (pattern, text)
    return found[0]


def _processes_naming(path: Path) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmdline and int(proc.name) != os.getpid():
                out.append(f"{proc.name}: {cmdline[:200]}")
    return out


def test_demo_shows_a_stuck_lso_direct_a_refusal_through_the_proxy_and_cleans_up(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "txnguard.cli", "demo", "--records", str(RECORDS), "--watch-seconds", "2",
         "--temp-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)  # a safety net, not a bound
    out = run.stdout
    print(out)  # the demo's own output, in the test log
    assert run.returncode == 0, out + run.stderr
    # stdout is a pipe here: txnguard's log lines are JSON, every other line is for a person.
    log_lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    text = "\n".join(line for line in out.splitlines() if not line.startswith("{"))
    assert "one JSON object a line (this output is not a terminal)" in text

    # Direct: written, the last stable offset stuck at it, the consumer told the partition ends there.
    direct, proxied = text.split("[3/5]", 1)
    assert "-> the broker answered NONE (error code 0): written at offset 0" in direct
    hw, lso = map(int, _one(r"high watermark (\d+), last stable offset (\d+)", direct).groups())
    assert (hw, lso) == (1 + RECORDS + 1, 0)  # the hanging record, the committed ones, their commit marker
    got = _one(r"read_committed consumer: (\d+) of the (\d+) committed records .* ends at offset (\d+): stalled",
               direct)
    assert tuple(map(int, got.groups())) == (0, RECORDS, 0)

    # Through txnguard: refused with the error code, nothing written, the committed records flow.
    client = _one(r"old client \(transactional id (\S+), producer id (\d+)\)", proxied)
    txn_id, pid = client.group(1), int(client.group(2))
    assert '-> refused: INVALID_TXN_STATE (error code 48): "Partition was not added to the transaction"' in proxied
    hw, lso = map(int, _one(r"high watermark (\d+), last stable offset (\d+)", proxied).groups())
    assert (hw, lso) == (RECORDS + 1, RECORDS + 1)
    got = _one(r"read_committed consumer: (\d+) of the (\d+) committed records, in", proxied)
    assert tuple(map(int, got.groups())) == (RECORDS, RECORDS)

    # The metric, the audit record and the proxy's log line all name that one refusal.
    assert _one(r'GET /metrics: txnguard_verification_failures_total\{reason="not_in_transaction"\} (\S+)$',
                text).group(1) == "1.0"
    audit = dict(re.findall(r"^\s+(\w+): (.+)$", text.split("audit record of the refusal", 1)[1].split("Side by")[0],
                            re.MULTILINE))
    assert json.loads(audit["transactional_id"]) == txn_id and int(audit["producer_id"]) == pid
    assert (json.loads(audit["outcome"]), json.loads(audit["decision"]), json.loads(audit["error_name"]),
            int(audit["error_sent"])) == ("not_in_transaction", "rejected", "INVALID_TXN_STATE", 48)
    failed = [r for r in log_lines if r["event"] == "verification_failed"]
    assert [(r["transactional_id"], r["producer_id"], r["decision"], r["error"]) for r in failed] == [
        (txn_id, pid, "rejected", "INVALID_TXN_STATE")]
    assert json.loads(audit["target"]) == failed[0]["target"]

    # The side-by-side table says the same.
    assert _one(r"write outside its transaction\s+NONE \(0\): written\s+INVALID_TXN_STATE \(48\): refused$", text)
    assert _one(rf"last stable offset\s+0 \(stuck\)\s+{RECORDS + 1}$", text)
    assert _one(rf"read_committed consumer got\s+0 of {RECORDS}\s+{RECORDS} of {RECORDS}$", text)

    # Nothing left: Kafka's process gone, the temporary folder removed, no process naming it.
    kafka_pids = [int(p) for p in _one(r"Kafka stopped \(pid ([\d, ]+): gone\)", text).group(1).split(", ")]
    assert kafka_pids and not any(kafka._alive(p) for p in kafka_pids)
    assert list(tmp_path.iterdir()) == []
    assert _processes_naming(tmp_path) == []

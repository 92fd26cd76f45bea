"""When a test of the session failed, the brokers' logs outlive the session's folder (testing/fixtures.py)."""

from __future__ import annotations

import time

from txnguard.testing.fixtures import keep_broker_logs, last_problems, report_kept_logs


def test_the_broker_and_zookeeper_logs_are_copied_and_the_data_is_not(tmp_path):
    root, into = tmp_path / "txnguard-kafka-x", tmp_path / "kept"
    (root / "kafka-3.5.2-3n-0" / "node-1" / "data" / "__transaction_state-4").mkdir(parents=True)
    (root / "kafka-3.5.2-3n-0" / "node-1" / "server.log").write_text("INFO started\n")
    (root / "kafka-3.5.2-3n-0" / "node-1" / "data" / "__transaction_state-4" / "00000000000000000000.log").write_bytes(
        b"\x00" * 10)
    (root / "kafka-3.0.2-1n-zk-1" / "zookeeper" ).mkdir(parents=True)
    (root / "kafka-3.0.2-1n-zk-1" / "zookeeper" / "zookeeper.log").write_text("INFO zk\n")
    kept = keep_broker_logs(root, into)
    assert [p.relative_to(into).as_posix() for p in kept] == [
        "kafka-3.0.2-1n-zk-1/zookeeper/zookeeper.log", "kafka-3.5.2-3n-0/node-1/server.log"]
    assert (into / "kafka-3.5.2-3n-0" / "node-1" / "server.log").read_text() == "INFO started\n"


def test_only_the_last_errors_and_warnings_are_printed(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"[t] {'WARN' if i % 2 else 'INFO'} line {i}\n" for i in range(40)) + "[t] ERROR last\n")
    assert last_problems(log, lines=3) == ["[t] WARN line 37", "[t] WARN line 39", "[t] ERROR last"]


def test_the_summary_names_the_runs_kept_since_the_session_began_and_quotes_their_problems(tmp_path, monkeypatch):
    monkeypatch.setenv("TXNGUARD_FAILED_LOGS", str(tmp_path))
    (tmp_path / "txnguard-kafka-a" / "k" / "node-1").mkdir(parents=True)
    (tmp_path / "txnguard-kafka-a" / "k" / "node-1" / "server.log").write_text("[t] ERROR boom\n[t] INFO fine\n")
    said: list[str] = []
    report_kept_logs(0.0, said.append)
    kept = (tmp_path / "txnguard-kafka-a").resolve()
    assert said == [f"broker logs of a session with failed tests, kept in {kept}: 1",
                    "-- k/node-1/server.log: its last errors and warnings", "[t] ERROR boom"]
    said.clear()
    report_kept_logs(time.time() + 60, said.append)  # kept by an earlier session: not this one's
    assert said == []

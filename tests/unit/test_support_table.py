"""The support table claims only cells a test runs: each "tested:" version, per mode, names a real-broker test.

    README.md and docs/index.md "Which brokers, which mode"
        each row's gateway and sidecar cell: "yes (tested: [ZooKeeper|KRaft] V, V; ...)"
            ─▶ (row, ZooKeeper or KRaft, version, gateway or sidecar)   the same on both pages
    CELL_TESTS: each such cell ─▶ tests under tests/integration/ that start that broker in that mode
        ─▶ every one of them collected by pytest (a renamed test or parameter fails here)

A cell added to the table without a test here, or a test named here that no longer exists, fails. What each
test checks is in the test itself and in the compatibility matrix (docs/reference/compatibility.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md"]
OFF = "3.6 to 3.9 with `transaction.partition.verification.enable=false`"
ON = "3.6 and later with verification on (the default), 4.x"
IT = "tests/integration/"

# (row of the table, ZooKeeper or KRaft, version, mode) -> the tests that run it against a real broker.
CELL_TESTS: dict[tuple[str, str, str, str], list[str]] = {
    ("2.8 (ZooKeeper)", "ZooKeeper", "2.8.2", "gateway"): [
        f"{IT}test_kafka_28.py::test_gateway_s1_s2_s5_prevented_on_2_8_without_asking_the_coordinator",
        f"{IT}test_kafka_28.py::test_gateway_carries_each_client_family_exactly_on_2_8[confluent-kafka]"],
    ("2.8 (ZooKeeper)", "ZooKeeper", "2.8.2", "sidecar"): [
        f"{IT}test_kafka_28.py::test_sidecar_first_write_passes_on_the_coordinators_log_and_s1_s2_are_refused",
        f"{IT}test_kafka_28.py::test_sidecars_carry_each_client_family_exactly_on_2_8[confluent-kafka]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "ZooKeeper", "3.0.2", "gateway"): [
        f"{IT}test_verification.py::test_s1_partition_never_added_hangs_direct_and_is_rejected_through_the_proxy"
        "[kafka-3.0.2-zookeeper]",
        f"{IT}test_zookeeper_matrix.py::test_a_python_family_copies_exactly_once_with_its_offsets[kafka-python-gateway]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "ZooKeeper", "3.4.1", "gateway"): [
        f"{IT}test_verification.py::test_s1_partition_never_added_hangs_direct_and_is_rejected_through_the_proxy"
        "[kafka-3.4.1-zookeeper]",
        f"{IT}test_verification.py::test_valid_transactions_pass_with_local_evidence[kafka-3.4.1-zookeeper]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "KRaft", "3.3.2", "gateway"): [
        f"{IT}test_support_cells.py::test_a_write_to_a_partition_never_added_is_refused[kafka-3.3.2-kraft-gateway]",
        f"{IT}test_support_cells.py::test_a_valid_transaction_commits_through_the_proxy[kafka-3.3.2-kraft-gateway]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "KRaft", "3.5.2", "gateway"): [
        f"{IT}test_verification.py::test_s1_partition_never_added_hangs_direct_and_is_rejected_through_the_proxy"
        "[kafka-3.5.2]",
        f"{IT}test_clients_through_proxy.py::test_plain_produce_and_consume_through_the_gateway[3.5.2-kafka-python]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "ZooKeeper", "3.0.2", "sidecar"): [
        f"{IT}test_zookeeper_matrix.py::test_s1_s2_s5_are_refused_by_the_sidecars_with_the_coordinators_log",
        f"{IT}test_zookeeper_matrix.py::test_a_python_family_copies_exactly_once_with_its_offsets"
        "[confluent-kafka-sidecars]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "KRaft", "3.4.1", "sidecar"): [
        f"{IT}test_support_cells.py::test_a_write_to_a_partition_never_added_is_refused[kafka-3.4.1-kraft-sidecar]",
        f"{IT}test_support_cells.py::test_a_valid_transaction_commits_through_the_proxy[kafka-3.4.1-kraft-sidecar]"],
    ("3.0 to 3.5 (ZooKeeper; KRaft from 3.3)", "KRaft", "3.5.2", "sidecar"): [
        f"{IT}test_sidecar_verification.py::test_s3_never_added_and_late_write_are_rejected_by_the_leaders_sidecar"
        "[kafka-3.5.2]",
        f"{IT}test_clients_through_proxy.py::test_confluent_kafka_through_sidecars[3.5.2]"],
    (OFF, "KRaft", "3.9.2", "gateway"): [
        f"{IT}test_verification.py::test_s1_partition_never_added_hangs_direct_and_is_rejected_through_the_proxy"
        "[kafka-3.9.2-verification-off]"],
    (OFF, "KRaft", "3.9.2", "sidecar"): [
        f"{IT}test_sidecar_verification.py::test_s3_never_added_and_late_write_are_rejected_by_the_leaders_sidecar"
        "[kafka-3.9.2-verification-off]"],
    (ON, "KRaft", "3.9.2", "gateway"): [
        f"{IT}test_clients_through_proxy.py::test_plain_produce_and_consume_through_the_gateway[3.9.2-kafka-python]",
        f"{IT}test_clients_through_proxy.py::test_consume_transform_produce_with_offsets_in_the_transaction"
        "[3.9.2-confluent-kafka]"],
    (ON, "KRaft", "4.4.0", "gateway"): [
        f"{IT}test_clients_through_proxy.py::test_plain_produce_and_consume_through_the_gateway[4.4.0-kafka-python]",
        f"{IT}test_tv2_clients.py::test_tv2_java_client_passes_through_untouched"],
    (ON, "KRaft", "3.9.2", "sidecar"): [
        f"{IT}test_support_cells.py::test_a_write_to_a_partition_never_added_is_refused[kafka-3.9.2-kraft-sidecar]",
        f"{IT}test_support_cells.py::test_a_valid_transaction_commits_through_the_proxy[kafka-3.9.2-kraft-sidecar]"],
    (ON, "KRaft", "4.4.0", "sidecar"): [
        f"{IT}test_support_cells.py::test_a_write_to_a_partition_never_added_is_refused[kafka-4.4.0-kraft-sidecar]",
        f"{IT}test_support_cells.py::test_a_valid_transaction_commits_through_the_proxy[kafka-4.4.0-kraft-sidecar]"],
}


def table_rows(text: str) -> list[list[str]]:
    """The rows (cells stripped) of the table under "## Which brokers, which mode"."""
    section = text.split("## Which brokers, which mode", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    assert rows[0][:3] == ["Kafka brokers", "gateway", "sidecar"], rows[0]
    return rows[1:]


def claimed_cells(text: str) -> set[tuple[str, str, str, str]]:
    cells = set()
    for row in table_rows(text):
        label = row[0]
        default = "ZooKeeper" if label.endswith("(ZooKeeper)") else "KRaft"
        for mode, cell in (("gateway", row[1]), ("sidecar", row[2])):
            m = re.fullmatch(r"yes \(tested: ([^)]*)\)", cell)
            if m is None:
                assert cell == "no", f"{label} / {mode}: {cell!r} is neither 'no' nor 'yes (tested: ...)'"
                continue
            for part in m.group(1).split(";"):
                kind = re.match(r"\s*(ZooKeeper|KRaft)\s", part)
                versions = re.findall(r"\d+\.\d+\.\d+", part)
                assert versions, f"{label} / {mode}: no version in {part!r}"
                cells.update((label, kind.group(1) if kind else default, v, mode) for v in versions)
    return cells


def test_the_parser_reads_a_claim_and_refuses_a_cell_it_cannot_read() -> None:
    text = ("## Which brokers, which mode\n\n| Kafka brokers | gateway | sidecar | what |\n| --- | --- | --- | --- |\n"
            "| 3.0 (ZooKeeper; KRaft from 3.3) | yes (tested: ZooKeeper 3.0.2; KRaft 3.3.2) | no | x |\n")
    assert claimed_cells(text) == {("3.0 (ZooKeeper; KRaft from 3.3)", "ZooKeeper", "3.0.2", "gateway"),
                                   ("3.0 (ZooKeeper; KRaft from 3.3)", "KRaft", "3.3.2", "gateway")}
    with pytest.raises(AssertionError):
        claimed_cells(text.replace("| no |", "| yes |"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_tested_cell_of_the_table_names_its_tests(page: Path) -> None:
    claimed = claimed_cells(page.read_text())
    assert sorted(claimed - CELL_TESTS.keys()) == [], "cells the table claims tested with no test named here"
    assert sorted(CELL_TESTS.keys() - claimed) == [], "cells named here that the table no longer claims"


def test_the_readme_and_the_front_page_claim_the_same_cells() -> None:
    readme, front = (table_rows(p.read_text()) for p in PAGES)
    # The same words; the README's links start at the repository's root, the site's at docs/.
    assert [[c.replace("](docs/", "](") for c in r[:4]] for r in readme] == [r[:4] for r in front]


def test_every_named_test_exists() -> None:
    files = sorted({node.split("::")[0] for nodes in CELL_TESTS.values() for node in nodes})
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *files], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = set(collected.stdout.split())
    missing = [node for nodes in CELL_TESTS.values() for node in nodes if node not in ids]
    assert missing == []

"""The native data path (txnguard._native): present in this install, used by the relay, and when it is missing
or panics, the proxy stays correct and says so.

    make test ─▶ pip install -e . (maturin builds native/) ─▶ txnguard._native importable
    a transactional write with local evidence ─▶ read in place by the native reader ─▶ passed, one write
    the native reader panics ─▶ what was booked before it leaves ─▶ Close("native_panic"), this connection only
    (any native code: the Produce reader, the life-cycle readers on either side, the registry on the general path)
    no native module ─▶ every frame through the general path, a log line, a metric at 0, /readyz's detail
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from connection_playbook import (
    T0,
    Playbook,
    add_partitions,
    add_partitions_response,
    heartbeat,
    heartbeat_response,
    produce,
    to_broker,
    to_client,
)

from txnguard.codecs import lifecycle_scan, log_fetch, native
from txnguard.codecs.errors import CodecError, DecodeFailed
from txnguard.connection.commands import Close, SendToBroker
from txnguard.testing.fetch_answers import fetch_answer
from txnguard.verification import decisions, registry


def _identified(pb: Playbook) -> None:
    pb.relays(heartbeat(0))
    pb.delivers(heartbeat_response(0))


def test_this_install_has_the_native_data_path() -> None:
    # make test builds it (pip install -e . through maturin): a test run without it would test the general path
    # only and call the fast path proven.
    assert native.AVAILABLE, native.MISSING
    assert native.VERSION and native.scan_transactional is not native._absent


def test_a_transactional_write_with_local_evidence_is_read_by_the_native_reader(monkeypatch) -> None:
    calls: list[tuple[int, int, bool]] = []
    real = decisions.scan_transactional

    def counting(data, start, stop, flexible):  # type: ignore[no-untyped-def]
        calls.append((start, stop, flexible))
        return real(data, start, stop, flexible)

    monkeypatch.setattr(decisions, "scan_transactional", counting)
    pb = Playbook()
    _identified(pb)
    pb.transaction_with(T0)
    write = produce(1, [T0])
    # client ─▶ Produce (transactional, T0 added) ─▶ the native reader ─▶ passed on local evidence ─▶ broker
    out = pb.client_sends(write)
    assert out == [SendToBroker([write])]
    assert len(calls) == 1 and calls[0][1] == len(write)
    assert pb.conn.ledger.passed  # booked as the general path's Decided would have


def _panics(*_: object, **__: object) -> None:
    raise native.PanicException("index out of bounds")


def _two_connections() -> tuple[Playbook, Playbook]:
    """Two connections of one proxy, each past its first request (the client named)."""
    pb, other = Playbook(), Playbook()
    _identified(pb)
    _identified(other)
    return pb, other


def _closed_alone(pb: Playbook, other: Playbook, out: Any, side: str) -> None:
    """`out` closed `pb` for a native panic on `side` ("request" or "response"), and `other` goes on."""
    [close] = out.see(Close)
    assert close.reason == "native_panic" and close.level == "error"
    assert f"on a {side}: index out of bounds" in close.detail
    assert pb.conn.closed
    other.relays(heartbeat(2))


def test_a_panic_in_the_native_reader_closes_only_that_connection(monkeypatch) -> None:
    monkeypatch.setattr(decisions, "scan_transactional", _panics)
    pb, other = _two_connections()
    pb.transaction_with(T0)
    before = heartbeat(1)
    # client ─▶ Heartbeat, Produce ─▶ the Heartbeat booked ─▶ the reader panics on the Produce ─▶ the Heartbeat
    # leaves, the Produce does not, the connection closes with its reason
    out = pb.client_sends(before, produce(2, [T0]))
    assert to_broker(out) == before
    _closed_alone(pb, other, out, "request")


@pytest.mark.parametrize("where", ["the native observer", "the Python reader"])
def test_a_panic_reading_a_life_cycle_request_closes_only_that_connection(monkeypatch, where: str) -> None:
    # The native observer reads and observes in one call (the registry and the ledger native); with the Python
    # registry the rules read with the native reader and observe in Python.
    pb, other = _two_connections()
    if where == "the native observer":
        assert pb.rules._native_state()
        monkeypatch.setattr(decisions, "_native_observe_request", _panics)
    else:
        pb.rules.registry = registry.PythonRegistry()
        monkeypatch.setattr(lifecycle_scan, "_read_request", _panics)
    before = heartbeat(1)
    # client ─▶ Heartbeat, AddPartitionsToTxn ─▶ the Heartbeat booked ─▶ the reader panics on the add ─▶ the
    # Heartbeat leaves, the add does not, the connection closes with its reason
    out = pb.client_sends(before, add_partitions(2, [T0]))
    assert to_broker(out) == before
    _closed_alone(pb, other, out, "request")


@pytest.mark.parametrize("where", ["the native book", "the Python reader"])
def test_a_panic_reading_a_life_cycle_answer_closes_only_that_connection(monkeypatch, where: str) -> None:
    # The native book learns from the answer with the native registry in its own loop (native/src/book.rs): the
    # panic is raised inside that loop, where it asks the connection's clock for the answer's time.
    pb, other = _two_connections()
    if where == "the Python reader":
        pb.rules.registry = registry.PythonRegistry()
    pb.relays(heartbeat(1), add_partitions(2, [T0]))
    if where == "the native book":
        assert pb.rules._native_state()
        monkeypatch.setattr(pb.conn.clock, "wall_ms", _panics)
    else:
        monkeypatch.setattr(lifecycle_scan, "_read_response", _panics)
    # broker ─▶ Heartbeat's answer, AddPartitionsToTxn's answer ─▶ the first passes ─▶ the reader panics on the
    # second ─▶ it does not reach the client, the connection closes
    out = pb.broker_answers(heartbeat_response(1), add_partitions_response(2, [T0]))
    assert to_client(out) == heartbeat_response(1)
    _closed_alone(pb, other, out, "response")


def test_a_panic_in_the_registry_on_the_general_path_closes_only_that_connection(monkeypatch) -> None:
    pb, other = _two_connections()
    pb.relays(add_partitions(1, [T0]))
    monkeypatch.setattr(pb.registry, "added", _panics)
    answer = add_partitions_response(1, [T0])
    # broker ─▶ half the answer (read in part: the general path) ─▶ the rest ─▶ the registry panics learning
    # from it ─▶ the connection closes with its reason
    assert pb.broker_answers(answer[:7]) == []
    _closed_alone(pb, other, pb.broker_answers(answer[7:]), "response")


def test_a_panic_in_the_followers_native_reader_or_packer_is_a_codec_error_its_loops_handle(monkeypatch) -> None:
    # broker ─▶ a Fetch answer of __transaction_state ─▶ the native reader panics ─▶ DecodeFailed, a CodecError:
    # the follower's loops catch it (say the problem, drop the connection, read again after a backoff), where
    # the panic itself would have escaped into the event loop and left the round's waiter unanswered.
    monkeypatch.setattr(native, "read_log_answer", _panics)
    answer = fetch_answer(7, [])
    with pytest.raises(DecodeFailed, match="panicked: index out of bounds") as raised:
        log_fetch.read_log_answer(memoryview(answer), {})
    assert isinstance(raised.value, CodecError)
    # The same for its request's packer: a CodecError before anything is sent (no waiter left behind).
    monkeypatch.setattr(native, "fetch_request", _panics)
    with pytest.raises(CodecError, match="panicked: index out of bounds"):
        log_fetch.fetch_request(1, "txnguard", "__transaction_state", [], max_wait_ms=500, min_bytes=1,
                                max_bytes=1 << 20)


def test_without_the_native_module_every_frame_takes_the_general_path() -> None:
    script = """
import json, sys
sys.modules["txnguard._native"] = None  # as an install built without cargo: the import fails
from txnguard.codecs import native
from txnguard.connection.core import Connection
from txnguard.proxy import server
from txnguard.verification import in_doubt, registry
sys.path.insert(0, "tests/unit")
from connection_playbook import Playbook
print(json.dumps({"available": native.AVAILABLE, "missing": native.MISSING,
                  "fast": Playbook().conn._fast, "note": server.NATIVE_MISSING_NOTE,
                  "state": [registry.Registry.__name__, in_doubt.EndTxnLedger.__name__, in_doubt.SentEndTxn.__name__]}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["available"] is False and "txnguard._native" in seen["missing"]
    assert seen["fast"] is False  # the relay reads nothing in place: the general path (kio) takes every frame
    assert "general path" in seen["note"]
    # The state the rules read is the Python one's (the native one's oracle in the property tests).
    assert seen["state"] == ["PythonRegistry", "PythonEndTxnLedger", "PythonSentEndTxn"]

"""The audit record contract (schema_version 2) and the per-connection inventory, pure.

    session ──ApiVersions / Produce / TxnOffsetCommit ...──▶ ConnectionInventory (read in place)
    session closes ──▶ connection_record(inventory, client) ──▶ file | topic (key: first transactional id)
    guard decides  ──▶ audit_record(...)                   ──▶ file | topic (key: transactional id)
"""

from __future__ import annotations

from typing import Any

import pytest

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.header import peek_request
from txnguard.testing.raw import ProducerIdentity, RawClient, build_batch
from txnguard.verification.audit import (
    ClientInfo,
    audit_record,
    connection_record,
    identified,
    record_key,
)
from txnguard.verification.inventory import ConnectionInventory, transactional_id
from txnguard.verification.verdicts import Evidence, Outcome, Verdict

PRODUCER = ProducerIdentity(4000, 3)
CLIENT = ClientInfo("app-1", "confluent-kafka-python", "2.16.1-rdkafka-2.16.1", "librdkafka", "broker-1", 17)


class _Frames(RawClient):
    """The raw client's request builders, returning the encoded request body instead of sending it."""

    def __init__(self) -> None:
        self.client_id = "app-1"

    def request(self, payload: Any, *, expect_response: bool = True) -> Any:
        return self.encode(payload, 7)[4:]


FRAMES = _Frames()


def _feed(inv: ConnectionInventory, body: bytes, transactional: bool | None = None) -> None:
    head = peek_request(body)
    inv.request(head, body)
    if head.api_key == ApiKey.PRODUCE:
        inv.produce(head, body, bool(transactional))


def test_decision_record_is_version_2_with_kind_and_proxy_id():
    verdict = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "partition not added", None)
    r = audit_record(time_ms=1000, transactional_id="t1", producer_id=4000, producer_epoch=3, api="produce",
                     api_version=9, target="orders-0", verdict=verdict, decision="rejected", error_sent=48,
                     error_name="INVALID_TXN_STATE", latency_ms=1.23456, client=CLIENT, mode="enforce",
                     proxy_id="gateway@gw.example:9092")
    assert (r["schema_version"], r["kind"], r["proxy_id"]) == (2, "decision", "gateway@gw.example:9092")
    assert (r["transactional_id"], r["outcome"], r["evidence"], r["latency_ms"]) == \
        ("t1", "not_in_transaction", "coordinator", 1.2346)
    assert record_key(r) == "t1"


def test_connection_record_has_exactly_the_contract_fields():
    inv = ConnectionInventory("10.0.0.5:51234", connected_ms=500)
    _feed(inv, FRAMES.init_producer_id("orders-txn", version=3))
    _feed(inv, FRAMES.produce({("orders", 0): build_batch([b"v"])}, transactional_id="orders-txn", version=9), True)
    _feed(inv, FRAMES.produce({("orders", 0): build_batch([b"v"])}, transactional_id="orders-txn", version=7), True)
    _feed(inv, FRAMES.txn_offset_commit("orders-txn", PRODUCER, "g", {"orders": {0: 1}}, version=3))
    r = connection_record(time_ms=900, proxy_id="sidecar@b1:9092", client=CLIENT, inventory=inv,
                          close_reason="client_closed")
    assert r == {
        "schema_version": 2, "kind": "connection", "proxy_id": "sidecar@b1:9092", "time_ms": 900,
        "connected_ms": 500, "connection_id": 17, "listener": "broker-1", "client_address": "10.0.0.5:51234",
        "client_id": "app-1", "client_software_name": "confluent-kafka-python",
        "client_software_version": "2.16.1-rdkafka-2.16.1", "client_family": "librdkafka",
        "first_transactional_id": "orders-txn", "used_transactions": True, "produce_versions": [7, 9],
        "txn_offset_commit_versions": [3], "close_reason": "client_closed",
    }
    assert record_key(r) == "orders-txn"


def test_a_plain_producer_connection_has_no_transactional_id_and_a_null_key():
    inv = ConnectionInventory("10.0.0.6:1", connected_ms=0)
    _feed(inv, FRAMES.init_producer_id(None, version=4))  # idempotent producer: InitProducerId, no id
    _feed(inv, FRAMES.produce({("logs", 0): build_batch([b"v"])}, version=8), False)
    r = connection_record(time_ms=1, proxy_id="p", client=CLIENT, inventory=inv, close_reason="idle")
    assert (r["first_transactional_id"], r["used_transactions"], r["produce_versions"]) == (None, False, [8])
    assert record_key(r) is None


def test_the_first_transactional_id_stays_the_first():
    inv = ConnectionInventory("x:1", connected_ms=0)
    _feed(inv, FRAMES.add_offsets_to_txn("first", PRODUCER, "g", version=2))
    _feed(inv, FRAMES.end_txn("second", PRODUCER, True, version=3))
    assert (inv.first_transactional_id, inv.used_transactions) == ("first", True)


@pytest.mark.parametrize("version", range(3, 12))
def test_produce_transactional_id_is_read_in_place_for_every_pre_tv2_version(version):
    body = FRAMES.produce({("t", 0): build_batch([b"v"])}, transactional_id="txn-é", version=version)
    assert transactional_id(peek_request(body), body) == "txn-é"


@pytest.mark.parametrize(("build", "versions"), [
    (lambda v: FRAMES.init_producer_id("tid", version=v), range(0, 5)),
    (lambda v: FRAMES.add_partitions_to_txn("tid", PRODUCER, {"t": [0]}, version=v), range(0, 4)),
    (lambda v: FRAMES.add_offsets_to_txn("tid", PRODUCER, "g", version=v), range(0, 4)),
    (lambda v: FRAMES.end_txn("tid", PRODUCER, True, version=v), range(0, 4)),
    (lambda v: FRAMES.txn_offset_commit("tid", PRODUCER, "g", {"t": {0: 1}}, version=v), range(2, 5)),
])
def test_transactional_requests_name_their_id_in_place(build, versions):
    for v in versions:
        body = build(v)
        assert transactional_id(peek_request(body), body) == "tid", v


def test_an_unreadable_request_names_nothing_and_never_raises():
    body = FRAMES.produce({("t", 0): build_batch([b"v"])}, transactional_id="tid", version=9)
    head = peek_request(body)
    assert transactional_id(head, body[:16]) is None         # cut inside the transactional id
    assert transactional_id(head, body[:9]) is None          # cut inside the header
    old = FRAMES.produce({("t", 0): build_batch([b"v"])}, version=3)
    assert transactional_id(peek_request(old), old) is None  # null transactional id


def test_only_a_connection_that_named_itself_is_in_the_inventory():
    anonymous = ClientInfo("", None, None, "unknown", "bootstrap", 1)
    assert not identified(anonymous)
    assert identified(ClientInfo("", "kcat", "1.7", "librdkafka", "bootstrap", 1))
    assert identified(ClientInfo("app", None, None, "unknown", "bootstrap", 1))

"""S7 parity: what a client sees from Kafka 3.9.2 with native KIP-890 verification ON is what it sees
from txnguard in front of Kafka 3.5.2 (which has none). Same request sequences, same error codes
and messages; S4 (coordinator unavailable) parity is in test_coordinator_unavailable.py.
"""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import gateway_for
from txnguard.testing.scenarios import TxnActor, wait_stable

pytestmark = pytest.mark.integration




def _never_added(bootstrap: str, cluster_bootstrap: str, topic: str, txn_id: str) -> tuple[int, str | None]:
    actor = TxnActor(bootstrap, txn_id)
    actor.init()
    r = actor.produce(topic, 0, [b"x"])
    return r.error_code, r.error_message


def _late_write(bootstrap: str, cluster_bootstrap: str, topic: str, txn_id: str) -> tuple[int, str | None]:
    actor = TxnActor(bootstrap, txn_id)
    actor.init()
    actor.add_partitions(topic, 0)
    actor.produce(topic, 0, [b"in"])
    actor.end(commit=False)
    wait_stable(cluster_bootstrap, topic)
    # Markers can be on the partition while the coordinator is still completing the abort: the broker
    # answers NOT_ENOUGH_REPLICAS (CONCURRENT_TRANSACTIONS underneath), which clients retry.
    for _ in range(50):
        r = actor.produce(topic, 0, [b"late"], sequence=1)
        if r.error_code != ErrorCode.not_enough_replicas:
            break
        time.sleep(0.1)
    return r.error_code, r.error_message


def _offsets_not_added(bootstrap: str, cluster_bootstrap: str, topic: str, txn_id: str) -> tuple[int, str | None]:
    actor = TxnActor(bootstrap, txn_id)
    actor.init()
    actor.add_partitions(topic, 0)
    codes = actor.commit_offsets(f"group-{txn_id}", {topic: {0: 1}})
    for _ in range(50):  # a fresh group coordinator may still be loading
        if codes[0] not in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress):
            break
        time.sleep(0.2)
        codes = actor.commit_offsets(f"group-{txn_id}", {topic: {0: 1}})
    return codes[0], None


SCENARIOS = {"s1-never-added": _never_added, "s2-late-write": _late_write, "s5-offsets-not-added": _offsets_not_added}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_proxy_on_3_5_answers_like_native_verification_on_3_9(scenario, kafka_pool, start_proxy, unique_name):
    run = SCENARIOS[scenario]
    native = kafka_pool.get("3.9.2", 1)  # transaction.partition.verification.enable defaults to true
    old = kafka_pool.get("3.5.2", 1)
    proxy = gateway_for(old, start_proxy)

    topic_native = fresh_topic(native, unique_name("native"))
    topic_proxied = fresh_topic(old, unique_name("proxied"))
    native_answer = run(native.bootstrap_servers, native.bootstrap_servers, topic_native, unique_name("txn"))
    proxied_answer = run(proxy.bootstrap, old.bootstrap_servers, topic_proxied, unique_name("txn"))

    assert native_answer[0] != ErrorCode.none, f"3.9.2 accepted the {scenario} write: is verification on?"
    assert proxied_answer == native_answer

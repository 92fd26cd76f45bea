"""KIP-588 for old clients, on Kafka 3.5.2: a transaction the coordinator timed out, survived through the proxy.

Every run: init, begin, one record, stall past transaction.timeout.ms (2 s; the harness's
brokers scan for timed-out transactions every second), then commit:

    client ─EndTxn(COMMIT, E)─▶ proxy          coordinator: CompleteAbort at E+1 (it timed E out)
      without the option: forwarded ─▶ PRODUCER_FENCED: fatal, the producer must be closed
      with it: answered with the family's abortable error (Java 49, librdkafka 59)
    client ─abort ... InitProducerId(pid, E)─▶ proxy ─InitProducerId(pid, E+1)─▶ coordinator: E+2
    client ─next transaction at E+2─▶ committed

The control: a second producer (straight to the broker, where the proxy cannot see it)
initialises the same transactional id after the timeout and commits; the first one's commit
through the proxy, option on, still ends in its fatal fence. docs/concepts/timeout-recovery.md
has the table for every family, from these runners (txnguard.testing.stalls).
"""

from __future__ import annotations

import time

import pytest

from txnguard.testing import stalls
from txnguard.testing.clients import ConfluentKafkaClient
from txnguard.testing.fixtures import ClusterPool, fresh_topic
from txnguard.testing.proxy import gateway_for

pytestmark = pytest.mark.integration

TIMEOUT_MS, STALL_MS = 2000, 5000  # the coordinator aborts between 2 and 3 s (its 1 s scan); 2 s of margin


def _rewrites(proxy, api: str) -> float:
    """txnguard_error_rewrites for one API, over every label set."""
    return sum(sample.value for family in proxy.proxy.metrics.registry.collect() for sample in family.samples
               if sample.name == "txnguard_error_rewrites_total" and sample.labels.get("api") == api)


def _committed(cluster, topic):
    return ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic, [0], timeout_s=30)


@pytest.fixture
def cluster(kafka_pool: ClusterPool):
    return kafka_pool.get("3.5.2")


@pytest.mark.java
@pytest.mark.parametrize("recovery", [False, True], ids=["without", "with"])
def test_java_commit_after_a_coordinator_timeout(cluster, start_proxy, unique_name, recovery):
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": recovery})
    run = stalls.java("3.5.2", proxy.bootstrap, topic, unique_name("txn"), TIMEOUT_MS, STALL_MS, "commit")
    if recovery:
        assert run.steps == [("first-send", "ok"), ("commit", run.steps[1][1]), ("abort", "ok"),
                             ("next-transaction", "ok")], run.steps
        assert run.steps[1][1].startswith("InvalidPidMappingException"), run.steps
        assert run.outcome == "recovered"
        assert _committed(cluster, topic) == [b"recovered"]  # the timed-out record stays aborted
        # EndTxn(commit) answered INVALID_PRODUCER_ID_MAPPING, EndTxn(abort) NONE, InitProducerId at E+1.
        assert _rewrites(proxy, "end_txn") == 2 and _rewrites(proxy, "init_producer_id") == 1
    else:
        assert run.first_error() is not None and run.first_error()[1].startswith("ProducerFencedException"), run.steps
        assert run.outcome == "failed"


@pytest.mark.parametrize("recovery", [False, True], ids=["without", "with"])
def test_confluent_kafka_commit_after_a_coordinator_timeout(cluster, start_proxy, unique_name, recovery):
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": recovery})
    run = stalls.confluent(proxy.bootstrap, topic, unique_name("txn"), TIMEOUT_MS, STALL_MS, "commit")
    step, result = run.first_error() or ("", "")
    assert step == "commit"
    if recovery:
        assert "UNKNOWN_PRODUCER_ID" in result and "FATAL" not in result, run.steps
        assert run.outcome == "recovered", run.steps
        assert _committed(cluster, topic) == [b"recovered"]
    else:
        assert "FATAL" in result and "_FENCED" in result, run.steps
        assert run.outcome == "failed"


def test_sarama_commit_after_a_coordinator_timeout_recovers_with_the_option(cluster, start_proxy, unique_name):
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": True})
    run = stalls.sarama(proxy.bootstrap, topic, unique_name("txn"), TIMEOUT_MS, STALL_MS, "commit")
    # sarama-paced aborts on the abortable commit error and runs the transaction again, at E+2.
    assert run.outcome == "recovered", run.steps
    assert "could not locate the producer metadata" in run.steps[1][1], run.steps  # UNKNOWN_PRODUCER_ID
    assert len(_committed(cluster, topic)) == 1
    assert _rewrites(proxy, "init_producer_id") == 1


def test_kafka_python_send_after_a_coordinator_timeout_is_recovered_by_its_own_bump(cluster, start_proxy,
                                                                                      unique_name):
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": True})
    run = stalls.kafka_python(proxy.bootstrap, topic, unique_name("txn"), TIMEOUT_MS, STALL_MS, "send")
    assert run.outcome == "recovered", run.steps
    assert _committed(cluster, topic) == [b"recovered"]


def test_a_second_producer_still_fences_the_first_with_the_option_on(cluster, start_proxy, unique_name):
    """The deceptive order: the coordinator times the first producer's transaction out (E+1), then a
    second producer, straight to the broker, initialises the id (E+2) and commits. The first one's
    commit through the proxy must still meet its fence, fatally."""
    from confluent_kafka import Producer

    topic = fresh_topic(cluster, unique_name("t"))
    txn_id = unique_name("txn")
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": True})

    def second_producer() -> None:
        p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id,
                      "transaction.timeout.ms": TIMEOUT_MS * 10})
        p.init_transactions(20)
        p.begin_transaction()
        p.produce(topic, b"second-producer", partition=0)
        p.commit_transaction(20)

    run = stalls.confluent(proxy.bootstrap, topic, txn_id, TIMEOUT_MS, STALL_MS, "commit", meanwhile=second_producer)
    step, result = run.first_error() or ("", "")
    assert step == "commit" and "FATAL" in result and "_FENCED" in result, run.steps
    assert run.outcome == "failed"
    assert _committed(cluster, topic) == [b"second-producer"]
    assert _rewrites(proxy, "end_txn") == 0 and _rewrites(proxy, "init_producer_id") == 0



def test_the_fence_window_a_new_producer_still_wins(cluster, start_proxy, unique_name):
    """A new producer's InitProducerId meets the first one's ongoing transaction: the coordinator
    fences and aborts it (CompleteAbort at E+1, the same picture as a timeout) and answers
    CONCURRENT_TRANSACTIONS, handing out no epoch. The first producer, past its timeout, claims E+2
    through the proxy and commits once more, as if the new producer had come a moment later; the new
    producer's retry bumps past it, and the first one's next transaction meets its fatal fence."""
    from confluent_kafka import KafkaException, Producer
    from kio.schema.errors import ErrorCode

    from txnguard.testing import raw

    topic, txn_id = fresh_topic(cluster, unique_name("t")), unique_name("txn")
    proxy = gateway_for(cluster, start_proxy, policy={"timeout_recovery": True})
    first = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": txn_id,
                      "transaction.timeout.ms": TIMEOUT_MS, "message.timeout.ms": TIMEOUT_MS})
    first.init_transactions(20)
    first.begin_transaction()
    first.produce(topic, b"stalled", partition=0)
    first.flush(10)
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:  # the new producer, straight to the broker
        assert c.init_producer_id(txn_id, 60000).error_code == ErrorCode.concurrent_transactions
    time.sleep(STALL_MS / 1000)
    with pytest.raises(KafkaException) as abortable:
        first.commit_transaction(20)
    assert abortable.value.args[0].txn_requires_abort() and not abortable.value.args[0].fatal()
    first.abort_transaction(20)
    first.begin_transaction()
    first.produce(topic, b"one-more", partition=0)
    first.commit_transaction(20)
    with raw.RawClient.connect(cluster.bootstrap_servers) as c:  # the new producer's retries, as a client's
        deadline = time.monotonic() + 10
        while (code := c.init_producer_id(txn_id, 60000).error_code) == ErrorCode.concurrent_transactions \
                and time.monotonic() < deadline:
            time.sleep(0.05)  # the first producer's commit markers are being written
        assert code == ErrorCode.none
    first.begin_transaction()
    first.produce(topic, b"zombie", partition=0)
    with pytest.raises(KafkaException) as fenced:
        first.commit_transaction(20)
    assert fenced.value.args[0].fatal(), fenced.value
    assert _committed(cluster, topic) == [b"one-more"]

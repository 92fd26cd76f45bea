"""IBM/sarama as a client family: how the proxy recognises it, and that its errors get the reaction we want.

The reactions below are a model of Sarama v1.61.1 (the version tools/sarama-paced pins), read from its
source; each set names the place it comes from.
"""

from __future__ import annotations

import pytest

from txnguard.policies.error_mapping import PRODUCE, TXN_OFFSET_COMMIT
from txnguard.policies.families import DEFAULT_RULES, SARAMA, classify
from txnguard.policies.outcomes import Outcome
from txnguard.policies.policy import policy_from_config

RETRIED, ABORTABLE, FATAL = "retried", "abortable", "fatal"

# async_producer.go brokerProducer.handleSuccess: the only codes retried (Producer.Retry.Max times).
PRODUCE_RETRIED = {2, 3, 5, 6, 7, 19, 20, 56}
# async_producer.go maybeTransitionToErrorState: cluster auth, unsupported version, txn id auth,
# producer id mapping, producer fenced; every other failed batch is abortable.
PRODUCE_FATAL = {31, 35, 49, 53, 90}
# transaction_manager.go publishOffsetsToTxn (TxnOffsetCommit): 7, 15 and 16 (coordinator refreshed), 3 and 14
# explicitly, then any code isRetriableTxnError names; Producer.Transaction.Retry.Max (50) times.
TXN_OFFSET_COMMIT_RETRIED = {2, 3, 5, 6, 7, 9, 13, 14, 15, 16, 19, 20, 41, 51, 56, 70, 71, 72, 74, 75, 78, 80, 83, 84,
                             88, 89}
TXN_OFFSET_COMMIT_ABORTABLE = {22, 25, 30, 82}


def sarama_reaction(api: str, code: int) -> str:
    if api == PRODUCE:
        return RETRIED if code in PRODUCE_RETRIED else FATAL if code in PRODUCE_FATAL else ABORTABLE
    if code in TXN_OFFSET_COMMIT_RETRIED:
        return RETRIED
    return ABORTABLE if code in TXN_OFFSET_COMMIT_ABORTABLE else FATAL


@pytest.mark.parametrize(("software_name", "client_id", "family"), [
    ("sarama", "sarama", SARAMA),         # what Sarama sends by default (measured through the proxy)
    ("sarama", "orders-service", SARAMA),  # a user's Config.ClientID
    ("sarama", "producer-1", SARAMA),     # the software name wins over a Java-looking client id
    ("sarama", None, SARAMA),
    (None, "sarama", SARAMA),             # Config.ApiVersionsRequest=false: no software name
    ("sarama-fork", "x", "unknown"),
    (None, "sarama-1", "unknown"),
    ("apache-kafka-java", "sarama", "java"),
])
def test_sarama_is_recognised_by_its_kip511_name_then_its_default_client_id(software_name, client_id, family):
    assert classify(DEFAULT_RULES, software_name, client_id, "bootstrap") == family


def test_a_config_rule_in_front_can_still_reclassify_sarama():
    p = policy_from_config({"families": [{"family": "java", "software_name": "sarama", "listener": "legacy"}]})
    assert p.family("sarama", "sarama", "legacy") == "java"
    assert p.family("sarama", "sarama", "bootstrap") == SARAMA


# What each outcome must make Sarama do. Produce: a coordinator it cannot reach is the one case to
# retry (the only retriable answer: 14, 15, 16 and 51 would abort the transaction); a partition not in
# the transaction or a late write aborts it (as KIP-890 intends); a mapping loss is fatal (as from a
# broker). TxnOffsetCommit: an unreachable or busy coordinator is retried, whatever the underlying error.
WANTED = {
    (PRODUCE, Outcome.NOT_IN_TRANSACTION): {ABORTABLE},
    (PRODUCE, Outcome.LATE_WRITE): {ABORTABLE},
    (PRODUCE, Outcome.COORDINATOR_RETRIABLE): {RETRIED},
    (PRODUCE, Outcome.FENCED): {ABORTABLE, FATAL},  # 47: abortable, then its EndTxn(abort) is fenced: fatal
    (PRODUCE, Outcome.PRODUCER_ID_MAPPING): {FATAL},
    (PRODUCE, Outcome.INVALID_RECORD): {ABORTABLE},
    (TXN_OFFSET_COMMIT, Outcome.NOT_IN_TRANSACTION): {FATAL},  # no abortable code means "not added"
    (TXN_OFFSET_COMMIT, Outcome.LATE_WRITE): {FATAL},
    (TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE): {RETRIED},
    (TXN_OFFSET_COMMIT, Outcome.FENCED): {FATAL},
    (TXN_OFFSET_COMMIT, Outcome.PRODUCER_ID_MAPPING): {FATAL},
    (TXN_OFFSET_COMMIT, Outcome.INVALID_RECORD): {FATAL},
}


@pytest.mark.parametrize(("api", "outcome"), list(WANTED))
@pytest.mark.parametrize("underlying", [None, "NETWORK_EXCEPTION", "COORDINATOR_NOT_AVAILABLE",
                                        "CONCURRENT_TRANSACTIONS"])
def test_every_answer_the_proxy_gives_sarama_gets_the_reaction_wanted(api, outcome, underlying):
    code = policy_from_config({}).error_for(api, outcome, SARAMA, underlying).code
    assert sarama_reaction(api, code) in WANTED[api, outcome], (api, outcome, underlying, code)


def test_sarama_on_produce_gets_what_a_broker_answers_and_never_a_code_it_would_abort_on():
    p = policy_from_config({})
    assert p.error_for(PRODUCE, Outcome.COORDINATOR_RETRIABLE, SARAMA, "NETWORK_EXCEPTION").code == 19
    assert p.error_for(PRODUCE, Outcome.NOT_IN_TRANSACTION, SARAMA).code == 48
    assert p.error_for(TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE, SARAMA, "NETWORK_EXCEPTION").code == 14
    assert p.error_for(TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE, SARAMA, "NOT_COORDINATOR").code == 15
    for outcome in WANTED.keys() & {(PRODUCE, o) for o in Outcome}:
        assert p.error_for(*outcome, SARAMA).code not in {14, 15, 16, 51}


def test_a_user_override_for_sarama_replaces_one_cell():
    p = policy_from_config({"errors": {"sarama": {"produce": {"not_in_transaction": 120}}}})
    assert p.error_for(PRODUCE, Outcome.NOT_IN_TRANSACTION, SARAMA).code == 120
    assert p.error_for(PRODUCE, Outcome.COORDINATOR_RETRIABLE, SARAMA).code == 19

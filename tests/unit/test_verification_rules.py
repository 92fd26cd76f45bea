"""The KIP-890 rules: request-level checks, coordinator answers, leader answers, error mapping."""

from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from txnguard.codecs.batches import BatchHead
from txnguard.codecs.describe_transactions import DescribedTransaction
from txnguard.codecs.groups import java_string_hash, offsets_partition_for
from txnguard.codecs.produce import ProducePartition
from txnguard.policies.error_mapping import PRODUCE, TXN_OFFSET_COMMIT
from txnguard.policies.policy import PolicyError, policy_from_config
from txnguard.verification.judge import judge_description, judge_verify_only, leader_has_open_transaction
from txnguard.verification.plan import plan_produce
from txnguard.verification.registry import Registry
from txnguard.verification.verdicts import Outcome

T = ("orders", 0)


def _txn_part(topic, p, pid, epoch=0, transactional=True):
    return ProducePartition(topic, p, [BatchHead(pid, epoch, 0, transactional, False)])


def _desc(state="Ongoing", pid=7, epoch=0, partitions=frozenset({T}), error=0):
    return DescribedTransaction(error, "app", state, 60000, 1000, pid, epoch, partitions)


def test_two_producer_ids_in_one_request_fail_every_partition():
    plan = plan_produce(Registry(), "app", [_txn_part("a", 0, 7), _txn_part("b", 0, 8),
                                            _txn_part("c", 0, -1, transactional=False)], 0)
    assert {v.outcome for v in plan.verdicts.values()} == {Outcome.PRODUCER_ID_MAPPING}
    assert len(plan.verdicts) == 3 and not plan.pending


def test_non_transactional_partitions_need_no_verification():
    plan = plan_produce(Registry(), "app", [_txn_part("a", 0, -1, transactional=False)], 0)
    assert plan.complete and not plan.verdicts and plan.unverified == [("a", 0)]


def test_unknown_transactions_are_asked_about():
    plan = plan_produce(Registry(), "app", [_txn_part("orders", 0, 7)], 0)
    assert plan.pending == [T]


@pytest.mark.parametrize(
    ("desc", "outcome", "underlying"),
    [
        (_desc(), Outcome.PASS, None),
        (_desc(partitions=frozenset()), Outcome.NOT_IN_TRANSACTION, None),
        (_desc(state="CompleteAbort", partitions=frozenset()), Outcome.LATE_WRITE, None),   # after EndTxn
        (_desc(state="CompleteCommit"), Outcome.LATE_WRITE, None),   # its partitions are the ended one's
        (_desc(state="Empty", partitions=frozenset()), Outcome.NOT_IN_TRANSACTION, None),
        (_desc(state="PrepareCommit"), Outcome.COORDINATOR_RETRIABLE, "CONCURRENT_TRANSACTIONS"),
        (_desc(pid=8), Outcome.PRODUCER_ID_MAPPING, None),
        (_desc(epoch=1), Outcome.FENCED, None),
        (_desc(error=ErrorCode.not_coordinator), Outcome.COORDINATOR_RETRIABLE, "NOT_COORDINATOR"),
        (_desc(error=ErrorCode.coordinator_load_in_progress), Outcome.COORDINATOR_RETRIABLE,
         "COORDINATOR_LOAD_IN_PROGRESS"),
        (_desc(error=ErrorCode.transactional_id_not_found), Outcome.PRODUCER_ID_MAPPING, None),
    ],
    ids=["ongoing-added", "ongoing-not-added", "aborted", "committed", "empty", "preparing", "other-pid", "other-epoch",
         "not-coordinator", "loading", "unknown-id"],
)
def test_the_coordinators_answer_judged_with_its_own_rules(desc, outcome, underlying):
    v = judge_description(desc, 7, 0, T)
    assert (v.outcome, v.underlying) == (outcome, underlying)


@pytest.mark.parametrize(
    ("top", "partition", "outcome", "underlying"),
    [
        (ErrorCode.none, ErrorCode.none, Outcome.PASS, None),
        (ErrorCode.none, ErrorCode.invalid_txn_state, Outcome.NOT_IN_TRANSACTION, None),           # 3.5-3.7
        (ErrorCode.none, ErrorCode.transaction_abortable, Outcome.NOT_IN_TRANSACTION, None),       # 3.8+
        (ErrorCode.none, ErrorCode.invalid_producer_id_mapping, Outcome.PRODUCER_ID_MAPPING, None),
        (ErrorCode.none, ErrorCode.producer_fenced, Outcome.FENCED, None),
        (ErrorCode.none, ErrorCode.concurrent_transactions, Outcome.COORDINATOR_RETRIABLE, "CONCURRENT_TRANSACTIONS"),
        (ErrorCode.none, ErrorCode.not_coordinator, Outcome.COORDINATOR_RETRIABLE, "NOT_COORDINATOR"),
        (ErrorCode.none, None, Outcome.COORDINATOR_RETRIABLE, "NETWORK_EXCEPTION"),                # not answered
        # The broker turns a top-level CLUSTER_AUTHORIZATION_FAILED into INVALID_TXN_STATE: fail closed.
        (ErrorCode.cluster_authorization_failed, None, Outcome.NOT_IN_TRANSACTION, None),
        (ErrorCode.coordinator_load_in_progress, ErrorCode.none, Outcome.COORDINATOR_RETRIABLE,
         "COORDINATOR_LOAD_IN_PROGRESS"),                                                             # top wins
    ],
    ids=["in-txn", "not-in-txn-3.5", "not-in-txn-3.8", "unknown-pid", "fenced", "concurrent", "not-coordinator",
         "unanswered", "no-cluster-action", "top-level-loading"],
)
def test_a_verify_only_answer_is_read_as_the_broker_reads_it(top, partition, outcome, underlying):
    v = judge_verify_only(top, partition, T)
    assert (v.outcome, v.underlying) == (outcome, underlying)


def test_the_leader_vouches_only_for_an_open_transaction_of_the_same_producer_and_epoch():
    def answer(*producers, error=0):
        return SimpleNamespace(error_code=error, active_producers=[
            SimpleNamespace(producer_id=p, producer_epoch=e, current_txn_start_offset=o) for p, e, o in producers])

    assert leader_has_open_transaction(answer((7, 0, 12)), 7, 0)
    assert not leader_has_open_transaction(answer((7, 0, -1)), 7, 0)   # no open transaction
    assert not leader_has_open_transaction(answer((7, 1, 12)), 7, 0)   # another epoch
    assert not leader_has_open_transaction(answer((8, 0, 12)), 7, 0)   # another producer
    assert not leader_has_open_transaction(answer((7, 0, 12), error=ErrorCode.not_leader_or_follower), 7, 0)


@pytest.mark.parametrize(
    ("api", "outcome", "family", "code"),
    [
        (PRODUCE, Outcome.NOT_IN_TRANSACTION, "java", ErrorCode.invalid_txn_state),
        (PRODUCE, Outcome.LATE_WRITE, "librdkafka", ErrorCode.invalid_txn_state),
        (PRODUCE, Outcome.COORDINATOR_RETRIABLE, "java", ErrorCode.not_enough_replicas),
        (PRODUCE, Outcome.FENCED, "aiokafka", ErrorCode.invalid_producer_epoch),
        (PRODUCE, Outcome.PRODUCER_ID_MAPPING, "unknown", ErrorCode.invalid_producer_id_mapping),
        (PRODUCE, Outcome.NOT_IN_TRANSACTION, "kafka-python", ErrorCode.transaction_abortable),
        (TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE, "java", ErrorCode.coordinator_not_available),
        (TXN_OFFSET_COMMIT, Outcome.NOT_IN_TRANSACTION, "kafka-python", ErrorCode.invalid_txn_state),
    ],
)
def test_error_mapping_defaults_and_family_overrides(api, outcome, family, code):
    assert policy_from_config({}).error_for(api, outcome, family).code == code


def test_an_unanswered_txn_offset_commit_check_gets_load_in_progress_like_the_group_coordinator():
    policy = policy_from_config({})
    assert policy.error_for(TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE, "java",
                            "NETWORK_EXCEPTION").code == ErrorCode.coordinator_load_in_progress
    assert policy.error_for(TXN_OFFSET_COMMIT, Outcome.COORDINATOR_RETRIABLE, "java",
                            "NOT_COORDINATOR").code == ErrorCode.coordinator_not_available
    assert policy.error_for(PRODUCE, Outcome.COORDINATOR_RETRIABLE, "java",
                            "NETWORK_EXCEPTION").code == ErrorCode.not_enough_replicas


def test_the_not_enough_replicas_message_names_the_underlying_error():
    choice = policy_from_config({}).error_for(PRODUCE, Outcome.COORDINATOR_RETRIABLE, "java")
    assert choice.render("NOT_COORDINATOR") == (
        "Unable to verify the partition has been added to the transaction. Underlying error: NOT_COORDINATOR")


def test_families_from_kip511_names_then_client_ids():
    p = policy_from_config({"families": [{"family": "kafka-python", "client_id": "billing-*"}]})
    assert p.family("apache-kafka-java", "producer-1", "bootstrap") == "java"
    assert p.family("confluent-kafka-python", "rdkafka", "bootstrap") == "librdkafka"
    assert p.family(None, "aiokafka-producer-1", "bootstrap") == "aiokafka"
    assert p.family(None, "billing-7", "bootstrap") == "kafka-python"
    assert p.family(None, "something", "bootstrap") == "unknown"


def test_enforcement_rules_first_match_wins():
    p = policy_from_config({"mode": "enforce", "rules": [{"transactional_id": "legacy-*", "mode": "monitor"},
                                                         {"topic": "audit.*", "mode": "off"}]})
    assert p.mode_for("legacy-1", "orders").value == "monitor"
    assert p.mode_for("app", "audit.x").value == "off"
    assert p.mode_for("app", "orders").value == "enforce"


@pytest.mark.parametrize("raw", [{"mode": "maybe"}, {"rules": [{"topic": "x"}]}, {"colour": 1},
                                 {"errors": {"java": {"produce": {"no_such_outcome": 48}}}}])
def test_broken_policies_name_the_key(raw):
    with pytest.raises(PolicyError) as e:
        policy_from_config(raw)
    assert "policy" in str(e.value)


def test_group_partition_uses_java_string_hash():
    assert java_string_hash("hello") == 99162322  # "hello".hashCode() in Java
    assert offsets_partition_for("hello", 50) == 99162322 % 50
    assert 0 <= offsets_partition_for("grüße-€", 7) < 7

"""The rolling-upgrade verdict (txnguard.testing.rolling.RollResult) on the client errors a copier can report.

    copier's errors ──▶ RollResult ──▶ failed deliveries / purges with no abort / hangs while nothing restarted
                                   ──▶ passed

A real roll shows none of these failing cases on demand (a refused record, a purge without an abort, a hang in
the quiet baseline), so the integration test's assertions on them are checked here, on errors as the copier
notes them (clients/confluent.py: "delivery: " and librdkafka's KafkaError text).
"""

from __future__ import annotations

from collections import Counter

from txnguard.testing.rolling import RollResult, StepRow

REFUSED = 'delivery: KafkaError{code=INVALID_TXN_STATE,val=48,str="Broker: Producer attempted a transactional ' \
          'operation in an invalid state"}'
PURGED = 'delivery: KafkaError{code=_PURGE_QUEUE,val=-152,str="Local: Purged in queue"}'
HUNG = "send_offsets_to_transaction did not return within 60 s (its timeout 30 s): librdkafka #5511/#5456"


def verdict(*errors: tuple[int, str, str]) -> RollResult:
    """A roll of a quiet baseline and one broker restart; `errors` as (step, kind, text)."""
    steps = [StepRow(name, 1.0, 500, Counter(kind for at, kind, _ in errors if at == i), Counter(), Counter(), "")
             for i, name in enumerate(["start, then a quiet baseline", "broker 1: 3.4.1 -> 3.9.2"])]
    return RollResult("roll", 1000, 1000, 0, 0, 0, finished=True, seconds=1.0, outcome="", steps=steps,
                      client_errors=[(kind, text) for _, kind, text in errors])


def test_no_error_passes() -> None:
    assert verdict().passed


def test_a_refused_record_fails_the_roll() -> None:
    result = verdict((1, "abortable", "commit failed"), (1, "delivery", REFUSED))
    assert result.failed_deliveries == [REFUSED] and not result.passed


def test_records_purged_by_the_copiers_abort_pass() -> None:
    result = verdict((1, "abortable", "rebalance during a transaction"), (1, "delivery", PURGED),
                     (1, "delivery", PURGED.replace("_PURGE_QUEUE", "_PURGE_INFLIGHT")))
    assert result.failed_deliveries == [] and result.purged_without_abort == 0 and result.passed


def test_records_purged_with_no_abort_fail_the_roll() -> None:
    result = verdict((1, "delivery", PURGED))
    assert result.purged_without_abort == 1 and not result.passed


def test_a_hang_during_a_restart_passes_and_one_while_nothing_restarted_fails() -> None:
    during_restart, while_quiet = verdict((1, "hung", HUNG)), verdict((0, "hung", HUNG))
    assert during_restart.hung_while_quiet == 0 and during_restart.passed
    assert while_quiet.hung_while_quiet == 1 and not while_quiet.passed

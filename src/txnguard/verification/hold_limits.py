"""How long a check may wait for a coordinator that does not answer: hold like the broker does.

A broker with KIP-890 verification (3.6+) keeps a transactional Produce while its
AddPartitionsToTxnManager waits for the coordinator (up to its inter-broker
`request.timeout.ms`, 30 s by default): a coordinator failover (~8-12 s) becomes a
slow answer, not an error. A proxy that answered NOT_ENOUGH_REPLICAS after one
bounded attempt turned the same pause into errors, and a client with a small retry
budget (Sarama's default: 3 retries, 100 ms apart) spent it in a few seconds and
aborted (issue 13). So a check whose answers are only "the coordinator cannot say
now" is asked again, with a backoff, for as long as the request itself allows:

* Produce carries its own TimeoutMs, which clients fill with their request timeout;
  the proxy answers within `share` of it, leaving the client time to retry.
* TxnOffsetCommit carries none: the proxy uses the TimeoutMs last seen on a Produce
  of the same transactional id, else the configured client request timeout.

Any definite answer (not in the transaction, fenced, unknown producer id, a batch
the broker would refuse) ends the hold at once: only "not now" is worth waiting for.
Pure: the asyncio shell (proxy/guard.py) sleeps and asks; this module only decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from txnguard.codecs.topic_partition import TopicPartition
from txnguard.verification.verdicts import Outcome, Verdict


@dataclass(frozen=True, slots=True)
class HoldLimits:
    share: float = 0.8                        # of the request's own timeout; 0 disables holding
    max_ms: int = 30_000                      # no hold longer than this, whatever the request allows
    default_request_timeout_ms: int = 30_000  # TxnOffsetCommit with no Produce timeout seen (clients' default)
    backoff_ms: int = 100                     # first pause between two questions
    backoff_max_ms: int = 1_000

    def budget_ms(self, request_timeout_ms: int | None) -> float:
        """How long a check may keep asking, from verification start; 0: one question, as before."""
        timeout = self.default_request_timeout_ms if request_timeout_ms is None else request_timeout_ms
        if self.share <= 0 or timeout <= 0:
            return 0.0
        return float(min(timeout * self.share, self.max_ms))

    def backoff(self, attempt: int) -> float:
        """The pause in ms before question `attempt` + 1 (attempt 1 is the first retry): doubling, capped."""
        return float(min(self.backoff_ms * (2 ** max(attempt - 1, 0)), self.backoff_max_ms))


NO_HOLD = HoldLimits(share=0.0)


def worth_asking_again(verdicts: Mapping[TopicPartition, Verdict]) -> list[TopicPartition]:
    """The partitions to ask about again: those the coordinator could not judge now, provided no
    partition of the request already failed for good (then the request's fate is sealed: answer it)."""
    unsettled = []
    for tp, v in verdicts.items():
        if v.outcome is Outcome.COORDINATOR_RETRIABLE:
            unsettled.append(tp)
        elif v.outcome is not Outcome.PASS:
            return []
    return unsettled

"""CONCURRENT_TRANSACTIONS absorbed by the proxy (the KIP-609 idea, for clients that predate it).

Right after a commit or abort, the coordinator is still writing the previous
transaction's markers (PrepareCommit/PrepareAbort). The first AddPartitionsToTxn or
AddOffsetsToTxn of the next transaction then gets CONCURRENT_TRANSACTIONS (51), and
the client backs off on its own: Java 20 ms for the first AddPartitions of a
transaction and `retry.backoff.ms` (100 ms) otherwise, librdkafka and kafka-python
their retry backoff, kafkajs was seen hitting it 9 times in 10 short transactions.
A short-transaction loop spends most of its time in those backoffs.

The proxy sits next to the coordinator, so it can ask again after a few milliseconds
on the client's own broker connection (same bytes, same correlation id) and give the
client one slower success instead of the error. Bounded: after `budget_ms` the
client gets the coordinator's last answer, CONCURRENT_TRANSACTIONS, as it would have
directly, and backs off as it always did.

Only an answer that is CONCURRENT_TRANSACTIONS for the whole request is absorbed: the
coordinator refuses a whole AddPartitionsToTxn with it (every partition carries 51),
so a mixed answer is something else and goes to the client untouched.
Pure: the connection core keeps the request and asks its shell for a timer.
"""

from __future__ import annotations

from dataclasses import dataclass

from txnguard.codecs.api_keys import ApiKey

ADD_PARTITIONS, ADD_OFFSETS = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN
ABSORBED_KEYS = frozenset({ADD_PARTITIONS, ADD_OFFSETS})


@dataclass(frozen=True, slots=True)
class ConcurrentRetry:
    enabled: bool = True
    budget_ms: int = 2_000       # well inside every client's request timeout (30 s and more)
    backoff_ms: float = 2.0      # markers on a healthy cluster take a few ms: ask soon
    backoff_max_ms: float = 20.0  # never slower than Java's own first backoff

    def delay_ms(self, retries: int, waited_ms: float) -> float | None:
        """The pause before retry `retries` + 1, or None when the budget is spent (answer the client)."""
        if not self.enabled:
            return None
        delay = min(self.backoff_ms * float(2 ** retries), self.backoff_max_ms)
        if waited_ms + delay > self.budget_ms:
            return None
        return delay


NO_ABSORPTION = ConcurrentRetry(enabled=False)


def concurrent_retry(budget_ms: float) -> ConcurrentRetry:
    """The configured absorption (`health.concurrent_transactions_budget_ms`; 0: off)."""
    return ConcurrentRetry(budget_ms=int(budget_ms)) if budget_ms > 0 else NO_ABSORPTION


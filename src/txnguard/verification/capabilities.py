"""What a broker's ApiVersions answer lacks, of the APIs the proxy's own evidence needs, and what it falls back to.

Kafka 2.8 has DescribeProducers (KIP-664's first half, API 61) but neither DescribeTransactions
(65) nor ListTransactions (66): those came with Kafka 3.0. A broker closes the connection on an API
key it does not list (`Unexpected api key: 65` in its log), so the proxy never sends one
(proxy/kafka_client.py refuses to) and treats "the broker lacks it" as a definite answer here.
Pure: the proxy hands in the ranges a broker listed; this module says what follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from txnguard.codecs.api_keys import ApiKey

DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = (
    ApiKey.DESCRIBE_PRODUCERS, ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.LIST_TRANSACTIONS)


@dataclass(frozen=True, slots=True)
class Lack:
    api_key: int
    api: str            # the metric label and the log's name for it
    needed_for: str
    falls_back_to: str


# Version 0 is all the proxy sends of each.
EVIDENCE_APIS: tuple[Lack, ...] = (
    Lack(DESCRIBE_TRANSACTIONS, "DescribeTransactions", "coordinator evidence for a write without local evidence",
         "local evidence (a gateway's observed AddPartitionsToTxn) and the leader's DescribeProducers; a write "
         "with neither is refused as not added to the transaction (the error each client family aborts on), "
         "never held"),
    Lack(LIST_TRANSACTIONS, "ListTransactions", "the hanging-transaction scan's producer id -> transactional id map",
         "DescribeProducers alone: an open transaction older than the maximum transaction timeout is reported "
         "unconfirmed (no transactional id, no coordinator state)"),
    Lack(DESCRIBE_PRODUCERS, "DescribeProducers", "leader evidence and the hanging-transaction scan",
         "coordinator evidence only; the scan cannot run"),
)


def lacking(ranges: Mapping[int, tuple[int, int]]) -> tuple[Lack, ...]:
    """The evidence APIs a broker does not list at version 0, in EVIDENCE_APIS' order."""
    return tuple(lack for lack in EVIDENCE_APIS
                 if not (lack.api_key in ranges and ranges[lack.api_key][0] <= 0 <= ranges[lack.api_key][1]))


def summary(address: str, lacks: tuple[Lack, ...]) -> str:
    """One sentence for /readyz: what this broker lacks and what the proxy does instead."""
    return f"broker {address} lacks " + "; ".join(f"{lack.api} (falls back to {lack.falls_back_to})"
                                                    for lack in lacks)

"""What a broker's ApiVersions answer lacks, of the APIs the proxy's own evidence needs, and what it falls back to.

Kafka 2.8 has DescribeProducers (KIP-664's first half, API 61) but neither DescribeTransactions
(65) nor ListTransactions (66): those came with Kafka 3.0. A broker closes the connection on an API
key it does not list (`Unexpected api key: 65` in its log), so the proxy never sends one
(proxy/kafka_client.py refuses to) and treats "the broker lacks it" as a definite answer here.
Pure: the proxy hands in the ranges a broker listed; this module says what follows, down to whether
the proxy is ready (`readiness`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
         "the coordinator's log (__transaction_state, read to its end: DESCRIBE and READ on it) for the "
         "transactional id, state, partitions and timeout; where that may not be read, or does not hold the "
         "producer id, DescribeProducers alone: an open transaction older than the maximum transaction timeout is "
         "reported unconfirmed (no transactional id, no coordinator state)"),
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


# Why a proxy is not ready, as the metric label `txnguard_not_ready{reason}` and the log line say it.
UNREAD = "broker_api_versions_unread"
LACKS_API = "broker_lacks_api"


@dataclass(frozen=True, slots=True)
class BrokerApis:
    """What the proxy knows of one broker's ApiVersions."""

    address: str
    lacks: tuple[Lack, ...] | None  # None: not read yet
    own: bool                       # one of the proxy's `upstream` brokers (a sidecar: its own broker)
    error: str | None = None        # why the last read failed, while `lacks` is None


@dataclass(frozen=True, slots=True)
class NotReady:
    reason: str         # UNREAD or LACKS_API
    broker: str
    api: str | None     # the API lacked (LACKS_API)
    text: str           # the sentence /readyz and the log line give


@dataclass(frozen=True, slots=True)
class Readiness:
    blocked: tuple[NotReady, ...]   # empty: ready, as far as the brokers' APIs go
    notes: tuple[str, ...]          # what the proxy cannot do: /readyz's body says it, ready or not

    @property
    def ready(self) -> bool:
        return not self.blocked


def _consequence(lacks: tuple[Lack, ...], *, own: bool, sidecar: bool, enforcing: bool) -> str | None:
    """What a broker without DescribeTransactions means for this proxy's writes, in its mode."""
    if not any(lack.api_key == DESCRIBE_TRANSACTIONS for lack in lacks):
        return None
    what = "refused" if enforcing else "forwarded and recorded as not added (monitor)"
    if not sidecar:
        return (f"a gateway verifies from what it forwarded: a write whose AddPartitionsToTxn it did not forward (a "
                f"transaction begun before a restart, or through another gateway replica) cannot be verified: {what}"
                f"; {_NOR}")
    if not own:
        return (f"writes of transactions this broker coordinates cannot be verified when the leader shows none: "
                f"{what}; {_NOR}")
    return ("a sidecar cannot verify a transaction's first write to a partition (no leader evidence yet, the "
            f"coordinator cannot be asked): every transaction's first write is {what}; {_NOR}")


# What else asks DescribeTransactions (proxy/guard.py), and how it degrades without it: never a refusal.
_NOR = ("nor can it confirm a coordinator's transaction timeout (a KIP-588 rewrite: the error passes as it is) or "
        "see a producer move on past an EndTxn in doubt (that hold lasts until the EndTxn is answered or its bound)")


def readiness(brokers: Iterable[BrokerApis], *, sidecar: bool, enforcing: bool,
              log_evidence: bool = False) -> Readiness:
    """Is the proxy fit for clients, as far as its brokers' APIs go, and what should /readyz say besides?

    Not ready while none of its own brokers' ApiVersions has been read: what they lack is unknown, so
    whether a first transaction would be refused is too (a sidecar has exactly one upstream: its broker).

    An enforcing sidecar whose own broker lacks DescribeTransactions is not ready: a sidecar never sees
    AddPartitionsToTxn, the first write of every transaction to a partition has no leader evidence yet,
    so it would refuse every transaction. (Coordinator evidence by AddPartitionsToTxn v4 VerifyOnly does
    not help: a broker that lists v4 is a 3.5+ broker, which lists DescribeTransactions too.)

    Not ready for the same lack elsewhere:
    - another broker, as a sidecar sees it (a coordinator): readiness is each sidecar's own broker's, or a
      rolling upgrade from 2.8 would stall, every upgraded sidecar waiting for the last old broker;
    - a gateway: it verifies every write of a transaction it saw begin from its own evidence, exactly as on
      3.x; only a write whose AddPartitionsToTxn it did not forward cannot be verified. Out of a Service it
      would protect nothing at all, so it stays ready and its body says what it cannot verify;
    - `monitor` (or `off`, or verification disabled): nothing is refused; the body says the same;
    - `log_evidence`: the proxy follows the coordinator's own log (__transaction_state) and has read it once:
      every AddPartitionsToTxn is there, wherever it went through, so a first write has its evidence.
    """
    brokers = sorted(brokers, key=lambda b: b.address)
    blocked: list[NotReady] = []
    notes: list[str] = []
    own = [b for b in brokers if b.own]
    if own and all(b.lacks is None for b in own):
        blocked += [NotReady(UNREAD, b.address, None, f"broker {b.address}'s ApiVersions not read yet"
                             + (f" ({b.error})" if b.error else "") + ": what it lacks is unknown; retrying")
                    for b in own]
    for b in brokers:
        if b.lacks is None:
            if not any(n.broker == b.address for n in blocked):
                notes.append(f"broker {b.address}'s ApiVersions not read yet" + (f" ({b.error})" if b.error else ""))
            continue
        if not b.lacks:
            continue
        consequence = _consequence(b.lacks, own=b.own, sidecar=sidecar, enforcing=enforcing)
        if consequence is not None and log_evidence:
            notes.append(summary(b.address, b.lacks) + ": the coordinator's log (__transaction_state) gives the "
                         "evidence DescribeTransactions would")
            continue
        if sidecar and enforcing and b.own and consequence is not None:
            blocked.append(NotReady(LACKS_API, b.address, "DescribeTransactions", (
                f"broker {b.address} lacks DescribeTransactions (Kafka before 3.0): {consequence}; follow the "
                "coordinator's log (verification.transaction_log_view, with DESCRIBE and READ on __transaction_state), "
                "or use a gateway, policy mode monitor, or Kafka 3.0+")))
            others = tuple(lack for lack in b.lacks if lack.api_key != DESCRIBE_TRANSACTIONS)
            if others:
                notes.append(summary(b.address, others))
            continue
        notes.append(summary(b.address, b.lacks) + (f": {consequence}" if consequence else ""))
    return Readiness(tuple(blocked), tuple(notes))

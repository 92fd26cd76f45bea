"""The proxy's own principal refused by Kafka: which ACL is missing, and what verification does without it.

The proxy asks its verification questions as its own principal (upstream_auth). Each refusal names
one right that principal lacks (Kafka's checks, KafkaApis in 3.5 to 3.9):

    FindCoordinator (transaction)   DESCRIBE      TransactionalId   TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    DescribeTransactions            DESCRIBE      TransactionalId   TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                                    DESCRIBE      Topic             (no error: the topic's partitions are
                                                                     silently left out of the answer)
    Metadata (one topic)            DESCRIBE      Topic             TOPIC_AUTHORIZATION_FAILED
    DescribeProducers               READ          Topic             TOPIC_AUTHORIZATION_FAILED
    AddPartitionsToTxn VerifyOnly   CLUSTER_ACTION Cluster          CLUSTER_AUTHORIZATION_FAILED
    SaslHandshake/SaslAuthenticate  (credentials)                   SASL_AUTHENTICATION_FAILED, ...

A right is *essential* when, without it, the coordinator's evidence cannot be had: verification then
fails closed with a verdict the client retries (COORDINATOR_RETRIABLE: NOT_ENOUGH_REPLICAS on Produce,
COORDINATOR_NOT_AVAILABLE on TxnOffsetCommit), never a pass and never a non-retriable rejection: the
client did nothing wrong, the proxy's principal is misconfigured, and once the ACL is granted the
client's retry passes. (The broker's own VerifyOnly maps its CLUSTER_AUTHORIZATION_FAILED to
INVALID_TXN_STATE; a proxy-side gap must not cost the client its transaction.) READ on a topic is not
essential: without it the leader gives no evidence and the coordinator decides (one more round trip).
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from txnguard.verification.verdicts import Evidence, Outcome, Verdict

CLUSTER_RESOURCE = "kafka-cluster"

# (api, error) -> (operation, resource type, essential)
_MISSING: dict[tuple[str, int], tuple[str, str, bool]] = {
    ("find_coordinator", ErrorCode.transactional_id_authorization_failed): ("DESCRIBE", "TransactionalId", True),
    ("describe_transactions", ErrorCode.transactional_id_authorization_failed):
        ("DESCRIBE", "TransactionalId", True),
    ("metadata", ErrorCode.topic_authorization_failed): ("DESCRIBE", "Topic", True),
    ("describe_producers", ErrorCode.topic_authorization_failed): ("READ", "Topic", False),
    ("add_partitions_to_txn_verify_only", ErrorCode.cluster_authorization_failed): ("CLUSTER_ACTION", "Cluster", True),
    # The follower of the coordinator's log (proxy/log_follower.py): without it, verification works as before.
    ("transaction_log_metadata", ErrorCode.topic_authorization_failed): ("DESCRIBE", "Topic", False),
    ("transaction_log_fetch", ErrorCode.topic_authorization_failed): ("READ", "Topic", False),
}
# Authentication itself: every request of the proxy fails, whatever it asked.
_SASL_ERRORS = frozenset({ErrorCode.sasl_authentication_failed, ErrorCode.unsupported_sasl_mechanism,
                          ErrorCode.illegal_sasl_state})


@dataclass(frozen=True, slots=True)
class MissingAcl:
    operation: str        # DESCRIBE, READ, CLUSTER_ACTION; AUTHENTICATE for refused credentials
    resource_type: str    # TransactionalId, Topic, Cluster; SASL
    name: str             # the resource's name (the mechanism for SASL)
    api: str              # which of the proxy's requests was refused
    error: str            # Kafka's error name
    essential: bool       # verification cannot decide without it: fail closed, not ready

    @property
    def key(self) -> tuple[str, str, str]:
        return self.operation, self.resource_type, self.name

    def sentence(self, principal: str) -> str:
        if self.resource_type == "SASL":
            return (f"{principal} could not authenticate ({self.name}): {self.api} answered {self.error}; "
                    "check upstream_auth and the broker's SCRAM credentials")
        return (f"{principal} lacks ALLOW {self.operation} on {self.resource_type} {self.name!r} "
                f"({self.api} answered {self.error})")


def known_rights() -> list[tuple[str, str, str]]:
    """(api, operation, resource type) of every refusal `missing_acl` can name; SASL as the handshake names it."""
    return [(api, operation, resource_type) for (api, _), (operation, resource_type, _) in _MISSING.items()] + \
        [("sasl_authenticate", "AUTHENTICATE", "SASL")]


def missing_acl(api: str, code: int, name: str) -> MissingAcl | None:
    """The right a refusal names, or None when `code` is no authorization error of the proxy's own."""
    if code in _SASL_ERRORS:
        return MissingAcl("AUTHENTICATE", "SASL", name, api, _name(code), True)
    found = _MISSING.get((api, code))
    if found is None:
        return None
    operation, resource_type, essential = found
    return MissingAcl(operation, resource_type, CLUSTER_RESOURCE if resource_type == "Cluster" else name,
                      api, _name(code), essential)


def refused(missing: MissingAcl, principal: str) -> Verdict:
    """Fail closed, retriable: the client retries; it passes once the proxy's principal has the right."""
    return Verdict(Outcome.COORDINATOR_RETRIABLE, Evidence.COORDINATOR,
                   f"cannot verify: {missing.sentence(principal)}", f"{missing.error} (txnguard's own principal)")


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"

"""Which client family a connection belongs to: KIP-511 software name and version, then client id.

Names are hints a user can override, so each rule also says which family an
unidentified client defaults to. Matching is first-rule-wins over a table.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

JAVA, LIBRDKAFKA, KAFKA_PYTHON, AIOKAFKA, UNKNOWN = "java", "librdkafka", "kafka-python", "aiokafka", "unknown"
SARAMA = "sarama"  # IBM/sarama (Go)


@dataclass(frozen=True)
class FamilyRule:
    family: str
    software_name: str | None = None   # glob on the KIP-511 ClientSoftwareName
    client_id: str | None = None       # glob on the request header client id
    listener: str | None = None        # glob on the listener name (bootstrap, broker-1, ...)


# The shipped table; config rules go in front of it.
DEFAULT_RULES: tuple[FamilyRule, ...] = (
    FamilyRule(JAVA, software_name="apache-kafka-java"),
    FamilyRule(LIBRDKAFKA, software_name="librdkafka"),
    FamilyRule(LIBRDKAFKA, software_name="confluent-kafka-*"),
    FamilyRule(KAFKA_PYTHON, software_name="kafka-python"),
    # IBM/sarama (Go): ApiVersions v3 with "sarama" and its module version (v1.61.1), or "dev" from a
    # checkout (api_versions_request.go defaultClientSoftwareName, version.go). Its default client id
    # is "sarama" too (config.go defaultClientID), the fallback for Config.ApiVersionsRequest=false.
    FamilyRule(SARAMA, software_name="sarama"),
    FamilyRule(KAFKA_PYTHON, client_id="kafka-python-*"),
    FamilyRule(AIOKAFKA, client_id="aiokafka-*"),   # aiokafka sends ApiVersions v0: no software name
    FamilyRule(LIBRDKAFKA, client_id="rdkafka"),
    FamilyRule(SARAMA, client_id="sarama"),
    FamilyRule(JAVA, client_id="producer-*"),
)


def _match(pattern: str | None, value: str | None) -> bool:
    return pattern is None or (value is not None and fnmatch.fnmatchcase(value, pattern))


def classify(rules: tuple[FamilyRule, ...], software_name: str | None, client_id: str | None,
             listener: str | None) -> str:
    for rule in rules:
        if rule.software_name is None and rule.client_id is None and rule.listener is None:
            continue
        if _match(rule.software_name, software_name) and _match(rule.client_id, client_id) \
                and _match(rule.listener, listener):
            return rule.family
    return UNKNOWN

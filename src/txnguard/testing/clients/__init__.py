"""Drive REAL Kafka clients through one small, uniform interface: one module per client family.

* `kafka_python`, `confluent` (librdkafka) and `aiokafka`: Python libraries, in process, each a
  `TransactionalClient`; confluent-kafka and kafka-python also a `CommittedConsumer`.
* `kcat`, a librdkafka command-line tool: plain produce, metadata and a read_committed consumer.
  It cannot run transactions.
* `java`: the Java client, through the tools shipped in Kafka's own `kafka-tools` jar, one JVM per
  call, with the client version chosen by which `kafka-tools` jar folder goes on the classpath.
* `sarama`: IBM/sarama (Go), through the sarama-paced program: paced transactions.

`base` holds what they share: the interfaces, their result types, a group member's thread and
running a tool with a timeout (a failure raises `ClientError` with the tail of the tool's output).

For the suite every client runs through the proxy, each Python family is also a `PythonClient`
(`PYTHON_CLIENTS`): plain produce, a consume-transform-produce copier with the offsets sent to the
transaction, committed-offset lookups, a consumer group member in its own thread (`GroupMember`),
and admin create / describe calls. Each family that can runs `paced_transactions` (`PACED_CLIENTS`).

Everything is importable from here (`from txnguard.testing.clients import X`).
"""

from __future__ import annotations

from typing import Any, Protocol

from txnguard.testing.clients.aiokafka import AioKafkaClient, AioKafkaGroupMember
from txnguard.testing.clients.base import (
    DEFAULT_TIMEOUT_S,
    AckHook,
    AdminClient,
    ClientError,
    CommittedConsumer,
    ConsumedRecord,
    CopiedTransaction,
    CopyResult,
    GroupClient,
    GroupMember,
    PacedClient,
    PacedResult,
    PartitionDescription,
    PlainProducer,
    ToolRun,
    TopicDescription,
    TransactionalClient,
    TransactionalCopier,
    copy_of,
    paced_values,
    run_tool,
    stable_end_offsets,
)
from txnguard.testing.clients.confluent import (
    MAX_PRODUCERS,
    BackgroundProducer,
    ConfluentGroupMember,
    ConfluentKafkaClient,
    ExactlyOnceCopy,
    confluent_exactly_once_copy,
)
from txnguard.testing.clients.java import (
    TOOL_HEAP,
    TOOLS_PACKAGE,
    CopierResult,
    HangingTransaction,
    PerfResult,
    VerifiableProducerResult,
    java_command,
    java_producer_performance,
    java_transactional_copier,
    java_verifiable_producer,
    parse_find_hanging,
    parse_producer_performance,
    tools_log_config,
    transactions_find_hanging,
)
from txnguard.testing.clients.kafka_python import KafkaPythonClient, KafkaPythonGroupMember
from txnguard.testing.clients.kcat import KCAT, Kcat
from txnguard.testing.clients.sarama import SARAMA_PACED, SARAMA_SETTINGS, SaramaClient, sarama_paced_transactions

__all__ = [
    "COMMITTED_CONSUMERS",
    "DEFAULT_TIMEOUT_S",
    "KCAT",
    "MAX_PRODUCERS",
    "PACED_CLIENTS",
    "PYTHON_CLIENTS",
    "PYTHON_TRANSACTIONAL_CLIENTS",
    "SARAMA_PACED",
    "SARAMA_SETTINGS",
    "TOOLS_PACKAGE",
    "TOOL_HEAP",
    "AckHook",
    "AdminClient",
    "AioKafkaClient",
    "AioKafkaGroupMember",
    "BackgroundProducer",
    "ClientError",
    "CommittedConsumer",
    "ConfluentGroupMember",
    "ConfluentKafkaClient",
    "ConsumedRecord",
    "CopiedTransaction",
    "CopierResult",
    "CopyResult",
    "ExactlyOnceCopy",
    "GroupClient",
    "GroupMember",
    "HangingTransaction",
    "KafkaPythonClient",
    "KafkaPythonGroupMember",
    "Kcat",
    "PacedClient",
    "PacedResult",
    "PartitionDescription",
    "PerfResult",
    "PlainProducer",
    "PythonClient",
    "SaramaClient",
    "ToolRun",
    "TopicDescription",
    "TransactionalClient",
    "TransactionalCopier",
    "VerifiableProducerResult",
    "confluent_exactly_once_copy",
    "copy_of",
    "java_command",
    "java_producer_performance",
    "java_transactional_copier",
    "java_verifiable_producer",
    "paced_transactions",
    "paced_values",
    "parse_find_hanging",
    "parse_producer_performance",
    "run_tool",
    "sarama_paced_transactions",
    "stable_end_offsets",
    "tools_log_config",
    "transactions_find_hanging",
]


class PythonClient(TransactionalClient, CommittedConsumer, PlainProducer, TransactionalCopier, GroupClient, AdminClient,
                   Protocol):
    """A Python client family with every part of the proxied suite (see tests/integration)."""


PYTHON_TRANSACTIONAL_CLIENTS: dict[str, TransactionalClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient())
}
COMMITTED_CONSUMERS: dict[str, CommittedConsumer] = {
    c.name: c for c in (ConfluentKafkaClient(), KafkaPythonClient(), Kcat())
}
PYTHON_CLIENTS: dict[str, PythonClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient())
}
PACED_CLIENTS: dict[str, PacedClient] = {
    c.name: c for c in (KafkaPythonClient(), ConfluentKafkaClient(), AioKafkaClient(), SaramaClient())
}


def paced_transactions(
    client_name: str, bootstrap_servers: str, topic: str, transactional_id: str, *, transactions: int,
    per_transaction: int, partition: int = 0, gap_s: float = 0.02, on_ack: AckHook | None = None,
    timeout_s: float = 120.0, settings: dict[str, Any] | None = None,
) -> PacedResult:
    """The family `client_name`'s paced transactions (`PacedClient.paced_transactions` says what they are)."""
    client = PACED_CLIENTS.get(client_name)
    if client is None:
        raise ValueError(f"no paced transactions for {client_name}")
    return client.paced_transactions(bootstrap_servers, topic, transactional_id, transactions=transactions,
                                     per_transaction=per_transaction, partition=partition, gap_s=gap_s, on_ack=on_ack,
                                     timeout_s=timeout_s, settings=settings)

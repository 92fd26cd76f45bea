"""Which coordinator partition holds a key: Utils.abs(key.hashCode) % partitions, for a group's
__consumer_offsets partition and a transactional id's __transaction_state partition alike."""

from __future__ import annotations

CONSUMER_OFFSETS = "__consumer_offsets"


def java_string_hash(s: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition_for(key: str, partitions: int) -> int:
    """GroupMetadataManager.partitionFor and TransactionStateManager.partitionFor: the same formula."""
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 rather than overflowing.
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def offsets_partition_for(group_id: str, partitions: int) -> int:
    return coordinator_partition_for(group_id, partitions)

"""A partition as the protocol names it: (topic name, partition index). Defined once for every layer."""

from __future__ import annotations

TopicPartition = tuple[str, int]

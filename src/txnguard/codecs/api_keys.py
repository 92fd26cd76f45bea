"""The Kafka API keys txnguard reads, rewrites or sends: declared once, here (every other module names them
from this; tests/unit/test_api_key_literals.py fails on an integer copy elsewhere).

Any other key is relayed untouched and stays a plain int.
"""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    METADATA = 3
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27       # the hanging-transaction abort
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32        # the hanging scan's transaction.max.timeout.ms
    SASL_AUTHENTICATE = 36
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61      # the verifier's leader evidence and the hanging-transaction scan
    DESCRIBE_TRANSACTIONS = 65   # the verifier's coordinator evidence
    LIST_TRANSACTIONS = 66       # the hanging-transaction scan
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79

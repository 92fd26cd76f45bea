"""Does a Produce (v10+) or Fetch (v16+) answer name brokers? Read in place, so that one that does not
passes untouched.

From these versions (KIP-951, Kafka 3.7) a broker may add the new leaders' addresses to its answer (the
top-level tagged field NodeEndpoints, only beside NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH errors); the
proxy must put its own listeners there. Decoding every answer with kio to find out cost ~15 us warm per
one-partition Produce, more per Fetch (its records copied into kio's objects), and took each one off the
relay's fast path, for a field that is absent in nearly all of them. The native data path walks the answer
with bounds instead (native/src/endpoints.rs): every length and count checked against the end before use,
records skipped by their length, nothing built.

`endpoints_absent` says True only when the whole answer was read (nothing left over) and its top-level
tagged fields are empty; anything else (addresses present, any top-level tag, a version or shape it does
not read, a length past the end; no native module) is False, and kio reads the answer as before.
"""

from __future__ import annotations

from txnguard.codecs import native
from txnguard.codecs.api_keys import ApiKey

PRODUCE, FETCH = ApiKey.PRODUCE.value, ApiKey.FETCH.value
# The versions walked here: from the first with NodeEndpoints to the last whose layout is the one below
# (Produce v13 names topics by id: kio reads it).
READ = {PRODUCE: range(10, 13), FETCH: range(16, 19)}


def endpoints_absent(body: bytes | memoryview, api_key: int, version: int, start: int = 0,
                     stop: int | None = None) -> bool:
    """`body[start:stop]`: the answer from its correlation id on (the frame without its length prefix)."""
    versions = READ.get(api_key)
    if versions is None or version not in versions or not native.AVAILABLE:
        return False
    return bool(native.endpoints_absent(body, start, len(body) if stop is None else stop, api_key, version))

"""txnguard: a Kafka-wire proxy that keeps transactions correct for old clients (KIP-890 part 1).

Packages, from the wire inwards:

* ``txnguard.proxy``        the asyncio shell: listeners, connections, metrics, config, CLI glue.
* ``txnguard.verification`` the transaction registry and KIP-890 decisions (pure, no clock).
* ``txnguard.policies``     error rewriting per client family, enforcement modes (pure).
* ``txnguard.codecs``       frames, header peeks, kio decode/encode, address rewriting (pure).
* ``txnguard.testing``      real Kafka clusters and clients for tests, benchmarks and demos.

The import rules between them are checked by import-linter (``make lint``).
"""

__version__ = "0.1.0"

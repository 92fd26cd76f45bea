"""txnguard: a Kafka-wire proxy that keeps transactions correct for old clients (KIP-890 part 1).

Packages, from the wire inwards:

* ``txnguard.proxy``        the asyncio shell: listeners, connections, metrics, config, CLI glue.
* ``txnguard.verification`` the transaction registry and KIP-890 decisions (pure, no clock).
* ``txnguard.policies``     error rewriting per client family, enforcement modes (pure).
* ``txnguard.codecs``       frames, header peeks, kio decode/encode, address rewriting (pure).
* ``txnguard.testing``      real Kafka clusters and clients for tests, benchmarks and demos.

The import rules between them are checked by import-linter (``make lint``).

The version has one source, pyproject.toml's ``[project] version``: ``txnguard.__version__`` reads it from the
installed package's metadata (pip install, or the editable install ``make`` does), and ``txnguard --version``, the
image's tag and OCI labels (deploy/container/build-image.sh) and the Helm chart's appVersion (checked by a test)
are that version.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    # Read when asked for, so importing any part of txnguard does not load importlib.metadata.
    if name == "__version__":
        from importlib.metadata import version

        return version("txnguard")
    raise AttributeError(f"module 'txnguard' has no attribute {name!r}")

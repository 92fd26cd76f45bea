"""The asyncio shell around the pure core.

Owns: listeners, client and upstream connections, the coordinator client, TLS,
the admin HTTP endpoints, metrics, structured logging, configuration and the
``txnguard run`` command.

May import: everything in txnguard except ``txnguard.testing``.
May not: hold protocol rules that belong in codecs, policies or verification.
"""

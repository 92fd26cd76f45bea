"""What to do about a verification outcome, as data.

Owns: the per-client error mapping (chosen by KIP-511 client software name and
version, then client id, then listener), enforcement modes (enforce, monitor,
off) and their selectors by topic and transactional id.

May import: the standard library, kio and ``txnguard.codecs``.
May not: do IO, read the clock, or import the proxy shell.
"""

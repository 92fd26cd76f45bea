"""Bytes <-> typed Kafka frames, and nothing else.

Owns: the frame buffer with size limits, request/response header peeks, cached
kio decode and encode, the 61-byte record-batch header peek, ApiVersions
intersection, rewriting broker addresses in responses, and synthesising error
responses.

May import: the standard library (struct, dataclasses, enum, functools) and kio.
May not import: asyncio, sockets, logging set-up, metrics, or any other txnguard package.
"""

"""The connection core: one client connection as a pure state machine (h11 / mitmproxy style).

Bytes from either side and verifier answers go in; commands come out (send to
the client, send to the broker, ask the verifier, close with a reason,
pause/resume reading one side) together with facts the shell logs and counts.
No asyncio, no sockets, no logging or metrics objects; time arrives through a
`Clock`. `txnguard.proxy.session` moves the bytes and runs the commands.
"""

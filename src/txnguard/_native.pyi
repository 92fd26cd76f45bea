# The native data path (native/, Rust through PyO3): what txnguard._native exports.

__version__: str

class PanicException(BaseException): ...

def scan_transactional(
    data: bytes | bytearray | memoryview, start: int, stop: int, flexible: bool, /
) -> tuple[str, int, int, list[tuple[str, int]], int] | None: ...

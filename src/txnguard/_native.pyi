# The native data path (native/, Rust through PyO3): what txnguard._native exports.

__version__: str

class PanicException(BaseException): ...

def scan_transactional(
    data: bytes | bytearray | memoryview, start: int, stop: int, flexible: bool, /
) -> tuple[str, int, int, list[tuple[str, int]], int] | None: ...

def read_txn_request(
    data: bytes | bytearray | memoryview, start: int, stop: int, key: int, version: int, /
) -> tuple[str | None, int, int, object] | None: ...
def read_txn_response(
    data: bytes | bytearray | memoryview, start: int, stop: int, key: int, version: int, /
) -> tuple[int, int, int, list[tuple[str, int]], bool] | None: ...
def read_txn_offset_commit(
    data: bytes | bytearray | memoryview, start: int, stop: int, version: int, /
) -> tuple[str, str, int, int] | None: ...
def set_known_errors(low: int, high: int, /) -> None: ...

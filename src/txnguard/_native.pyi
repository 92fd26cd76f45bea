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
def endpoints_absent(
    data: bytes | bytearray | memoryview, start: int, stop: int, key: int, version: int, /
) -> bool: ...
_Value = tuple[int, int, int, str, frozenset[tuple[str, int]], int, int]
_Records = list[tuple[int, int, str | None, _Value | None]]

def read_log_records(
    data: bytes | bytearray | memoryview, start: int, stop: int, /
) -> tuple[_Records, tuple[bool, int] | None]: ...
def read_log_answer(
    data: bytes | bytearray | memoryview, start: int, stop: int, /
) -> tuple[int, int, list[tuple[int, int, int, int, _Records | None, tuple[bool, int] | None]]] | None: ...
def fetch_request(
    correlation_id: int, client_id: str, topic: str, partitions: list[tuple[int, int, int, int]], max_wait_ms: int,
    min_bytes: int, max_bytes: int, session_id: int, session_epoch: int, /
) -> bytes: ...
def read_batch_records(
    data: bytes | bytearray | memoryview, start: int, stop: int, /
) -> list[tuple[int, bytes | None, bytes | None]] | None: ...

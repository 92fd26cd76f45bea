"""`txnguard` without its native module: `python bench/general_path_proxy.py run <the flags of txnguard run>`.

bench/proxy_overhead.py starts its "txnguard, general path only" arm through this: the same proxy as the
txnguard arm, with txnguard._native hidden as an install built without cargo would have it (its import
fails), so `txnguard.codecs.native.AVAILABLE` is False and the general path (kio) reads every frame. The
proxy then exports txnguard_native_data_path 0, which the bench checks before it measures the arm.
"""

from __future__ import annotations

import sys

# Before anything imports txnguard: a None entry makes `import txnguard._native` raise ImportError
# (tests/unit/test_native_data_path.py hides it the same way).
sys.modules["txnguard._native"] = None  # type: ignore[assignment]

from txnguard.cli import main  # noqa: E402 - the module must be hidden first

if __name__ == "__main__":
    sys.exit(main())

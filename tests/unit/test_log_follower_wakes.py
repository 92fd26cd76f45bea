"""An absorption of CONCURRENT_TRANSACTIONS waits for the previous transaction's end: the follower wakes it when a
record read says that transaction ended (proxy/log_follower.py `when_ended`), not before, and not once forgotten.

    session ─when_ended("app")─▶ follower
    follower reads PrepareCommit("app")  ─▶ (nothing: the coordinator still refuses with 51)
    follower reads CompleteCommit("app") ─▶ session's callback, on the loop, once
    follower reads CompleteCommit, Ongoing("app") in one read ─▶ the callback too (the end inside the read)
"""

from __future__ import annotations

import asyncio

from txnguard.codecs.transaction_log import STATE, TOMBSTONE, Decoded, PartitionRead, TxnLogValue, latest
from txnguard.proxy.config import HostPort
from txnguard.proxy.log_follower import LogFollower
from txnguard.proxy.metrics import ProxyMetrics
from txnguard.verification.transaction_log_view import TransactionLogView

LEADER = HostPort("127.0.0.1", 9092)


def state(offset: int, txn_id: str, name: str) -> tuple[int, int, str, TxnLogValue]:
    return offset, STATE, txn_id, TxnLogValue(7, 0, 60_000, name, frozenset({("orders", 0)}), 1, 1)


def read(*records: Decoded) -> PartitionRead:
    """The records as an answer hands them to the follower (reduced to what the view applies)."""
    return latest(list(records), 0)


def follower() -> LogFollower:
    return LogFollower(TransactionLogView(), ProxyMetrics(), lambda: (LEADER,), lambda h, p: HostPort(h, p))


def test_a_waiter_is_woken_by_its_transactions_end_not_by_its_prepare_nor_by_another_id() -> None:
    async def scenario() -> list[str]:
        f, woken = follower(), []
        f.when_ended("app", lambda: woken.append("app"))
        f._read(4, read(state(0, "app", "Ongoing"), state(1, "other", "CompleteCommit"),
                        state(2, "app", "PrepareCommit")), None)
        await asyncio.sleep(0)
        assert woken == []
        f._read(4, read(state(3, "app", "CompleteCommit"), state(4, "app", "CompleteCommit")), None)
        assert woken == []  # not inside the follower's round: on the loop, after it
        await asyncio.sleep(0)
        return woken

    assert asyncio.run(scenario()) == ["app"]


def test_a_forgotten_waiter_is_not_woken_and_a_removed_id_wakes_its_waiters() -> None:
    async def scenario() -> list[str]:
        f, woken = follower(), []
        forget = f.when_ended("app", lambda: woken.append("forgotten"))
        f.when_ended("gone", lambda: woken.append("gone"))
        forget()
        assert "app" not in f._ending
        f._read(4, read(state(0, "app", "CompleteAbort"), (1, TOMBSTONE, "gone", None)), None)
        await asyncio.sleep(0)
        return woken

    assert asyncio.run(scenario()) == ["gone"]


def test_an_end_inside_a_read_wakes_its_waiter_though_the_ids_last_state_is_its_next_transaction() -> None:
    # An idle follower's read carries several transactions of one id: the view keeps the last state (Ongoing again),
    # and the end between them still wakes the absorption waiting for it.
    async def scenario() -> list[str]:
        f, woken = follower(), []
        f.when_ended("app", lambda: woken.append("app"))
        f._read(4, read(state(0, "app", "PrepareCommit"), state(1, "app", "CompleteCommit"),
                        state(2, "app", "Ongoing")), None)
        await asyncio.sleep(0)
        assert f.view.get("app") is not None and f.view.get("app").value.state == "Ongoing"
        return woken

    assert asyncio.run(scenario()) == ["app"]

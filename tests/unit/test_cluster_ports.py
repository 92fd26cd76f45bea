"""The test clusters' ports: picked below the kernel's ephemeral range (where an outgoing connection could take
a picked port before its node binds it), each pytest-xdist worker from a share of its own, never twice.

    _free_port ─▶ a port in [20000, ephemeral floor) of this worker's share, free now, not picked before
"""

from __future__ import annotations

import socket

import pytest

from txnguard.testing import kafka


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    floor = kafka._ephemeral_floor()
    assert floor is not None and floor - kafka._PORTS_FROM >= 2000  # this machine's range leaves room below it
    taken: set[int] = set()
    ports = [kafka._free_port("127.0.0.1", taken) for _ in range(50)]
    assert len(set(ports)) == 50 and set(ports) == taken
    assert all(kafka._PORTS_FROM <= p < floor for p in ports)
    for p in ports:  # each is free: a node can bind it
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))


@pytest.mark.parametrize("worker", ["gw0", "gw1"])
def test_each_worker_picks_from_a_share_of_its_own(monkeypatch: pytest.MonkeyPatch, worker: str) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    mine = kafka._port_range()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1" if worker == "gw0" else "gw0")
    theirs = kafka._port_range()
    assert not set(mine) & set(theirs)
    floor = kafka._ephemeral_floor()
    assert floor is not None and mine.start >= kafka._PORTS_FROM and mine.stop <= floor

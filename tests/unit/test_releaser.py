"""Large assembled frames are unmapped off the event loop's thread, once nothing refers to them.

    core ──SendToBroker([100 MiB frame, a view of a mapping])──▶ session ──▶ upstream transport
    session: keeps the mapping; once a second, the mappings no one else refers to ──▶ Releaser thread: munmap
"""

from __future__ import annotations

import mmap
import threading
import weakref

from txnguard.proxy.session import Releaser, unreferenced


def test_only_the_mappings_nothing_else_refers_to_are_taken():
    written, still_sending = mmap.mmap(-1, 4096), mmap.mmap(-1, 4096)
    view = memoryview(still_sending)[:100].toreadonly()  # as a transport's pending write holds it
    held = [written, still_sending]
    del written, still_sending
    free = unreferenced(held)
    assert len(free) == 1 and len(held) == 1 and held[0] is view.obj
    view.release()
    assert len(unreferenced(held)) == 1 and held == []


def test_the_releaser_unmaps_on_its_own_thread():
    gone = threading.Event()
    where: list[int] = []

    def unmapped() -> None:
        where.append(threading.get_ident())
        gone.set()

    frame = mmap.mmap(-1, 1 << 20)
    weakref.finalize(frame, unmapped)
    releaser = Releaser()
    mappings = [frame]
    del frame
    releaser.release(mappings)
    assert gone.wait(30), "the releaser never let the mapping go"
    assert where == [releaser._thread.ident] and where[0] != threading.get_ident()

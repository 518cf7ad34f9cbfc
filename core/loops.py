"""A loop on a daemon thread that runs only while there is work: started by the work, gone when idle."""

from __future__ import annotations

import threading
from collections.abc import Callable


class OnDemandLoop:
    """Run ``round`` on a daemon thread named ``name`` for as long as it returns True.

    ``start`` (called with ``lock`` held, as work is registered) starts the thread unless one runs. ``round`` ends
    the thread by returning False, when it has found nothing to do; ``busy`` (called with ``lock`` held) says
    whether work was registered as it ended, and then another thread starts, so that no work is left unserved.
    Under gevent's patched threading the thread is a greenlet.
    """

    def __init__(self, name: str, lock: threading.Lock, round_: Callable[[], bool], busy: Callable[[], bool]) -> None:
        self.name = name
        self._lock = lock
        self._round = round_
        self._busy = busy
        self._running = False

    def start(self) -> None:
        """Start the loop's thread unless one runs; call with the lock held."""
        if not self._running:
            self._running = True
            threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _run(self) -> None:
        try:
            while self._round():
                pass
        finally:
            with self._lock:
                self._running = False
                if self._busy():  # registered as the loop ended: start another
                    self.start()

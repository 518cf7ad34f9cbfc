"""Give a long-running worker's free heap back to the system.

A worker's task threads encode audio-sized buffers (numpy, libsndfile, libFLAC) and hand them between threads.
glibc keeps what they free inside its heaps: the pages stay resident though nothing uses them, and a worker's
RSS creeps up for as long as it runs. ``malloc_trim(0)`` returns every free page of every heap (not only the
top of the main one); a pass takes milliseconds. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def resident_kib() -> int:
    """Return this process's resident memory in KiB (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4
    except OSError:
        return 0


def release_free_memory() -> int:
    """Return freed heap pages to the system; return how many KiB of RSS that gave back."""
    if _TRIM is None:
        return 0
    before = resident_kib()
    _TRIM(0)
    released = max(0, before - resident_kib())
    log.debug("malloc_trim gave back %d KiB", released)
    return released

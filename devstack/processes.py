"""Look at processes through /proc (Linux), and wait for a condition with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """Return the process's state letter and parent pid, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Say whether the process exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> list[int]:
    """Return the live children of the process, oldest first."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.append(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Return every live process below this one."""
    below = children(pid)
    return below + [grandchild for child in below for grandchild in descendants(child)]


def cmdline(pid: int) -> list[str]:
    """Return the process's arguments (empty if it is gone)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def environ(pid: int) -> dict[str, str]:
    """Return the environment the process started with (empty if it is gone)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def kill_quietly(pid: int) -> None:
    """SIGKILL a process that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll the condition until it returns something truthy, and return that; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(interval)

"""One program of the stack in a process of its own, its output in a log file."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from devstack.local import ROOT


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def stop_children_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``) end this process as an exception does, so that the ``finally`` that
    stops its children runs: by default SIGTERM ends it at once and leaves them running. Only from the main
    thread (where Python runs handlers), and only where nobody has set a handler of their own."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


@functools.cache
def _setpriv_with_pdeathsig() -> str | None:
    binary = shutil.which("setpriv")
    if binary is None:
        return None
    found = subprocess.run([binary, "--help"], capture_output=True, text=True, check=False)
    return binary if "--pdeathsig" in found.stdout else None


def lifeline() -> list[str]:
    """Return the prefix that makes a program started with it get SIGTERM when its starter dies (util-linux's
    ``setpriv --pdeathsig``), so that a driver killed outright (SIGKILL, the OOM killer, a CI timeout), whose
    ``finally`` never runs, leaves no Redis, worker or API running; it execs the program, which keeps its pid.

    Empty off the main thread: the kernel sends the signal when the starting *thread* ends, and a helper thread's
    end would stop a program its driver still uses. Empty too where setpriv is missing or lacks the option.
    """
    if threading.current_thread() is not threading.main_thread():
        return []
    binary = _setpriv_with_pdeathsig()
    return [] if binary is None else [binary, "--pdeathsig", "TERM", "--"]


class ChildProcess:
    """A program started from the checkout with the environment it is given on top of this process's own."""

    #: How errors name the program.
    name = "the process"

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``command`` in the checkout; its output goes to the log file."""
        stop_children_on_sigterm()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([*lifeline(), *command], cwd=ROOT, env=self.env, stdout=log, stderr=log)
        return self.process

    @property
    def pid(self) -> int:
        """Return the process id."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.process.pid

    def exited(self) -> bool:
        """Say whether the process was started and has ended."""
        return self.process is not None and self.process.poll() is not None

    def log_tail(self, lines: int = 60) -> str:
        """Return the end of the log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 30) -> None:
        """Send ``sig`` and wait; SIGKILL the process if it outlives ``grace_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

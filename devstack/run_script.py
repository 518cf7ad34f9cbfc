"""`make run` (scripts/run.sh under supervisord) as a test drives it: its output, its programs' pids."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from devstack.child import lifeline
from devstack.local import ROOT, free_port
from devstack.processes import descendants, wait_for


class RunScript:
    """scripts/run.sh in a session of its own, its output collected, supervisorctl at hand."""

    def __init__(self, run_dir: Path, supervisorctl: Path, env: Mapping[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.supervisorctl = supervisorctl
        self.api_port = free_port()
        self.redis_port = free_port()
        self.lines: list[str] = []
        self.seen: set[int] = set()
        environment = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")}
        environment.update(TTS_RUN_DIR=str(run_dir), TTS_REDIS_PORT=str(self.redis_port),
                           TTS_API_PORT=str(self.api_port), TTS_DEFAULT_MODEL="espeak-en", TTS_METRICS_PORT="0",
                           TTS_API_PROCESSES="1")  # fmt: skip
        environment.update(env or {})
        # Its own session: SIGINT to its process group is what Ctrl-C in a terminal sends.
        # setpriv (lifeline) sends run.sh SIGTERM, which it passes on, if this driver is killed outright.
        self.process = subprocess.Popen([*lifeline(), "bash", "scripts/run.sh"], cwd=ROOT, env=environment,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace"))

    @property
    def text(self) -> str:
        """Return its output so far."""
        return "".join(self.lines)

    def pid_of(self, program: str) -> int:
        """Return the pid supervisord has for the program, or 0."""
        conf = str(self.run_dir / "supervisord.conf")
        answer = subprocess.run([str(self.supervisorctl), "-c", conf, "pid", program],
                                capture_output=True, text=True, check=False)  # fmt: skip
        return int(answer.stdout.strip()) if answer.stdout.strip().isdigit() else 0

    def replaced(self, program: str, old: int) -> int:
        """Wait until supervisord runs the program under a pid other than old, and return it."""
        return wait_for(lambda: (pid := self.pid_of(program)) not in (0, old) and pid, 30, f"{program} back", 0.2)

    def served_by(self, pid: int) -> bool:
        """Say whether /readyz is 200 and lists the worker with this pid among the live ones."""
        answer = readyz(self.api_port)
        return answer is not None and any(f"-{pid}@" in w["hostname"] for w in answer["workers"])  # type: ignore[attr-defined]

    def remember(self) -> None:
        """Note every process of the stack now, to check later that none is left."""
        self.seen.update(descendants(self.process.pid))

    def close(self) -> None:
        """Stop it if it still runs, and close its output."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(90)
        self.reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def readyz(port: int) -> dict[str, object] | None:
    """Return /readyz's answer when it is 200, else None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return dict(json.load(response))
    except OSError:
        return None

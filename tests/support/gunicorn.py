"""The API under gunicorn as `make run` serves it: the same config file (api/gunicorn_conf.py), a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tests.support.processes import wait_for
from tests.support.servers import ROOT, free_port

#: The one place gunicorn's flags live; scripts/run.sh passes the same file.
CONFIG = ROOT / "api" / "gunicorn_conf.py"


def gunicorn_command(host: str, port: int, processes: int) -> list[str]:
    """Return the command `make run` starts the API with, binding ``host:port`` with ``processes`` workers."""
    gunicorn = Path(sys.executable).with_name("gunicorn")
    return [str(gunicorn), "-c", str(CONFIG), "--bind", f"{host}:{port}", "--workers", str(processes),
            "api:create_app()"]  # fmt: skip


class GunicornApi:
    """gunicorn serving the API with its processes sharing metrics through ``metrics_dir``."""

    def __init__(self, env: Mapping[str, str], log_path: Path, metrics_dir: Path, *, processes: int = 2) -> None:
        metrics_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        self.log_path = log_path
        self.port = free_port()
        self.processes = processes
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return the API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def start(self, timeout: float = 90) -> None:
        """Start gunicorn and wait until /healthz answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                gunicorn_command("127.0.0.1", self.port, self.processes), cwd=ROOT, env=self.env, stdout=log, stderr=log
            )
        wait_for(self._healthy, timeout, "gunicorn answering /healthz", 0.1)

    def log_tail(self, lines: int = 60) -> str:
        """Return the end of gunicorn's log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop gunicorn (SIGTERM; SIGKILL if it outlives its graceful timeout)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

"""The API under gunicorn, as `make run` serves it, in a process of its own."""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from devstack.child import ChildProcess
from devstack.local import ROOT, free_port

#: The one place gunicorn's flags live; scripts/run.sh passes the same file.
GUNICORN_CONFIG = ROOT / "api" / "gunicorn_conf.py"


def gunicorn_command(host: str, port: int, processes: int) -> list[str]:
    """Return the command `make run` starts the API with, binding ``host:port`` with ``processes`` workers."""
    gunicorn = Path(sys.executable).with_name("gunicorn")
    return [str(gunicorn), "-c", str(GUNICORN_CONFIG), "--bind", f"{host}:{port}", "--workers", str(processes),
            "api:create_app()"]  # fmt: skip


class ApiProcess(ChildProcess):
    """The API under gunicorn as `make run` serves it (api/gunicorn_conf.py: gevent workers) on a free port.

    With ``metrics_dir``, its processes share their metrics through it (PROMETHEUS_MULTIPROC_DIR), as in `make run`.
    """

    name = "the API"

    def __init__(
        self, env: Mapping[str, str], log_path: Path, *, processes: int = 2, metrics_dir: Path | None = None
    ) -> None:
        super().__init__(env, log_path)
        if metrics_dir is not None:
            metrics_dir.mkdir(parents=True, exist_ok=True)
            self.env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        self.port = free_port()
        self.processes = processes

    @property
    def url(self) -> str:
        """Return the API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        if self.exited():
            raise RuntimeError(f"gunicorn exited:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def start(self, timeout: float = 90) -> None:
        """Start gunicorn and wait until /healthz answers."""
        self.spawn(gunicorn_command("127.0.0.1", self.port, self.processes))
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"API did not start:\n{self.log_tail()}")
            time.sleep(0.1)

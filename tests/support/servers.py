"""Start a real redis-server and real worker processes for the tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Return a TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server on an ephemeral port with its data in a temporary directory."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run scripts/ensure_redis_server.sh")
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.binary = binary

    @property
    def url(self) -> str:
        """Return the URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (AOF on, noeviction, as in production) and wait until it answers."""
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--maxmemory-policy",
                "noeviction",
                "--save",
                "",
                "--logfile",
                str(self.workdir / "redis.log"),
            ],
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def kill(self) -> None:
        """End the server with SIGKILL, as a crash would: no final AOF flush, no shutdown save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        """Start the server again on the same port and directory, so it reloads its AOF."""
        self.kill()
        self.start()


class WorkerProcess:
    """A real worker (`python -m workers`) in its own process."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the worker; its output goes to the log file."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workers"], cwd=ROOT, env=self.env, stdout=log, stderr=log
            )

    def wait_ready(self, client: redis.Redis, timeout: float = 120) -> None:
        """Wait until the worker's heartbeat appears in Redis."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log_tail()}")
            beats = [client.get(key) for key in client.scan_iter(match="tts:worker:*")]
            if any(beat and not json.loads(beat).get("loading") for beat in beats):
                return  # a worker announced, its models loaded
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        """Return the worker's process id."""
        if self.process is None:
            raise RuntimeError("the worker was not started")
        return self.process.pid

    def log_tail(self, lines: int = 60) -> str:
        """Return the end of the worker's log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the worker and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


#: The one place gunicorn's flags live; scripts/run.sh passes the same file.
GUNICORN_CONFIG = ROOT / "api" / "gunicorn_conf.py"


def gunicorn_command(host: str, port: int, processes: int) -> list[str]:
    """Return the command `make run` starts the API with, binding ``host:port`` with ``processes`` workers."""
    gunicorn = Path(sys.executable).with_name("gunicorn")
    return [str(gunicorn), "-c", str(GUNICORN_CONFIG), "--bind", f"{host}:{port}", "--workers", str(processes),
            "api:create_app()"]  # fmt: skip


class ApiProcess:
    """The API under gunicorn as `make run` serves it (api/gunicorn_conf.py: gevent workers) on a free port.

    With ``metrics_dir``, its processes share their metrics through it (PROMETHEUS_MULTIPROC_DIR), as in `make run`.
    """

    def __init__(
        self, env: Mapping[str, str], log_path: Path, *, processes: int = 2, metrics_dir: Path | None = None
    ) -> None:
        self.env = {**os.environ, **env}
        if metrics_dir is not None:
            metrics_dir.mkdir(parents=True, exist_ok=True)
            self.env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
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
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"API did not start:\n{self.log_tail()}")
            time.sleep(0.1)

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

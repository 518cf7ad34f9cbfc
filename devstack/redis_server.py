"""A real redis-server on a free port, configured as production runs it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from devstack.child import lifeline, stop_children_on_sigterm
from devstack.local import free_port


class RedisServer:
    """A redis-server on an ephemeral port with its data in a temporary directory; ``extra`` arguments go last
    (a replica's ``--replicaof``, say)."""

    def __init__(self, workdir: Path, extra: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run scripts/ensure_redis_server.sh")
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.binary = binary
        self.extra = list(extra)

    @property
    def url(self) -> str:
        """Return the URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """Return the server's command line: AOF on, noeviction and no snapshots, as in production."""
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
                "--save", "", "--logfile", str(self.workdir / "redis.log"), *self.extra]  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it answers."""
        stop_children_on_sigterm()
        self.process = subprocess.Popen([*lifeline(), *self.command()])
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
        """Stop the server; one that will not end within 10 s (a replica refuses to shut down while it writes
        its first AOF file) is killed."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """End the server with SIGKILL, as a crash would: no final AOF flush, no shutdown save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): its sockets stay open and answer nothing, as a host that hangs does."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start the server again on the same port and directory, so it reloads its AOF."""
        self.kill()
        self.start()

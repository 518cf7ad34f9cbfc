"""A real worker (`python -m workers`) in its own process, and the heartbeats workers leave in Redis."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from devstack.child import ChildProcess

#: Where every worker's heartbeat lives (cache.keys.worker("*")).
HEARTBEATS = "tts:worker:*"


def heartbeats(client: redis.Redis) -> list[dict[str, Any]]:
    """Return every live worker's latest heartbeat."""
    found = []
    for key in client.scan_iter(match=HEARTBEATS):
        raw = client.get(key)
        if raw:
            found.append(dict(json.loads(raw)))
    return found


class WorkerProcess(ChildProcess):
    """A real worker (`python -m workers`) in its own process."""

    name = "the worker"

    def start(self) -> None:
        """Start the worker; its output goes to the log file."""
        self.spawn([sys.executable, "-m", "workers"])

    def wait_ready(self, client: redis.Redis, timeout: float = 120) -> None:
        """Wait until some worker's heartbeat appears in Redis with its models loaded."""
        self._wait(lambda: any(not beat.get("loading") for beat in heartbeats(client)), timeout)

    def heartbeat(self, client: redis.Redis) -> dict[str, Any] | None:
        """Return this worker's latest heartbeat, or None while it has none."""
        return next((beat for beat in heartbeats(client) if beat.get("pid") == self.pid), None)

    def wait_heartbeat(self, client: redis.Redis, timeout: float = 120) -> dict[str, Any]:
        """Wait until this worker (not merely some worker) announces itself with its models loaded; return that."""
        found: list[dict[str, Any]] = []

        def loaded() -> bool:
            beat = self.heartbeat(client)
            if beat is not None and not beat.get("loading"):
                found.append(beat)
            return bool(found)

        self._wait(loaded, timeout)
        return found[0]

    def _wait(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exited():
                raise RuntimeError(f"worker exited early:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.log_tail()}")

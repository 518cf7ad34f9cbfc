"""Redis, one worker and the API under gunicorn, as `make run` starts them, each a real process."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis

from celery_config import QUEUES, queue_keys
from devstack.api import ApiProcess
from devstack.redis_server import RedisServer
from devstack.worker import WorkerProcess, heartbeats

#: The hash in which kombu keeps the tasks a worker took and has not acknowledged yet.
UNACKED = "unacked"


class ServiceStack:
    """A Redis in ``redis_dir``, one worker and the API, sharing ``env``; Redis's URL is added to it."""

    def __init__(
        self, env: Mapping[str, str], *, redis_dir: Path, worker_log: Path, api_log: Path, api_processes: int = 2
    ) -> None:
        self.redis_server = RedisServer(redis_dir)
        self.env = {**env, "REDIS_URL": self.redis_server.url}
        self.client = redis.Redis.from_url(self.redis_server.url)
        self.worker = WorkerProcess(self.env, worker_log)
        self.api = ApiProcess(self.env, api_log, processes=api_processes)

    def start(self, *, ready_timeout: float = 300, overlap: bool = False) -> None:
        """Start Redis, the worker and the API; with ``overlap`` the API starts while the worker loads its model."""
        self.redis_server.start()
        self.worker.start()
        if overlap:
            self.api.start()
        self.worker.wait_ready(self.client, timeout=ready_timeout)
        if not overlap:
            self.api.start()

    def heartbeat(self) -> dict[str, Any]:
        """Return the worker's latest heartbeat (empty while it has none)."""
        return next(iter(heartbeats(self.client)), {})

    def queued(self) -> int:
        """Return how many segment tasks wait in the broker's queues, every lane and priority step included."""
        return sum(int(self.client.llen(key)) for lane in QUEUES for key in queue_keys(lane))

    def backlog(self) -> int:
        """Count segment tasks queued or held unacknowledged by the worker (0: the worker is idle)."""
        return self.queued() + int(self.client.hlen(UNACKED))

    def stop(self) -> None:
        """Stop the API, the worker and Redis, carrying on past a part that fails to stop."""
        for stop in (self.api.stop, self.worker.stop, self.redis_server.stop):
            try:
                stop()
            except Exception as e:  # keep stopping the rest
                print(f"warning: stopping failed: {e}", file=sys.stderr)
        self.client.close()

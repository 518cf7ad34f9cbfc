"""Start a real redis-server and real worker processes for the tests (devstack's, under the names tests import)."""

from __future__ import annotations

from devstack.api import GUNICORN_CONFIG, ApiProcess, gunicorn_command
from devstack.local import ROOT, free_port
from devstack.redis_server import RedisServer
from devstack.worker import WorkerProcess

__all__ = ["GUNICORN_CONFIG", "ROOT", "ApiProcess", "RedisServer", "WorkerProcess", "free_port", "gunicorn_command"]

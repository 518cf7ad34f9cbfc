"""One whole service per scenario: its own Redis (AOF on), real workers, the API app, and ways to hurt them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import redis
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from cache import keys
from cache.connect import redis_client
from cache.jobstore import TERMINAL, JobRequest, JobStore
from devstack.local import ROOT
from devstack.processes import descendants, kill_quietly
from devstack.redis_server import RedisServer
from devstack.sentinel import SentinelGroup
from devstack.worker import WorkerProcess

#: Worker settings every scenario shares. Every timer is `make run`'s default (heartbeat, reconciler interval
#: and stall, visibility timeout, task time limit, attempts): a scenario rescued by a shortened timer would
#: prove only the timer. A scenario that must shorten one says so in its row.
WORKER_ENV = {
    "TTS_DEFAULT_MODEL": "espeak-en",
    "TTS_DEVICE": "cpu",
    "TTS_METRICS_PORT": "0",
    "TTS_LOG_LEVEL": "INFO",
    "TTS_LOG_FORMAT": "json",
    # The ``faulty`` engine is test code: the workers load it as a plugin, production never does.
    "TTS_ENGINE_PLUGINS": "tests.support.engines",
}


def write_registry(path: Path) -> Path:
    """Write the project's registry plus the ``faulty`` model (espeak that hangs or dies on markers)."""
    registry = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    espeak = registry["models"]["espeak-en"]
    registry["models"]["faulty"] = {
        "engine": "faulty",
        "language": "en",
        "memory_mb": 20,
        "default_voice": "default",
        "voices": dict(espeak["voices"]),
        "options": {"language": "en-us"},
    }
    path.write_text(json.dumps(registry), encoding="utf-8")
    return path


class Stack:
    """A Redis (or, with ``sentinel``, a Sentinel group: a primary, two replicas, three Sentinels), any number of
    workers and an in-process API app, all on fresh ports in ``workdir``."""

    def __init__(
        self, workdir: Path, *, worker_env: Mapping[str, str] | None = None, sentinel: bool = False, **api: Any
    ) -> None:
        self.workdir = workdir
        self.redis_server = RedisServer(workdir / "redis")
        self.group: SentinelGroup | None = None
        if sentinel:
            self.group = SentinelGroup(workdir / "redis-ha")
            self.group.start()
            url = self.group.url
        else:
            self.redis_server.start()
            url = self.redis_server.url
        models_file = write_registry(workdir / "models.json")
        self.env = {
            **WORKER_ENV,
            "REDIS_URL": url,
            "TTS_MODELS_FILE": str(models_file),
            # No ChatTTS weights here, whatever the machine has: a pinned ChatTTS would load at start-up.
            "TTS_CHATTTS_WEIGHTS_DIR": str(workdir / "no-chattts"),
            **(worker_env or {}),
        }
        # Through the Sentinels when there are some: the scenario's own reads follow a failover as the service's do.
        self.redis = redis_client(url, socket_timeout=5, socket_connect_timeout=2)
        self.store = JobStore(self.redis, ttl=3600)
        self.workers: list[WorkerProcess] = []
        self._orphans: set[int] = set()
        self._stopped: set[int] = set()  # pids of workers this stack ended on purpose
        self.exits: list[tuple[int, int]] = []  # (pid, exit status) of workers that ended on their own
        config = {
            "redis_url": url,
            "models_file": models_file,
            "default_model": "espeak-en",
            "chattts_weights_dir": workdir / "no-chattts",
            **api,
        }
        try:
            self.app: Flask = create_app(config)
        except Exception:
            self._stop_redis()  # the fixture never sees a stack that failed to build
            raise

    def client(self) -> FlaskClient:
        """Return a test client of the API (one per thread)."""
        return self.app.test_client()

    def start_worker(self, *, wait: bool = True) -> WorkerProcess:
        """Start one more worker and, unless told not to, wait for its heartbeat."""
        worker = WorkerProcess(self.env, self.workdir / f"worker-{len(self.workers)}.log")
        worker.start()
        self.workers.append(worker)
        if wait:
            self.wait_heartbeat(worker)
        return worker

    def heartbeat(self, worker: WorkerProcess) -> dict[str, Any] | None:
        """Return the worker's latest heartbeat, or None while it has none."""
        return worker.heartbeat(self.redis)

    def wait_heartbeat(self, worker: WorkerProcess, timeout: float = 120) -> dict[str, Any]:
        """Wait until this worker (not merely some worker) announces itself."""
        return worker.wait_heartbeat(self.redis, timeout)

    def host_pid(self, worker: WorkerProcess, model: str, timeout: float = 30) -> int:
        """Return the pid of the worker's host process for ``model``, as its heartbeat lists it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            beat = self.heartbeat(worker) or {}
            for host in beat.get("pool", []):
                if host["model"] == model and host["pid"] in descendants(worker.pid):
                    return int(host["pid"])
            time.sleep(0.1)
        raise TimeoutError(f"no host of {model} under worker {worker.pid}:\n{worker.log_tail()}")

    def kill_worker(self, worker: WorkerProcess, sig: int = signal.SIGKILL) -> None:
        """Signal a worker and wait for it to end; its model hosts are remembered for clean-up."""
        self._stopped.add(worker.pid)
        self._orphans.update(descendants(worker.pid))
        worker.stop(sig)

    def supervise(self) -> None:
        """Restart workers that ended on their own with a failure status, as systemd's Restart=on-failure does."""
        for worker in list(self.workers):
            code = None if worker.process is None else worker.process.poll()
            if code is None or worker.pid in self._stopped:
                continue
            self._stopped.add(worker.pid)
            self.exits.append((worker.pid, code))
            if code != 0:
                self.start_worker(wait=False)

    def submit(self, client: FlaskClient, body: Mapping[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """POST one job; return the status code, JSON body and headers."""
        response = client.post("/v1/jobs", json=dict(body))
        return response.status_code, response.get_json(silent=True) or {}, dict(response.headers)

    def submit_all(self, bodies: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Submit jobs that must all be accepted; return their views."""
        client = self.client()
        views = []
        for body in bodies:
            status, view, _ = self.submit(client, body)
            assert status == 202, view
            views.append(view)
        return views

    def write_unqueued(self, texts: list[str], *, seed: int) -> str:
        """Write a job as the API does (its first window in the outbox), then stop: what an API killed before
        enqueueing leaves."""
        request = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                             priority="realtime", seed=seed, cache=False)  # fmt: skip
        return self.store.create(request, texts, publish=range(len(texts)))

    def progress(self, job_ids: Iterable[str]) -> tuple[int, int]:
        """Return (segments written, attempts started) over the jobs; attempts ahead of writes are in flight."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hlen(keys.audio(job_id))
            pipe.hgetall(keys.attempts(job_id))
        replies = pipe.execute()
        written = sum(int(n) for n in replies[0::2])
        attempted = sum(int(v) for counts in replies[1::2] for k, v in counts.items() if k.isdigit())
        return written, attempted

    def record(self, job_id: str) -> dict[str, str]:
        """Return a job's record (empty when there is none)."""
        # The hash as strings, as the scenarios read it (store.get parses it into a typed JobRecord).
        raw = self.redis.hgetall(keys.job(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def attempts(self, job_id: str) -> dict[int, int]:
        """Return the attempts each segment of a job has started (``store.failures`` counts those that failed)."""
        return {int(k): int(v) for k, v in self.redis.hgetall(keys.attempts(job_id)).items() if k.isdigit()}

    @contextlib.contextmanager
    def models_paused(self, worker: WorkerProcess, model: str = "espeak-en") -> Iterator[None]:
        """Freeze the worker's model host (SIGSTOP) for a moment, so work piles up instead of finishing.

        Submitting is slower than espeak is fast: without a pause, a fault meant for
        mid-batch could land after the last segment. The worker stays up meanwhile,
        heartbeat and all, so admission accepts the jobs.
        """
        pid = self.host_pid(worker, model)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill_host(self, pid: int) -> None:
        """SIGKILL a model host, as the OOM killer would."""
        os.kill(pid, signal.SIGKILL)

    def wait_in_flight(self, job_ids: list[str], timeout: float = 30) -> tuple[int, int]:
        """Wait until some segments are written and more are being made; return the progress then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            written, attempted = self.progress(job_ids)
            if 0 < written < attempted:
                return written, attempted
            time.sleep(0.01)
        raise TimeoutError(f"no segment in flight within {timeout}s: {self.progress(job_ids)}")

    def wait_terminal(self, job_ids: list[str], timeout: float) -> float:
        """Wait until every job has ended (or the time is up), supervising the workers; return the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self.supervise()
            try:
                pipe = self.redis.pipeline(transaction=False)
                for job_id in job_ids:
                    pipe.hget(keys.job(job_id), "status")
                statuses = pipe.execute()
            except redis.ConnectionError:
                statuses = [None]  # Redis is restarting: keep waiting
            if all(s is not None and s.decode() in TERMINAL for s in statuses):
                break
            time.sleep(0.1)
        return time.monotonic() - started

    def close(self) -> None:
        """Kill every worker and any model host left behind, stop Redis."""
        for worker in self.workers:  # SIGKILL: this stack's Redis is thrown away, nothing needs a clean exit
            if worker.process is not None and worker.process.poll() is None:
                self.kill_worker(worker)
        for pid in self._orphans:
            kill_quietly(pid)
        services = self.app.extensions["tts"]
        for client in (self.redis, services.redis, services.cache.redis):  # else their sockets leak to the GC
            client.close()
        self._stop_redis()

    def _stop_redis(self) -> None:
        if self.group is not None:
            self.group.stop()
        self.redis_server.stop()

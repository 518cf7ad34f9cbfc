"""A real stack serving the tiny ChatTTS on the CPU (Redis, one worker, the API) and its HTTP calls, for the benches.

The logs of each bench's worker and API go to bench/results/<bench>-worker.log and -api.log.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import requests

from bench.report import RESULTS
from bench.stack_args import HEARTBEAT_S
from bench.tiny_model import MODEL, ensure_tiny_model
from cache.workers import WorkerRegistry
from client.sse import parse_sse
from devstack.service import ServiceStack
from devstack.worker import WorkerProcess


@dataclass
class Stack:
    """A running Redis, worker and API, and how to reach them."""

    service: ServiceStack

    @property
    def url(self) -> str:
        """Return the API's base URL."""
        return self.service.api.url

    @property
    def redis(self) -> redis.Redis:
        """Return a client of the stack's Redis."""
        return self.service.client

    @property
    def worker(self) -> WorkerProcess:
        """Return the worker process."""
        return self.service.worker

    def submit(self, session: requests.Session, **body: Any) -> dict[str, Any]:
        """POST a job and return its JSON; fail loudly on anything but 202."""
        response = session.post(f"{self.url}/v1/jobs", json={"model": MODEL, **body}, timeout=60)
        if response.status_code != 202:
            raise RuntimeError(f"submit answered {response.status_code}: {response.text[:300]}")
        job: dict[str, Any] = response.json()
        return job

    def job(self, session: requests.Session, job_id: str) -> dict[str, Any]:
        """Return a job's JSON."""
        response = session.get(f"{self.url}/v1/jobs/{job_id}", timeout=30)
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        return job

    def segment(self, session: requests.Session, job_id: str, index: int, wait: float = 30) -> bytes:
        """Long-poll one segment's audio and return all of its bytes."""
        response = session.get(f"{self.url}/v1/jobs/{job_id}/segments/{index}", params={"wait": wait}, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"segment {index} answered {response.status_code}: {response.text[:300]}")
        return response.content

    def workers(self) -> list[dict[str, Any]]:
        """Return the live workers' heartbeats."""
        return WorkerRegistry(self.redis, ttl_s=3 * HEARTBEAT_S).alive()

    def wait_idle(self, timeout: float = 120) -> None:
        """Wait until no segment task is queued or running."""
        deadline = time.monotonic() + timeout
        while self.service.backlog():
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker still busy after {timeout}s:\n{self.worker.log_tail()}")
            time.sleep(0.05)


def sse_events(session: requests.Session, url: str) -> Generator[tuple[str, Any], None, None]:
    """Yield (event name, data) from a server-sent event stream as each event arrives (client.api's parser)."""
    with session.get(url, stream=True, timeout=120) as response:
        response.raise_for_status()
        for event in parse_sse(response.iter_content(chunk_size=None)):
            yield event["event"], event["data"]


def wait_done(stack: Stack, session: requests.Session, job_id: str) -> str:
    """Follow a job's events until it ends and return how it ended."""
    with closing(sse_events(session, f"{stack.url}/v1/jobs/{job_id}/events")) as events:
        for name, _ in events:
            if name != "segment":
                return name
    raise RuntimeError(f"event stream of job {job_id} ended without a final status")


def first_segment_latency(stack: Stack, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Submit a job and long-poll its segment 0; return the seconds until its bytes arrived, and the job."""
    with requests.Session() as session:
        started = time.perf_counter()
        job = stack.submit(session, **body)
        audio = stack.segment(session, job["id"], 0)
        elapsed = time.perf_counter() - started
    if len(audio) < 100:
        raise RuntimeError(f"segment 0 of job {job['id']} has only {len(audio)} bytes")
    return elapsed, job


def stack_env(model_dir: Path, **env: str) -> dict[str, str]:
    """Return the environment of a bench stack's worker and API: the tiny model, otherwise `make run`'s defaults."""
    return {
        "TTS_DEFAULT_MODEL": MODEL,
        "TTS_TINY_MODEL_DIR": str(model_dir),
        "TTS_METRICS_PORT": "0",  # the default port may be another worker's on a shared machine
        **env,
    }


@contextmanager
def running_stack(name: str, **env: str) -> Iterator[Stack]:
    """Start Redis, one worker serving the tiny ChatTTS on the CPU, and the API; stop them afterwards."""
    model_dir = ensure_tiny_model()
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = {part: RESULTS / f"{name}-{part}.log" for part in ("worker", "api")}
    for path in logs.values():
        path.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        service = ServiceStack(
            stack_env(model_dir, **env), redis_dir=Path(tmp) / "redis", worker_log=logs["worker"], api_log=logs["api"]
        )
        try:
            service.start(ready_timeout=240, overlap=True)
            yield Stack(service)
        finally:
            service.stop()

"""Start and stop what the benchmark drives: the service (Redis, API, one worker) and the baseline server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis

from tests.support.servers import ROOT, ApiProcess, RedisServer, WorkerProcess, free_port


def bench_models_file(out_dir: Path) -> Path:
    """Write the registry with the tiny model's cap lifted, so every budget stays 6 tokens per character.

    The tiny model's entry caps a segment at 600 tokens (100 characters); the baseline's whole texts run
    to 200 characters, and a cap would make it produce less audio than the service for the same text.
    """
    registry = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    tiny = registry["models"].get("chattts-tiny")
    if tiny is not None:
        tiny["options"] = {**tiny.get("options", {}), "max_tokens": 2048}
    path = out_dir / "models-bench.json"
    path.write_text(json.dumps(registry, indent=1), encoding="utf-8")
    return path


def broker_lists() -> list[str]:
    """Return the Redis lists that hold waiting segment tasks (one per lane and priority step, if any)."""
    import celery_config

    lanes = getattr(celery_config, "QUEUES", ("realtime", "batch"))
    keys_of = getattr(celery_config, "queue_keys", None)
    return [key for lane in lanes for key in (keys_of(lane) if keys_of else [lane])]


class ServiceStack:
    """Redis, one worker and the API under gunicorn, as `make run` starts them."""

    def __init__(self, env: dict[str, str], workdir: Path, *, api_processes: int) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis")
        self.metrics_port = free_port()
        self.env = {**env, "REDIS_URL": self.redis.url, "TTS_METRICS_PORT": str(self.metrics_port)}
        self.worker = WorkerProcess(self.env, workdir / "worker.log")
        self.api = ApiProcess(self.env, workdir / "api.log", processes=api_processes)
        self.client: redis.Redis | None = None

    def start(self) -> None:
        """Start Redis, the worker (waiting until its model is loaded) and the API."""
        self.redis.start()
        self.client = redis.Redis.from_url(self.redis.url)
        self.worker.start()
        self.worker.wait_ready(self.client, timeout=300)
        self.api.start()

    def heartbeat(self) -> dict[str, Any]:
        """Return the worker's latest heartbeat."""
        assert self.client is not None
        for key in self.client.scan_iter(match="tts:worker:*"):
            value = self.client.get(key)
            if value:
                found: dict[str, Any] = json.loads(value)
                return found
        return {}

    def worker_totals(self) -> dict[str, float]:
        """Return the worker's Prometheus counters and histogram sums, summed over their labels."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("tts_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                metric = name.split("{", 1)[0]
                if metric.endswith(("_sum", "_count", "_total")):
                    totals[metric] = totals.get(metric, 0.0) + float(value)
        return totals

    def queued(self) -> int:
        """Return how many segment tasks wait in the broker's queues, every priority step included."""
        assert self.client is not None
        return sum(int(self.client.llen(key)) for key in broker_lists())

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Wait until no segment task is queued, so one level's leftovers do not load the next."""
        assert self.client is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.queued():
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the API, the worker and Redis."""
        for stop in (self.api.stop, self.worker.stop, self.redis.stop):
            try:
                stop()
            except Exception as e:  # keep stopping the rest
                print(f"warning: stopping failed: {e}", file=sys.stderr)


class BaselineProcess:
    """The synchronous 'before' server in its own process."""

    def __init__(self, env: dict[str, str], log_path: Path, *, model: str, torch_threads: int, device: str) -> None:
        self.port = free_port()
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.args = ["--model", model, "--port", str(self.port), "--torch-threads", str(torch_threads)]
        self.args += ["--device", device]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return the server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> None:
        """Start the server and wait until it has loaded the model and answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.baseline_server", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"baseline server exited:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("baseline server did not start")

    def totals(self) -> dict[str, float]:
        """Return the engine's busy seconds and calls so far, named as the worker's metrics are."""
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as response:
            state = json.loads(response.read())
        calls = float(state["calls"])
        return {
            "tts_synthesis_seconds_sum": state["busy_s"],
            "tts_batch_size_sum": calls,
            "tts_batch_size_count": calls,
        }

    def wait_idle(self, timeout_s: float = 120) -> None:
        """Wait until the server has no request in hand."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as response:
                if json.loads(response.read()).get("pending", 0) == 0:
                    return
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

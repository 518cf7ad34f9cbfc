"""Start and stop what the benchmark drives: the service (Redis, API, one worker) and the baseline server."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

from devstack import service
from devstack.child import ChildProcess
from devstack.local import ROOT, free_port


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


class ServiceStack(service.ServiceStack):
    """Redis, one worker and the API under gunicorn, as `make run` starts them, logging into ``workdir``."""

    def __init__(self, env: dict[str, str], workdir: Path, *, api_processes: int) -> None:
        self.workdir = workdir
        self.metrics_port = free_port()
        super().__init__(
            {**env, "TTS_METRICS_PORT": str(self.metrics_port)},
            redis_dir=workdir / "redis",
            worker_log=workdir / "worker.log",
            api_log=workdir / "api.log",
            api_processes=api_processes,
        )

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

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Wait until no segment task is queued, so one level's leftovers do not load the next."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.queued():
            time.sleep(0.2)


class BaselineProcess(ChildProcess):
    """The synchronous 'before' server in its own process."""

    name = "the baseline server"

    def __init__(self, env: dict[str, str], log_path: Path, *, model: str, torch_threads: int, device: str) -> None:
        super().__init__(env, log_path)
        self.port = free_port()
        self.args = ["--model", model, "--port", str(self.port), "--torch-threads", str(torch_threads)]
        self.args += ["--device", device]

    @property
    def url(self) -> str:
        """Return the server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> None:
        """Start the server and wait until it has loaded the model and answers."""
        process = self.spawn([sys.executable, "-m", "bench.baseline_server", *self.args])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
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

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 20) -> None:
        """Stop the server (SIGKILL if it outlives ``grace_s``)."""
        super().stop(sig, grace_s)

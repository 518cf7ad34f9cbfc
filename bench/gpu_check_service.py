"""The GPU check's service part: Redis, one worker pinned to one device and the API (devstack), closed-loop callers.

Each level's callers follow every job as a listener would (bench/loadgen.py); a level reports jobs/s and
audio s/s finished inside its window, first audio at p50/p95 and how often, and how long, listeners stalled.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.headline_stack import ServiceStack
from bench.http_clients import ServedClient
from bench.loadgen import STALL_EPSILON_S, run_closed_loop
from bench.report import percentile, summarize
from devstack.local import ROOT


@dataclass(frozen=True)
class ServiceLevel:
    """What the callers of one level saw."""

    callers: int
    window_s: float
    jobs_ok: int
    jobs_per_s: float
    audio_s_per_s: float
    first_audio_p50_s: float | None
    first_audio_p95_s: float | None
    #: The share of finished jobs whose listener waited at least once for the next segment.
    stalled_share: float | None
    stall_p95_s: float | None
    errors: dict[str, int]

    def record(self) -> dict[str, Any]:
        """Return the level as JSON values."""
        return asdict(self)


def models_file(out: Path, model: str, options: dict[str, Any], *, precision: str | None = None) -> Path:
    """Write the registry with ``model``'s engine options (and precision) overridden, for a rehearsal."""
    registry = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    entry = registry["models"][model]
    entry["options"] = {**entry.get("options", {}), **options}
    if precision is not None:
        entry["precision"] = precision
    path = out / "models-gpu-check.json"
    path.write_text(json.dumps(registry, indent=1), encoding="utf-8")
    return path


def service_env(*, model: str, device: str, models: Path, max_batch: int, torch_threads: int) -> dict[str, str]:
    """Return the stack's environment: one worker, one model host on ``device``, batches up to ``max_batch``."""
    return {
        "TTS_MODELS_FILE": str(models),
        "TTS_DEFAULT_MODEL": model,
        "TTS_DEVICE": device,
        "TTS_MODEL_REPLICAS": "1",
        "TTS_BATCH_MAX_SIZE": str(max_batch),
        "TTS_WORKER_CONCURRENCY": str(max(128, 2 * max_batch)),
        "TTS_TORCH_THREADS": str(torch_threads),
    }


def level_summary(run: Any) -> ServiceLevel:
    """Summarise one level's run (bench.report's summary, with p95s added)."""
    summary = summarize(run)
    ok = [r for r in run.results if r.ok and run.window_start <= r.submitted <= run.window_end]
    first_audio = [r.first_audio - r.submitted for r in ok if r.first_audio is not None]
    stalls = [r.stall_s() for r in ok]
    return ServiceLevel(
        callers=run.callers,
        window_s=summary["window_s"],
        jobs_ok=summary["jobs_ok"],
        jobs_per_s=summary["jobs_per_s"],
        audio_s_per_s=summary["audio_s_per_s"],
        first_audio_p50_s=percentile(first_audio, 50),
        first_audio_p95_s=percentile(first_audio, 95),
        stalled_share=sum(1 for s in stalls if s > STALL_EPSILON_S) / len(stalls) if stalls else None,
        stall_p95_s=percentile(stalls, 95),
        errors=dict(summary["errors"]),
    )


def run_levels(
    env: dict[str, str],
    out: Path,
    *,
    model: str,
    texts: list[tuple[str, int]],
    levels: list[int],
    window_s: float,
    warmup_s: float,
    drain_s: float,
) -> list[ServiceLevel]:
    """Start the stack, drive each level of callers in turn, stop the stack; return what each level saw."""
    stack = ServiceStack(env, out, api_processes=2)
    found = []
    try:
        stack.start(ready_timeout=600)
        # A job still unfinished this long after its level's window would only load the next level.
        client = ServedClient(stack.api.url, model=model, timeout_s=window_s + drain_s + warmup_s)
        for n, callers in enumerate(levels):
            stack.wait_idle(timeout_s=drain_s)
            run = run_closed_loop(client, texts, callers=callers, warmup_s=warmup_s, window_s=window_s,
                                  drain_s=drain_s, seed=n)  # fmt: skip
            found.append(level_summary(run))
            level = found[-1]
            print(f"  {callers:>3} callers: {level.jobs_per_s:.2f} jobs/s, {level.audio_s_per_s:.2f} audio s/s, "
                  f"errors {level.errors or 0}", flush=True)  # fmt: skip
    finally:
        stack.stop()
        shutil.rmtree(out / "redis", ignore_errors=True)
    return found

"""The GPU check's service part: Redis, one worker pinned to one device and the API (devstack), closed-loop callers.

The worker runs at `make run`'s defaults but for its device, one model host and its batch cap: CUDA graphs at
``auto`` (graphs on a GPU), fragments on. Each level's callers follow every job's ``fragment`` events and play from
the first one (bench/fragments.py; stricter than the web page, which starts with two in hand); a level reports
jobs/s and audio s/s finished inside its window, first audio (submission to the first fragment) at p50/p95, and the
listeners who heard a gap: playing from the first fragment, waiting more than 0.1 s for a later one at least once.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.fragments import GAP_S, FragmentClient, gap_after_prefetch
from bench.headline_stack import ServiceStack
from bench.loadgen import run_closed_loop
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
    #: From submission to the first fragment in the listener's hands.
    first_audio_p50_s: float | None
    first_audio_p95_s: float | None
    #: The share of finished jobs whose listener, playing from the first fragment, waited over ``GAP_S`` at least once.
    gap_share: float | None
    gap_p95_s: float | None
    #: Submissions the API refused and the caller retried after its Retry-After.
    refusals: int
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


def service_env(
    *, model: str, device: str, models: Path, max_batch: int, torch_threads: int, graphs: str = "auto"
) -> dict[str, str]:
    """Return the stack's environment: one worker, one model host on ``device``, batches up to ``max_batch``, CUDA
    graphs ``graphs`` (the default, ``auto``, set all the same: a value exported where the check runs must not
    change what it measures)."""
    return {
        "TTS_MODELS_FILE": str(models),
        "TTS_DEFAULT_MODEL": model,
        "TTS_DEVICE": device,
        "TTS_MODEL_REPLICAS": "1",
        "TTS_BATCH_MAX_SIZE": str(max_batch),
        "TTS_WORKER_CONCURRENCY": str(max(128, 2 * max_batch)),
        "TTS_TORCH_THREADS": str(torch_threads),
        "TTS_CUDA_GRAPHS": graphs,
    }


def level_summary(run: Any) -> ServiceLevel:
    """Summarise one level's run (bench.report's summary; first audio and gaps from each job's fragments)."""
    summary = summarize(run)
    ok = [r for r in run.results if r.ok and run.window_start <= r.submitted <= run.window_end]
    first_audio = [r.first_audio - r.submitted for r in ok if r.first_audio is not None]
    gaps = [gap_after_prefetch(r.segments, 1)[1] for r in ok]
    return ServiceLevel(
        callers=run.callers,
        window_s=summary["window_s"],
        jobs_ok=summary["jobs_ok"],
        jobs_per_s=summary["jobs_per_s"],
        audio_s_per_s=summary["audio_s_per_s"],
        first_audio_p50_s=percentile(first_audio, 50),
        first_audio_p95_s=percentile(first_audio, 95),
        gap_share=sum(1 for g in gaps if g > GAP_S) / len(gaps) if gaps else None,
        gap_p95_s=percentile(gaps, 95),
        refusals=summary["admissions"],
        errors=dict(summary["errors"]),
    )


def served_path(worker_log: Path) -> str | None:
    """Return the decode path the worker's engine logged last (``decode_path``'s words), or None if none is there;
    and whether a call outgrew the static cache (the rest of it ran on the growing loop)."""
    try:
        text = worker_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.findall(r"(?:static|growing) cache, [^\n]*", text)
    if not found:
        return None
    outgrown = "does not fit the static cache" in text
    return found[-1].strip() + ("; a call outgrew the static cache and ran on the growing loop" if outgrown else "")


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
    done: Callable[[ServiceLevel], None] | None = None,
) -> list[ServiceLevel]:
    """Start the stack, drive each level of callers in turn, stop the stack; return what each level saw (``done``
    is told each level as it ends)."""
    stack = ServiceStack(env, out, api_processes=2)
    found = []
    try:
        stack.start(ready_timeout=600)
        # A job still unfinished this long after its level's window would only load the next level.
        client = FragmentClient(stack.api.url, model=model, timeout_s=window_s + drain_s + warmup_s)
        for n, callers in enumerate(levels):
            stack.wait_idle(timeout_s=drain_s)
            run = run_closed_loop(client, texts, callers=callers, warmup_s=warmup_s, window_s=window_s,
                                  drain_s=drain_s, seed=n)  # fmt: skip
            found.append(level_summary(run))
            level = found[-1]
            print(f"  {callers:>3} callers: {level.jobs_per_s:.2f} jobs/s, {level.audio_s_per_s:.2f} audio s/s, "
                  f"errors {level.errors or 0}", flush=True)  # fmt: skip
            if done is not None:
                done(level)
    finally:
        stack.stop()
        shutil.rmtree(out / "redis", ignore_errors=True)
    return found

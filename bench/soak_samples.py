"""What the soak samples as it runs (Redis memory, the API's and the workers' RSS, jobs/s) and its verdicts."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.soak_callers import Tally
from devstack.processes import descendants
from devstack.run_script import RunScript


def rss_mb(pids: list[int], field: str = "VmRSS") -> float:
    """Return the summed resident memory of these processes in MB (gone ones count 0).

    ``VmRSS`` is all of it; ``RssAnon`` only private memory (heaps, stacks, buffers: where a leak would show),
    without the pages of shared libraries and files, which come and go with the page cache."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Sample:
    minute: float
    redis_mb: float
    budget_mb: float
    kept_jobs: int
    api_mb: float
    worker_mb: float
    api_anon_mb: float
    worker_anon_mb: float
    jobs_s: float
    accepted: int
    admission: int
    errors: int


def sample(stack: RunScript, store: redis.Redis, tally: Tally, started: float, last: tuple[float, int]) -> Sample:
    info = store.info("memory")
    now = time.monotonic()
    with tally.lock:
        done, accepted, admission, errors = tally.done, tally.accepted, tally.admission, len(tally.errors)
    api, worker = stack.pid_of("api"), stack.pid_of("worker")
    api_pids = [api, *descendants(api)] if api else []
    worker_pids = [worker, *descendants(worker)] if worker else []
    return Sample(
        minute=(now - started) / 60,
        redis_mb=int(info["used_memory"]) / 2**20,
        budget_mb=int(info["maxmemory"]) / 2**20,
        kept_jobs=int(store.zcard("tts:audio:kept")),
        api_mb=rss_mb(api_pids),
        worker_mb=rss_mb(worker_pids),
        api_anon_mb=rss_mb(api_pids, "RssAnon"),
        worker_anon_mb=rss_mb(worker_pids, "RssAnon"),
        jobs_s=(done - last[1]) / max(1e-9, now - last[0]),
        accepted=accepted,
        admission=admission,
        errors=errors,
    )


HEADER = (
    "| min | Redis used MB | budget MB | jobs with audio kept | API RSS MB (private) | worker RSS MB (private) "
    "| jobs/s | accepted | 429/503 | errors |"
)
SEPARATOR = "|---" * (HEADER.count("|") - 1) + "|"


def row(s: Sample) -> str:
    return (f"| {s.minute:5.1f} | {s.redis_mb:8.1f} | {s.budget_mb:6.0f} | {s.kept_jobs} | {s.api_mb:6.1f} "
            f"({s.api_anon_mb:5.1f}) | {s.worker_mb:6.1f} ({s.worker_anon_mb:5.1f}) | {s.jobs_s:5.2f} | {s.accepted} "
            f"| {s.admission} | {s.errors} |")  # fmt: skip


def fitted(samples: list[Sample], value: Callable[[Sample], float]) -> tuple[float, float]:
    """Return a least-squares line's values at the first and the last sample.

    RSS saws as buffers come and go (±10 MB on a worker): two single samples say more about where each saw stood
    than about growth, so growth is read from the line through all of them."""
    if len(samples) < 2:
        only = value(samples[0]) if samples else 0.0
        return only, only
    slope, intercept = statistics.linear_regression([s.minute for s in samples], [value(s) for s in samples])
    return intercept + slope * samples[0].minute, intercept + slope * samples[-1].minute


def _change(fit: tuple[float, float]) -> float:
    return fit[1] / fit[0] - 1 if fit[0] else 0.0


def private_growth(samples: list[Sample]) -> str:
    """Say how private memory (RssAnon: no shared-library or file pages) moved after warm-up, as a figure."""
    warm = [s for s in samples if s.minute >= samples[-1].minute / 3] or samples
    api, worker = fitted(warm, lambda s: s.api_anon_mb), fitted(warm, lambda s: s.worker_anon_mb)
    return (f"private memory (RssAnon) after warm-up, least-squares line: API {api[0]:.0f} → {api[1]:.0f} MB "
            f"({_change(api):+.1%}), worker {worker[0]:.0f} → {worker[1]:.0f} MB ({_change(worker):+.1%})")  # fmt: skip


def verdicts(samples: list[Sample], tally: Tally, drained: bool) -> list[tuple[str, bool, str]]:
    """Return (target, held, figures) for each target."""
    warm = [s for s in samples if s.minute >= samples[-1].minute / 3] or samples
    end = samples[-1].minute
    middle_third = [s.redis_mb for s in samples if end / 3 <= s.minute < 2 * end / 3] or [samples[0].redis_mb]
    last_third = [s.redis_mb for s in samples if s.minute >= 2 * end / 3] or [samples[-1].redis_mb]
    budget = samples[-1].budget_mb
    peak = max(s.redis_mb for s in samples)
    api_fit, worker_fit = fitted(warm, lambda s: s.api_mb), fitted(warm, lambda s: s.worker_mb)
    growth = [(api_fit[1] / api_fit[0] - 1) if api_fit[0] else 0.0,
              (worker_fit[1] / worker_fit[0] - 1) if worker_fit[0] else 0.0]  # fmt: skip
    # Trimming saws between 70% and 80% of the budget: level means no trend between the thirds' means.
    trend = statistics.mean(last_third) - statistics.mean(middle_third)
    return [
        ("Redis memory below its budget", bool(budget) and peak < budget, f"peak {peak:.0f} MB of {budget:.0f} MB"),
        ("Redis memory levels off (last third's mean within 5% of the budget of the middle third's)",
         bool(budget) and abs(trend) < 0.05 * budget,
         f"middle third {statistics.mean(middle_third):.0f} MB, last third {statistics.mean(last_third):.0f} MB "
         f"({trend:+.0f} MB), range {min(last_third):.0f}–{max(last_third):.0f} MB"),
        ("API RSS grows < 5% after warm-up (least-squares line)", growth[0] < 0.05,
         f"{api_fit[0]:.0f} → {api_fit[1]:.0f} MB ({growth[0]:+.1%}); samples {warm[0].api_mb:.0f} → "
         f"{warm[-1].api_mb:.0f} MB"),
        ("worker RSS grows < 5% after warm-up (least-squares line)", growth[1] < 0.05,
         f"{worker_fit[0]:.0f} → {worker_fit[1]:.0f} MB ({growth[1]:+.1%}); samples {warm[0].worker_mb:.0f} → "
         f"{warm[-1].worker_mb:.0f} MB"),

        ("no errors besides admission answers", not tally.errors,
         f"{len(tally.errors)} errors, {tally.admission} admission answers"),
        ("every accepted job done", drained and tally.done == tally.accepted,
         f"{tally.done} of {tally.accepted} done"),
    ]  # fmt: skip


def stored_ratio(store: redis.Redis, jobs: int = 200) -> tuple[float, float]:
    """Return the store's bytes per second of kept audio (MEMORY USAGE of the audio hashes) and its share of raw
    PCM, over up to ``jobs`` of the newest finished jobs."""
    used = raw = seconds = 0.0
    newest: Any = store.zrange("tts:audio:kept", -jobs, -1)
    for member in newest:
        job = member.decode()
        size = store.memory_usage(f"tts:job:{{{job}}}:audio", samples=0)
        rate = store.hget(f"tts:job:{{{job}}}:record", "sample_rate")
        if not size or rate is None:
            continue
        duration = sum(json.loads(m).get("duration_s", 0.0) for m in store.hvals(f"tts:job:{{{job}}}:segmeta"))
        used += size
        seconds += duration
        raw += duration * int(rate) * 2
    return (used / seconds if seconds else 0.0), (used / raw if raw else 0.0)

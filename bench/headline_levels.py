"""One concurrency level of the closed loop: drive it, meter its window, summarise it, print a line."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.headline_cpu import meter_window
from bench.headline_stack import ServiceStack
from bench.http_clients import ServedClient
from bench.loadgen import Client, run_closed_loop
from bench.report import summarize
from bench.stack_args import Plan
from cache.stats import Stats, Window


def run_level(
    client: Client,
    texts: list[tuple[str, int]],
    callers: int,
    plan: Plan,
    *,
    window_s: float,
    seed: int,
    probe: Callable[[], int] | None = None,
    counters: Callable[[], dict[str, float]] | None = None,
    stats: Stats | None = None,
) -> dict[str, Any]:
    """Drive one level and return its summary with the CPU use (and the worker's view) of its window.

    ``counters`` reads one worker's metrics; ``stats``, the engine calls every worker of the service recorded
    (whole seconds around the window), for a service of several workers."""
    start = time.monotonic()
    unix = time.time() - start  # turns this level's monotonic times into Unix seconds
    refused_before = Counter(getattr(client, "refusals", {}))
    metering = meter_window(start + plan.warmup_s, start + plan.warmup_s + window_s, probe=probe, counters=counters)
    run = run_closed_loop(
        client, texts, callers=callers, warmup_s=plan.warmup_s, window_s=window_s, drain_s=plan.drain_s, seed=seed
    )
    meter = metering.result()  # the loop can return right at the window's end, before the last readings
    summary = summarize(run)
    summary.update(mix_view(summary, texts))
    # The refusals the client waited out, by the check that refused (the whole level, warm-up and drain too).
    summary["refused_by"] = dict(Counter(getattr(client, "refusals", {})) - refused_before)
    summary["queue"] = {k: meter.pop(k) for k in ("queue_mean", "queue_max") if k in meter} or None
    summary.update(worker_view(meter.pop("counters", {}), window_s))
    if stats is not None:
        opened = unix + start + plan.warmup_s
        summary.update(engine_view(stats.between(opened, opened + window_s), window_s))
    summary["cpu_roles"] = meter.pop("roles", None)
    summary["cpu"] = dict(meter)
    summary["wall_s"] = round(time.monotonic() - start, 1)
    return summary


def mix_view(summary: dict[str, Any], texts: list[tuple[str, int]]) -> dict[str, Any]:
    """Return the mean characters of the jobs finished in the window, and the jobs/s at the corpus's mean length.

    Each caller draws its texts at random, and the corpus's lengths vary about as much as their mean (43.7 ± 41.7
    characters), so a side that finishes few jobs in its window (the baseline at 50 callers: about 45) is timed on
    a sample whose mean length is off by about 14% either way; its jobs/s with it. Characters per second, divided
    by the corpus's mean characters a job, is the jobs/s both sides would make of the same mix.
    """
    jobs, chars = summary.get("jobs_per_s"), summary.get("chars_per_s")
    mean = sum(c for _, c in texts) / len(texts) if texts else 0.0
    return {
        "mean_chars_done": chars / jobs if jobs and chars is not None else None,
        "jobs_per_s_at_mix": chars / mean if mean and chars is not None else None,
    }


def worker_view(delta: dict[str, float], window_s: float) -> dict[str, Any]:
    """Return the worker's batch size, engine busy share and queue wait over the window, from its metrics."""

    def mean(name: str) -> float | None:
        count = delta.get(f"{name}_count", 0.0)
        return delta[f"{name}_sum"] / count if count else None

    if not delta:
        return {}
    return {
        "mean_batch_size": mean("tts_batch_size"),
        "engine_busy": delta.get("tts_synthesis_seconds_sum", 0.0) / window_s,
        "audio_made_per_s": delta["tts_audio_seconds_total"] / window_s if "tts_audio_seconds_total" in delta else None,
        "queue_wait_mean_s": mean("tts_queue_wait_seconds"),
        "first_segment_mean_s": mean("tts_time_to_first_segment_seconds"),
    }


def engine_view(recent: Window, window_s: float) -> dict[str, Any]:
    """Return the engines' batch size, busy share (host-seconds per second) and speed while busy, from the
    statistics every worker records per engine call."""
    return {
        "mean_batch_size": recent.segments / recent.calls if recent.calls else None,
        "engine_busy": recent.busy_s / window_s,
        "chars_per_busy_s": recent.chars_per_busy_second or None,
    }


class BatchCounter:
    """Per-level mean batch size from the worker's cumulative mean and the segments we know it ran."""

    def __init__(self, stack: ServiceStack, heartbeat_s: float) -> None:
        self.stack = stack
        self.heartbeat_s = heartbeat_s
        self.items = 1.0  # the worker's start-up synthesis of "ready"
        self.batches = 1.0

    def after_level(self, segments: int) -> float | None:
        """Return the mean batch size of the ``segments`` the level just ran."""
        time.sleep(2.5 * self.heartbeat_s)  # let a heartbeat written after the last batch land
        mean = self.stack.heartbeat().get("mean_batch_size")
        if not mean or not segments:
            return None
        items = self.items + segments
        batches = items / float(mean)
        level = segments / (batches - self.batches) if batches > self.batches else None
        self.items, self.batches = items, batches
        return level


def progress(side: str, summary: dict[str, Any]) -> None:
    """Print one line per measured level."""

    def f(key: str) -> str:
        value = summary.get(key)
        return "–" if value is None else f"{value:.2f}"

    print(
        f"  {side:<7} {summary['callers']:>3} callers: {summary['jobs_per_s']:.2f} jobs/s, "
        f"{summary['chars_per_s']:.0f} chars/s, p50/p99 done {f('latency_p50')}/{f('latency_p99')} s, "
        f"p99 first audio {f('first_audio_p99')} s, errors {summary['errors'] or 0}, "
        f"cpu {summary['cpu'] or '–'} ({summary['wall_s']}s)",
        flush=True,
    )


def compare_stacks(
    stacks: dict[str, ServiceStack],
    *,
    model: str,
    levels: str,
    plan: Plan,
    texts: list[tuple[str, int]],
    counters: bool = True,
) -> list[dict[str, Any]]:
    """Start every stack; run every level of ``levels`` ("10,50") against each in turn, alternating which goes
    first, with all of them idle before each; then stop them all and drop their Redis data. Return one summary per
    level, keyed by stack name. ``counters``: read the worker's metrics over each window (one worker per stack);
    otherwise the engine calls every worker recorded in the stack's Redis."""
    found: list[dict[str, Any]] = []
    names = list(stacks)
    try:
        for stack in stacks.values():
            stack.start()
        for n, callers in enumerate(int(x) for x in levels.split(",")):
            level: dict[str, Any] = {"callers": callers}
            for name in names if n % 2 == 0 else names[::-1]:
                stack = stacks[name]
                for other in stacks.values():
                    other.wait_idle()
                level[name] = run_level(ServedClient(stack.api.url, model=model), texts, callers, plan,
                                        window_s=plan.window_s, seed=n, probe=stack.queued,
                                        counters=stack.worker_totals if counters else None,
                                        stats=None if counters else Stats(stack.client))  # fmt: skip
                progress(name, level[name])
            found.append(level)
    finally:
        for stack in stacks.values():
            stack.stop()
        for stack in stacks.values():
            shutil.rmtree(stack.workdir / "redis", ignore_errors=True)
    return found

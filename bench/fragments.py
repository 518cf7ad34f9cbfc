"""First audio in fragments against whole segments: closed-loop listeners on the full-size and the tiny ChatTTS.

    python -m bench.fragments [--models chattts-random,chattts-tiny] [--window 90]

For each model the stack starts twice at `make run`'s defaults: fragments on (the default schedule) and off
(``TTS_FRAGMENT_MS=off``, each segment whole). Closed-loop callers submit corpus texts (uncached, a fresh seed each)
and listen to the job's server-sent ``fragment`` events, as the web page does. Per stack and level it reports:
first audio (admitted submit → first fragment) p50/p95/p99, each fragment's length, the listeners who hear a gap with a
one- and a two-fragment prefetch, and jobs per second. The join-quality table is ``python -m bench.fragment_joins``.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.headline_stack import ServiceStack
from bench.http_clients import ServedClient
from bench.loadgen import STALL_EPSILON_S, JobResult, LevelRun, run_closed_loop
from bench.report import RESULTS, cell, percentile, run_label, write_run
from bench.stack_args import REAL_SIZE_MAX_CHARS, corpus_texts, default_layout, prepare_model
from core.settings_worker import WorkerSettings

#: A gap a listener hears: shorter ones are scheduling noise.
GAP_S = 0.1
DEFAULT_FRAGMENTS: str = WorkerSettings.model_fields["fragment_ms"].default


@dataclass(frozen=True)
class Level:
    """One model's callers and how long they run."""

    model: str
    callers: int
    window_s: float


@dataclass
class Heard:
    """What one listener heard of one job: each fragment's arrival (monotonic s) and length (s)."""

    fragments: list[tuple[float, float]] = field(default_factory=list)


#: The web page's prefetch (api/static/app.js): playback starts once this many fragments are in hand.
PREFETCH = 2


class FragmentClient(ServedClient):
    """Submit to the service and play the job's fragments from its event stream as they come, starting once
    ``prefetch`` are in hand or what is in hand ends a segment: its first audio is when playback starts."""

    events_path = "/v1/jobs/{job_id}/events?fragments=1"
    #: One: playback starts at the first fragment.
    prefetch = 1

    def _heard(self, name: str, data: dict[str, Any], result: JobResult) -> None:
        if name != "fragment":
            return
        result.segments.append((time.monotonic(), fragment_seconds(data)))
        if result.first_audio is None and (len(result.segments) >= self.prefetch or data.get("last")):
            result.first_audio = result.segments[-1][0]


class PlayerClient(FragmentClient):
    """Listen as the web page plays: starting once ``PREFETCH`` fragments are in hand, and on from there."""

    prefetch = PREFETCH


def fragment_seconds(data: dict[str, Any]) -> float:
    """Return a fragment event's audio length in seconds (from its samples, or its PCM)."""
    rate = float(data.get("sample_rate") or 24000)
    if data.get("samples") is not None:
        return float(data["samples"]) / rate
    if data.get("duration_s") is not None:
        return float(data["duration_s"])
    return len(base64.b64decode(data.get("pcm16", ""))) / 2 / rate


def gap_after_prefetch(fragments: list[tuple[float, float]], prefetch: int) -> tuple[float, float]:
    """Play from when ``prefetch`` fragments (or all, if fewer) are in; return (when playing began, seconds of gap)."""
    if not fragments:
        return 0.0, 0.0
    start = fragments[min(prefetch, len(fragments)) - 1][0]
    clock = start
    gaps = 0.0
    for arrived, length in fragments:
        if arrived > clock + STALL_EPSILON_S:
            gaps += arrived - clock
            clock = arrived
        clock += length
    return start, gaps


def summarize(run: LevelRun) -> dict[str, Any]:
    """Return one level's figures from the jobs submitted inside its window."""
    measured = [r for r in run.results if run.window_start <= r.submitted <= run.window_end]
    ok = [r for r in measured if r.ok and r.segments]
    first = [r.segments[0][0] - (r.admitted or r.submitted) for r in ok]
    lengths = [length * 1000 for r in ok for _, length in r.segments]
    later = [length * 1000 for r in ok for _, length in r.segments[1:]]
    gaps = {k: [gap_after_prefetch(r.segments, k)[1] for r in ok] for k in (1, 2)}
    done = [r for r in run.results if r.ok and r.done is not None and run.window_start <= r.done <= run.window_end]
    return {
        "callers": run.callers,
        "jobs": len(ok),
        "failed": len(measured) - len(ok),
        "refused": sum(r.admissions for r in measured),
        "waited_p50": percentile([(r.admitted or r.submitted) - r.submitted for r in ok], 50),
        "jobs_per_s": len(done) / (run.window_end - run.window_start),
        "first_p50": percentile(first, 50),
        "first_p95": percentile(first, 95),
        "first_p99": percentile(first, 99),
        "first_ms": percentile([r.segments[0][1] * 1000 for r in ok], 50),
        "later_p5": percentile(later, 5),
        "later_p50": percentile(later, 50),
        "later_p95": percentile(later, 95),
        "fragments_per_job": len(lengths) / len(ok) if ok else None,
        "gap1": sum(g > GAP_S for g in gaps[1]) / len(ok) if ok else None,
        "gap2": sum(g > GAP_S for g in gaps[2]) / len(ok) if ok else None,
    }


def run_stack(level_list: list[Level], fragments: str, out: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Start one stack with ``TTS_FRAGMENT_MS=fragments`` and run every level of one model on it."""
    model = level_list[0].model
    workdir = out / f"{model}-{'off' if fragments == 'off' else 'on'}"
    workdir.mkdir(parents=True, exist_ok=True)
    stack_env = {**env, "TTS_DEFAULT_MODEL": model, **({"TTS_FRAGMENT_MS": fragments} if fragments == "off" else {})}
    stack = ServiceStack(stack_env, workdir, api_processes=2)
    rows = []
    texts = corpus_texts(model, max_chars=REAL_SIZE_MAX_CHARS if model == "chattts-random" else None)
    try:
        stack.start(ready_timeout=600)
        for n, level in enumerate(level_list):
            stack.wait_idle(timeout_s=300)
            client = FragmentClient(stack.api.url, model=model, timeout_s=level.window_s + 300)
            run = run_closed_loop(client, texts, callers=level.callers, warmup_s=3 if model == "chattts-tiny" else 0,
                                  window_s=level.window_s, drain_s=240, seed=n + 1)  # fmt: skip
            row = {"model": model, "fragments": fragments, **summarize(run), "refused_by": dict(client.refusals)}
            print(f"  {model} fragments {fragments}, {level.callers} callers: {row}", flush=True)
            rows.append(row)
    finally:
        stack.stop()
        shutil.rmtree(workdir / "redis", ignore_errors=True)
    return rows


def document(rows: list[dict[str, Any]], started: float) -> str:
    """Return the markdown table of every row, fragments on beside off."""
    layout = default_layout()
    lines = [
        "## Fragments: first audio, fragment lengths, gaps, jobs/s (on vs off)",
        "",
        f"`make run`'s default settings; fragments on is `TTS_FRAGMENT_MS={DEFAULT_FRAGMENTS}` (the default), off is "
        f"`TTS_FRAGMENT_MS=off`. {layout.replicas} model host(s) of {layout.torch_threads} torch thread(s); "
        f"closed-loop listeners following the job's `fragment` events; {run_label()}; ran "
        f"{time.perf_counter() - started:.0f} s.",
        "",
        "| model | callers | fragments | jobs | jobs/s | first audio p50 / p95 / p99 s | first fragment ms | later "
        f"fragments p5 / p50 / p95 ms | fragments a job | gap > {GAP_S * 1000:.0f} ms, prefetch 1 / 2 | refusals "
        "(retried) | wait to be admitted p50 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['callers']} | {r['fragments']} | {r['jobs']} | {cell(r['jobs_per_s'])} | "
            f"{cell(r['first_p50'])} / {cell(r['first_p95'])} / {cell(r['first_p99'])} | "
            f"{cell(r['first_ms'], '.0f')} | "
            f"{cell(r['later_p5'], '.0f')} / {cell(r['later_p50'], '.0f')} / {cell(r['later_p95'], '.0f')} | "
            f"{cell(r['fragments_per_job'], '.1f')} | {share(r['gap1'])} / {share(r['gap2'])} | {r['refused']} | "
            f"{cell(r['waited_p50'])} |"
        )
    lines += ["", "Jobs per second, fragments on over off, same run:", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        for callers in dict.fromkeys(r["callers"] for r in rows if r["model"] == model):
            pair = {r["fragments"]: r for r in rows if r["model"] == model and r["callers"] == callers}
            on, off = pair.get(DEFAULT_FRAGMENTS), pair.get("off")
            if on and off and off["jobs_per_s"]:
                lines.append(f"- {model}, {callers} callers: {on['jobs_per_s'] / off['jobs_per_s']:.2f}×")
    return "\n".join(lines)


def share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def main() -> None:
    """Run every model's levels with fragments on and off, and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="chattts-random,chattts-tiny")
    parser.add_argument("--window", type=float, default=90.0, help="seconds per full-size level (tiny: a third)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    out = args.out / f"fragments-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    levels = {
        "chattts-random": [Level("chattts-random", 1, args.window), Level("chattts-random", 4, args.window)],
        "chattts-tiny": [Level("chattts-tiny", 50, args.window / 3)],
    }
    rows = []
    for model in args.models.split(","):
        env = prepare_model(model)
        for fragments in (DEFAULT_FRAGMENTS, "off"):
            rows += run_stack(levels[model], fragments, out, env)
    text = document(rows, started)
    write_run(out, "fragments", text, rows)
    print(text)


if __name__ == "__main__":
    main()

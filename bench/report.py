"""What every benchmark shares to report: percentiles and medians, a level's summary, the result files.

A run's files go to bench/results/ (not committed); its table is also published, with the run's date and commit,
to docs/benchmarks/results/<name>.md, which the benchmarks page includes: refreshing the page is a `make bench…`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.loadgen import STALL_EPSILON_S, LevelRun
from devstack.local import ROOT

RESULTS = ROOT / "bench" / "results"
#: The committed copies of each benchmark's latest table, included by docs/benchmarks/index.md.
PUBLISHED = ROOT / "docs" / "benchmarks" / "results"

#: A column of a side-by-side table: its header, and its cell from one side's level summary.
Column = tuple[str, Callable[[dict[str, Any]], str]]


def cell(value: float | None, spec: str = ".2f") -> str:
    """Return a figure as a table shows it: ``spec``, or "–" when there is none."""
    return "–" if value is None else format(value, spec)


#: The closed-loop columns every side-by-side table of the service's levels shows.
JOBS_PER_S: Column = ("jobs/s", lambda s: f"{s['jobs_per_s']:.2f}")
FIRST_AUDIO: Column = (
    "p50 / p99 first audio (s)",
    lambda s: f"{cell(s['first_audio_p50'])} / {cell(s['first_audio_p99'])}",
)
STALLED: Column = ("jobs with a stall", lambda s: cell(s["stall_share"], ".1%"))
STALL_P99: Column = ("p99 stall (s)", lambda s: cell(s["stall_p99_s"]))
ERRORS: Column = ("errors", lambda s: str(sum(s["errors"].values()) if s["errors"] else 0))
JOBS: Column = ("jobs", lambda s: str(s["jobs_measured"]))


def side_by_side(levels: list[dict[str, Any]], sides: dict[str, str], side_header: str, columns: list[Column]) -> str:
    """Return a markdown table with a row per level and side (``sides``: each summary's key in a level → its
    label): the callers, the side's label under ``side_header``, then ``columns``."""
    lines = [
        "| " + " | ".join(["callers", side_header, *(header for header, _ in columns)]) + " |",
        "|" + "---|" * (len(columns) + 2),
    ]
    for level in levels:
        for key, label in sides.items():
            cells = [str(level["callers"]), label, *(value(level[key]) for _, value in columns)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def percentile(values: list[float], q: float) -> float | None:
    """Return the q-th percentile (0–100) by linear interpolation, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    """Return the median of ``values``."""
    return statistics.median(values)


def p99(values: list[float]) -> float:
    """Return the 99th percentile of ``values`` (linear interpolation); there must be some."""
    found = percentile(values, 99)
    if found is None:
        raise ValueError("no values to take the 99th percentile of")
    return found


def summarize(run: LevelRun) -> dict[str, Any]:
    """Summarise the jobs submitted inside the window (throughput counts jobs finished inside it)."""
    window = run.window_end - run.window_start
    measured = [r for r in run.results if run.window_start <= r.submitted <= run.window_end]
    ok = [r for r in measured if r.ok]
    inside = [r for r in run.results if r.ok and r.done is not None and run.window_start <= r.done <= run.window_end]
    latency = [r.done - r.submitted for r in ok if r.done is not None]
    first_audio = [r.first_audio - r.submitted for r in ok if r.first_audio is not None]
    stalls = [r.stall_s() for r in ok]
    errors = Counter(r.error for r in measured if r.error is not None)
    if run.unfinished:
        errors["unfinished"] += run.unfinished
    return {
        "callers": run.callers,
        "window_s": round(window, 2),
        "jobs_measured": len(measured),
        "jobs_ok": len(ok),
        "jobs_per_s": len(inside) / window,
        "chars_per_s": sum(r.chars for r in inside) / window,
        "audio_s_per_s": sum(sum(d for _, d in r.segments) for r in inside) / window,
        "mean_segments": sum(len(r.segments) for r in ok) / len(ok) if ok else None,
        "latency_p50": percentile(latency, 50),
        "latency_p90": percentile(latency, 90),
        "latency_p99": percentile(latency, 99),
        "first_audio_p50": percentile(first_audio, 50),
        "first_audio_p99": percentile(first_audio, 99),
        "stall_share": sum(1 for s in stalls if s > STALL_EPSILON_S) / len(stalls) if stalls else None,
        "stall_p99_s": percentile(stalls, 99),
        "errors": dict(errors),
        "admissions": sum(r.admissions for r in measured),
        "cached_segments": sum(r.cached_segments for r in measured),
        "segments_total": sum(len(r.segments) for r in run.results if r.ok),
    }


def machine_header(title: str, started: float, torch_threads: int) -> list[str]:
    """Return a bench table's title and the line saying what it ran on and for how long (from perf_counter)."""
    return [
        f"## {title}",
        "",
        f"{os.cpu_count()} CPU cores, torch threads per model host {torch_threads}; "
        f"ran {time.perf_counter() - started:.0f}s.",
        "",
    ]


def run_label() -> str:
    """Return when and at which commit this run is: "2026-12-07 01:15 UTC, commit `abc1234`" (+dirty if edited)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        # Published results are this module's own output: one run's table must not mark the next run dirty.
        if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks/results"):
            commit += "+dirty"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (no git checkout)"
    return f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit `{commit}`"


def publish(name: str, markdown: str) -> Path:
    """Write a bench's markdown to docs/benchmarks/results/<name>.md under its run's date and commit."""
    lines: list[str] = []
    fenced = False
    for line in markdown.strip().splitlines():
        fenced ^= line.startswith("```")
        # The page that includes the table owns the headings: a result's own become bold lines.
        lines.append(f"**{line.lstrip('#').strip()}**" if line.startswith("#") and not fenced else line)
    header = f"<!-- Written by `bench/report.py`; a `make bench…` run replaces it. -->\n\n*Latest run: {run_label()}.*"
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    path = PUBLISHED / f"{name}.md"
    path.write_text(header + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def save_result(name: str, markdown: str) -> Path:
    """Write a bench's markdown to bench/results/<name>.md, publish it, and return the bench/results path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(markdown, encoding="utf-8")
    publish(name, markdown)
    return path


def write_result(name: str, markdown: str) -> Path:
    """Print a bench's markdown, write it to bench/results/<name>.md and publish it."""
    path = save_result(name, markdown)
    print(markdown)
    print(f"(written to {path.relative_to(ROOT)})")
    return path


def write_run(out: Path, name: str, document: str, record: object, *, published_as: str | None = None) -> None:
    """Write a run's <name>.md and results.json into its folder, copy the markdown beside it as the latest, and
    publish it (as ``published_as`` where one bench publishes two tables: `make bench-real` is `headline-real`)."""
    (out / f"{name}.md").write_text(document + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    shutil.copy(out / f"{name}.md", out.parent / f"{name}.md")
    publish(published_as or name, document)

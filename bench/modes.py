"""The service in ``fast`` (int8) and ``balanced`` mode on the full-size ChatTTS, side by side in one run.

    python -m bench.modes [--model chattts-random] [--callers 1,4,16] [--window 60]

One stack starts at `make run`'s defaults with nothing changed. Each mode's hosts are loaded by jobs before any
level is measured (a mode's host loads when a call first needs it). Then, for each number of callers, the
two modes take turns: closed-loop callers submit corpus texts (uncached, a fresh seed each) in that mode and listen
to the job's server-sent ``fragment`` events, as the web page does. Per mode and level it reports jobs/s, audio
seconds made per second, first audio (admitted submit → first fragment) p50/p95, fragment lengths and gaps.
Writes bench/results/ and docs/benchmarks/results/modes.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fragments import FragmentClient, share, summarize
from bench.headline_stack import ServiceStack
from bench.loadgen import LevelRun, run_closed_loop
from bench.report import RESULTS, cell, run_label, write_run
from bench.stack_args import REAL_SIZE_MAX_CHARS, corpus_texts, default_layout, prepare_model

MODES = ("fast", "balanced")


def audio_per_s(run: LevelRun) -> float:
    """Return the seconds of audio the jobs finished inside the window made, per second of window."""
    done = [r for r in run.results if r.ok and r.done is not None and run.window_start <= r.done <= run.window_end]
    return float(sum(length for r in done for _, length in r.segments)) / (run.window_end - run.window_start)


def variant_of(stack: ServiceStack, model: str, mode: str) -> str:
    """Return the name of the variant that serves ``model`` in ``mode``, as the service's /v1/models says."""
    with urllib.request.urlopen(f"{stack.api.url}/v1/models", timeout=10) as response:
        models = json.load(response)["data"]
    return str(next(m for m in models if m["id"] == model)["modes"][mode]["model"])


def hosts_of(stack: ServiceStack, variant: str) -> int:
    """Return how many model hosts of ``variant`` the worker's heartbeat says are loaded."""
    return sum(1 for host in stack.heartbeat().get("pool", []) if host["model"] == variant)


def warm(stack: ServiceStack, model: str, texts: list[tuple[str, int]], replicas: int) -> dict[str, float]:
    """Make jobs in each mode, several at once, until every one of its model hosts is loaded (a host loads when a
    call first needs it), so no level measures a load."""
    took = {}
    for mode in MODES:
        variant = variant_of(stack, model, mode)
        client = FragmentClient(stack.api.url, model=model, mode=mode, timeout_s=900)
        started = time.perf_counter()
        for _ in range(5):
            with ThreadPoolExecutor(2 * replicas) as pool:
                jobs = [pool.submit(client.run_job, *texts[n], seed=n) for n in range(2 * replicas)]
                results = [job.result() for job in jobs]
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"a warm-up job in mode {mode} failed: {failed[0].error or failed[0].refused}")
            if hosts_of(stack, variant) >= replicas:
                break
        took[mode] = time.perf_counter() - started
        print(f"  {mode}: {hosts_of(stack, variant)} host(s) of {variant} loaded, warm in {took[mode]:.0f}s",
              flush=True)  # fmt: skip
    return took


def run(model: str, callers: list[int], window_s: float, out: Path) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Start one stack at the defaults and run every level in both modes, taking turns."""
    env = prepare_model(model)
    workdir = out / model
    workdir.mkdir(parents=True, exist_ok=True)
    stack = ServiceStack({**env, "TTS_DEFAULT_MODEL": model}, workdir, api_processes=2)
    texts = corpus_texts(model, max_chars=REAL_SIZE_MAX_CHARS if model == "chattts-random" else None)
    rows = []
    try:
        stack.start(ready_timeout=600)
        loads = warm(stack, model, texts, default_layout().replicas)
        for n, count in enumerate(callers):
            for mode in MODES:
                stack.wait_idle(timeout_s=300)
                client = FragmentClient(stack.api.url, model=model, mode=mode, timeout_s=window_s + 300)
                level = run_closed_loop(client, texts, callers=count, warmup_s=0, window_s=window_s, drain_s=240,
                                        seed=n + 1)  # fmt: skip
                row = {"mode": mode, **summarize(level), "audio_per_s": audio_per_s(level)}
                print(f"  {mode}, {count} callers: {row}", flush=True)
                rows.append(row)
    finally:
        stack.stop()
        shutil.rmtree(workdir / "redis", ignore_errors=True)
    return rows, loads


def document(rows: list[dict[str, Any]], *, model: str, loads: dict[str, float], started: float) -> str:
    """Return the markdown table, fast beside balanced at each level, and their ratios."""
    layout = default_layout()
    lines = [
        f"## Modes: fast (int8) and balanced on {model}, one run",
        "",
        f"`make run`'s default settings, nothing changed; {layout.replicas} model host(s) per mode of "
        f"{layout.torch_threads} torch thread(s); closed-loop listeners following the job's `fragment` events; each "
        f"mode's hosts loaded by jobs first (fast {loads.get('fast', 0):.0f} s, balanced "
        f"{loads.get('balanced', 0):.0f} s, load and job); {run_label()}; ran {time.perf_counter() - started:.0f} s.",
        "",
        "| callers | mode | jobs | jobs/s | audio s/s | first audio p50 / p95 s | first fragment ms | later fragments "
        "p5 / p50 / p95 ms | gap > 100 ms, prefetch 1 / 2 | refusals (retried) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['callers']} | {r['mode']} | {r['jobs']} | {cell(r['jobs_per_s'])} | {cell(r['audio_per_s'])} | "
            f"{cell(r['first_p50'])} / {cell(r['first_p95'])} | {cell(r['first_ms'], '.0f')} | "
            f"{cell(r['later_p5'], '.0f')} / {cell(r['later_p50'], '.0f')} / {cell(r['later_p95'], '.0f')} | "
            f"{share(r['gap1'])} / {share(r['gap2'])} | {r['refused']} |"
        )
    lines += ["", "fast over balanced, same run:", ""]
    for callers in dict.fromkeys(r["callers"] for r in rows):
        pair = {r["mode"]: r for r in rows if r["callers"] == callers}
        fast, balanced = pair.get("fast"), pair.get("balanced")
        if fast and balanced and balanced["jobs_per_s"] and balanced["first_p50"]:
            lines.append(
                f"- {callers} callers: jobs/s {fast['jobs_per_s'] / balanced['jobs_per_s']:.2f}×, first audio p50 "
                f"{fast['first_p50'] / balanced['first_p50']:.2f}×"
            )
    return "\n".join(lines)


def main() -> None:
    """Run both modes at every level on one stack and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="chattts-random")
    parser.add_argument("--callers", default="1,4,16")
    parser.add_argument("--window", type=float, default=60.0, help="seconds each mode runs at each level")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    out = args.out / f"modes-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows, loads = run(args.model, [int(c) for c in args.callers.split(",")], args.window, out)
    text = document(rows, model=args.model, loads=loads, started=started)
    write_run(out, "modes", text, {"model": args.model, "loads": loads, "rows": rows})
    print(text)


if __name__ == "__main__":
    main()

"""The headline benchmark: the task-queue service against the synchronous server it replaces, same engine, one run.

``python -m bench.headline [--model chattts-tiny] [--levels 1,10,50] [--duration S] [--quick]``

1. Measures the raw engine in-process (batch 1, then length-sorted batches): the machine's limit.
2. Starts the service (Redis, one worker, the API under gunicorn) and the synchronous baseline server.
3. At each concurrency level, drives each with closed-loop callers that follow every job as a listener
   would (the service's as the web page plays: ``bench.fragments.PlayerClient``), service first, then baseline.
4. Restarts the service at the hand-tuned reference (``--reference``) and runs its callers again.
5. Writes results.json, a markdown table and a chart into bench/results/<time>/, and prints the table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import chart
from bench import headline_report as report
from bench.fragments import PlayerClient
from bench.headline_engine import measure_engine
from bench.headline_levels import BatchCounter, progress, run_level
from bench.headline_stack import BaselineProcess, ServiceStack
from bench.http_clients import BaselineClient, ServedClient
from bench.pace_probe import probe as pace_probe
from bench.pace_probe import relative
from bench.report import write_run
from bench.stack_args import (
    HEARTBEAT_S,
    Plan,
    add_stack_arguments,
    corpus_texts,
    make_plan,
    resolve_stack_arguments,
    service_env,
    settings_line,
)
from workers.layout import usable_cores

#: The closed loop the defaults are held against the hand-tuned reference at.
REFERENCE_CALLERS = 50


def reference_settings() -> dict[str, str]:
    """Return the settings the benchmarks used to run before they ran the defaults: one one-thread model host per
    usable core and both admission checks off (issue 49's "best hand-tuned layout")."""
    return {
        "TTS_MODEL_REPLICAS": str(usable_cores()),
        "TTS_TORCH_THREADS": "1",
        "TTS_ADMISSION_LATENESS_S": "0",
        "TTS_ADMISSION_FIRST_AUDIO_S": "0",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.headline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_stack_arguments(parser, levels="1,10,50")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument(
        "--baseline-levels", default=None, help="the levels the baseline also runs (default: all; real size: 1,10,50)"
    )
    parser.add_argument(
        "--batching-off",
        type=int,
        default=None,
        metavar="CALLERS",
        help="after the levels, restart the service with TTS_BATCH_MAX_SIZE=1 and run this many callers "
        "(real size: 16), for the batching gain against the same level with batching on",
    )
    parser.add_argument(
        "--reference",
        type=int,
        default=None,
        metavar="CALLERS",
        help="after the levels, restart the service as the benchmarks used to run it (one one-thread model host "
        "per core, both admission checks off) and run this many callers (default 50; real size: none), for the "
        "defaults against the best hand-tuned settings; 0 skips it",
    )
    args = resolve_stack_arguments(parser.parse_args(argv))
    if args.reference is None:
        args.reference = 0 if args.real_size else REFERENCE_CALLERS
    if args.real_size:
        args.levels = args.levels if args.levels != "1,10,50" else "1,10,16,50"
        args.baseline_levels = args.baseline_levels or "1,10,50"
        args.batching_off = args.batching_off or 16
        # On this CPU the real-size model is slower than real time (RTF about 4 at batch 1): no listener's
        # deadline can hold, so realtime admission would refuse all but a job or two at a time. The run
        # measures throughput and batching, with those refusals off (stated in the table's settings line).
        for pair in ("TTS_ADMISSION_LATENESS_S=0", "TTS_ADMISSION_REALTIME_WAIT_S=3600"):
            if not any(p.startswith(pair.split("=")[0] + "=") for p in args.service_env):
                args.service_env.append(pair)
    return args


def drive_level(
    stack: ServiceStack,
    baseline: BaselineProcess | None,
    *,
    served: ServedClient,
    counter: BatchCounter,
    texts: list[tuple[str, int]],
    plan: Plan,
    callers: int,
    seed: int,
    reference: float | None = None,
) -> dict[str, Any]:
    """Run one level against the service, then against the baseline if one is given; before each, with both
    idle, probe the machine's pace (relative to ``reference``, the run's first probe)."""
    level: dict[str, Any] = {"callers": callers}
    stack.wait_idle()
    pace = relative(pace_probe(), reference)
    after = level["after"] = run_level(served, texts, callers, plan, window_s=plan.window_s, seed=seed,
                                       probe=stack.queued, counters=stack.worker_totals)  # fmt: skip
    after["machine_pace"] = pace
    from_heartbeat = counter.after_level(after["segments_total"])
    if after.get("mean_batch_size") is None:
        after["mean_batch_size"] = from_heartbeat
    progress("after", after)
    if baseline:
        baseline.wait_idle()
        client = BaselineClient(baseline.url)
        pace = relative(pace_probe(), reference)
        before = level["before"] = run_level(
            client, texts, callers, plan, window_s=plan.window_s, seed=seed, counters=baseline.totals
        )
        before["machine_pace"] = pace
        progress("before", before)
    return level


def drive(
    args: argparse.Namespace, plan: Plan, env: dict[str, str], out: Path, *, reference: float | None = None
) -> tuple[list[dict[str, Any]], Any]:
    """Start both servers and run every level against each; return the levels and the cache-on line."""
    texts = corpus_texts(args.model, max_chars=args.max_chars)
    levels = [int(x) for x in args.levels.split(",")]
    with_baseline = set(levels if args.baseline_levels is None else map(int, args.baseline_levels.split(",")))
    stack = ServiceStack(env, out, api_processes=2)
    baseline = None
    if not args.skip_baseline:
        baseline = BaselineProcess(
            env, out / "baseline.log", model=args.model, torch_threads=args.torch_threads, device=args.device
        )
    results: list[dict[str, Any]] = []
    cache_line = None
    try:
        stack.start()
        if baseline:
            baseline.start()
        counter = BatchCounter(stack, HEARTBEAT_S)
        served = PlayerClient(stack.api.url, model=args.model)
        for n, callers in enumerate(levels):
            level = drive_level(stack, baseline if callers in with_baseline else None, served=served,
                                counter=counter, texts=texts, plan=plan, callers=callers, seed=n,
                                reference=reference)  # fmt: skip
            results.append(level)
        if plan.cache_window_s:
            stack.wait_idle()
            cached = PlayerClient(stack.api.url, model=args.model, cache=True, fixed_seed=1)
            cache_line = run_level(cached, texts, 10, plan, window_s=plan.cache_window_s, seed=99)
            progress("cache", cache_line)
    finally:
        if baseline:
            baseline.stop()
        stack.stop()
        shutil.rmtree(out / "redis", ignore_errors=True)
    return results, cache_line


def restarted_level(
    args: argparse.Namespace, plan: Plan, env: dict[str, str], out: Path, *, name: str, changes: dict[str, str],
    callers: int, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """Restart the service with ``changes`` to its settings and run ``callers`` closed-loop callers; the summary
    carries the changes."""
    where = out / name
    where.mkdir(exist_ok=True)
    stack = ServiceStack({**env, **changes}, where, api_processes=2)
    try:
        stack.start()
        served = PlayerClient(stack.api.url, model=args.model)
        texts = corpus_texts(args.model, max_chars=args.max_chars)
        summary = run_level(served, texts, callers, plan, window_s=plan.window_s, seed=seed,
                            probe=stack.queued, counters=stack.worker_totals)  # fmt: skip
        progress(name, summary)
        return {**summary, "changes": changes}
    finally:
        stack.stop()
        shutil.rmtree(where / "redis", ignore_errors=True)


def batching_off_level(args: argparse.Namespace, plan: Plan, env: dict[str, str], out: Path) -> dict[str, Any]:
    """Restart the service with batching off (TTS_BATCH_MAX_SIZE=1) and run ``--batching-off`` callers."""
    return restarted_level(args, plan, env, out, name="batching-off", changes={"TTS_BATCH_MAX_SIZE": "1"},
                           callers=args.batching_off, seed=50)  # fmt: skip


def reference_level(args: argparse.Namespace, plan: Plan, env: dict[str, str], out: Path) -> dict[str, Any]:
    """Restart the service at the hand-tuned reference settings and run ``--reference`` callers, with the same
    seed as the level of as many callers at the defaults (the same texts)."""
    levels = [int(x) for x in args.levels.split(",")]
    seed = levels.index(args.reference) if args.reference in levels else 51
    return restarted_level(args, plan, env, out, name="reference", changes=reference_settings(),
                           callers=args.reference, seed=seed)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark and print the table."""
    args = parse_args(argv)
    plan = make_plan(args)
    out = args.out / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    env = service_env(args, out)
    print(
        f"headline benchmark: {args.model}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"levels {args.levels}, {plan.window_s:g}s per level; results in {out}",
        flush=True,
    )
    started = time.monotonic()
    reference = pace_probe()  # before anything runs: the machine's pace that each level's is read against
    engine = None if args.skip_engine else measure_engine(env, plan, args, out)
    results, cache_line = drive(args, plan, env, out, reference=reference)
    batching_off = batching_off_level(args, plan, env, out) if args.batching_off else None
    reference_run = reference_level(args, plan, env, out) if args.reference else None
    meta = {"args": args, "plan": plan, "elapsed": time.monotonic() - started, "batching_off": batching_off,
            "reference": reference_run}  # fmt: skip
    document = write_results(out, meta, results, engine, cache_line)
    print()
    print(document)
    return 0


def write_results(
    out: Path,
    meta: dict[str, Any],
    results: list[dict[str, Any]],
    engine: dict[str, Any] | None,
    cache_line: dict[str, Any] | None,
) -> str:
    """Write results.json, headline.md and headline.png; return the markdown."""
    args, plan, elapsed = meta["args"], meta["plan"], meta["elapsed"]
    batching_off, reference_run = meta.get("batching_off"), meta.get("reference")
    title = (
        f"{args.model} on {os.cpu_count()} CPUs, torch threads {args.torch_threads}, "
        f"{args.replicas} model host{'s' if args.replicas > 1 else ''} in the worker, "
        f"{plan.window_s:g}s per level, {time.strftime('%Y-%m-%d %H:%M')}"
        + (f", corpus texts up to {args.max_chars} characters" if args.max_chars else "")
        + f"; {settings_line(args)}"
    )
    if args.real_size:
        rows = report.real_size_targets(results, engine, batching_off)
    else:
        rows = report.targets(results, engine, reference_run)
    footer = f"Whole run: {elapsed:.0f}s. Files: {out}"
    document = report.document(title, results, engine, cache_line, rows, window_s=plan.window_s, footer=footer,
                               batching_off=batching_off, reference=reference_run)  # fmt: skip
    record = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "plan": asdict(plan),
        "levels": results,
        "engine": engine,
        "cache_line": cache_line,
        "batching_off": batching_off,
        "reference": reference_run,
        "targets": rows,
        "elapsed_s": elapsed,
    }
    write_run(out, "headline", document, record, published_as="headline-real" if args.real_size else None)
    if results:
        chart.draw(results, out / "headline.png", title=title)
        shutil.copy(out / "headline.png", out.parent / "headline.png")
    return document


if __name__ == "__main__":
    sys.exit(main())

"""The headline benchmark: the task-queue service against the synchronous server it replaces, same engine, one run.

``python -m bench.headline [--model chattts-tiny] [--levels 1,10,50] [--duration S] [--quick]``

1. Measures the raw engine in-process (batch 1, then length-sorted batches): the machine's limit.
2. Starts the service (Redis, one worker, the API under gunicorn) and the synchronous baseline server.
3. At each concurrency level, drives each with closed-loop callers that follow every job as a listener
   would, service first, then baseline.
4. Writes results.json, a markdown table and a chart into bench/results/<time>/, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import chart
from bench import headline_report as report
from bench.engine_limit import read_corpus, service_segments
from bench.headline_cpu import meter_window
from bench.headline_stack import BaselineProcess, ServiceStack, bench_models_file
from bench.headline_stats import summarize
from bench.loadgen import BaselineClient, Client, ServedClient, run_closed_loop
from tests.support.servers import ROOT

RESULTS = ROOT / "bench" / "results"
#: Worker heartbeat period during the run: the per-level mean batch size is read from it.
HEARTBEAT_S = 1.0
#: Measuring windows shorter than this make a smoke test, not a verdict.
FULL_WINDOW_S = 20.0
#: Above this share of the CPUs used by processes not ours, the results carry a warning.
CONTENDED_PCT = 10.0


@dataclass(frozen=True)
class Plan:
    """How long each part runs."""

    window_s: float
    warmup_s: float
    drain_s: float
    engine_batches: str
    engine_pool: int
    engine_batch1_s: float
    cache_window_s: float


def make_plan(args: argparse.Namespace) -> Plan:
    """Return the durations for a full run (about 8 minutes on 2 cores) or a quick one (about 2)."""
    quick = Plan(8, 2, 40, "1,8", 32, 5, 0)  # a smoke test: shorter drain, small engine check
    full = Plan(30, 4, 240, "1,8,16,32", 64, 15, 12)
    plan = quick if args.quick else full
    if args.duration:
        plan = replace(plan, window_s=args.duration, cache_window_s=min(plan.cache_window_s, args.duration))
    return plan


def prepare_model(model: str) -> dict[str, str]:
    """Build the tiny model if it is the one asked for and missing; refuse a real model without weights."""
    from core.settings import load_settings

    settings = load_settings()
    if model == "chattts-tiny":
        from workers.engines.chattts_tiny import build_tiny_model, is_complete

        tiny = settings.tiny_model_dir
        if not is_complete(tiny):
            print(f"building the tiny ChatTTS in {tiny}")
            build_tiny_model(tiny)
        return {"TTS_TINY_MODEL_DIR": str(tiny)}
    if model == "chattts" and not settings.chattts_weights_dir.is_dir():
        from workers.engines.chattts import where_weights_go

        sys.exit(f"no ChatTTS weights: {where_weights_go(settings.chattts_weights_dir)}")
    return {}


def measure_engine(env: dict[str, str], plan: Plan, args: argparse.Namespace, out: Path) -> dict[str, Any] | None:
    """Run bench.engine_limit in one process per replica, side by side, and return their summed numbers.

    The service runs ``--replicas`` model hosts at once, so the machine's limit is that many
    engines running together, measured together (not one engine's figure multiplied).
    """
    started = time.monotonic()
    runs = []
    for replica in range(args.replicas):
        path = out / f"engine-{replica}.json"
        command = [
            sys.executable, "-m", "bench.engine_limit", "--model", args.model, "--json", str(path),
            "--batches", plan.engine_batches, "--pool", str(plan.engine_pool),
            "--batch1-seconds", str(plan.engine_batch1_s), "--torch-threads", str(args.torch_threads),
            "--device", args.device,
        ]  # fmt: skip
        log = (out / f"engine-{replica}.log").open("ab")
        runs.append((path, log, subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=log)))
    results = []
    for path, log, process in runs:
        code = process.wait()
        log.close()
        if code != 0:
            print(f"engine limit failed (exit {code}); see {out}/engine-*.log", file=sys.stderr)
            return None
        results.append(json.loads(path.read_text(encoding="utf-8")))
    result = combine_engines(results)
    (out / "engine.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(
        f"engine limit ({args.replicas} side by side): batch 1 {result['batch1_chars_per_s']:.1f} chars/s, "
        f"best batch {result['best_batch']} {result['best_chars_per_s']:.1f} chars/s "
        f"({time.monotonic() - started:.0f}s)"
    )
    return result


def combine_engines(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the rates of engines measured side by side, batch size by batch size."""
    rows = []
    for batch_rows in zip(*(r["rows"] for r in results), strict=True):
        row = dict(batch_rows[0])
        for key in ("chars_per_s", "segments_per_s", "audio_s_per_s", "segments"):
            row[key] = sum(r[key] for r in batch_rows)
        row["seconds"] = max(r["seconds"] for r in batch_rows)
        rows.append(row)
    best = max(rows, key=lambda r: r["chars_per_s"])
    # The service's cap is the engine's best batch: under light load its batches stay small anyway.
    service = best["batch"]
    return {
        **results[0],
        "service_batch": service,
        "replicas": len(results),
        "rows": rows,
        "batch1_chars_per_s": next(r["chars_per_s"] for r in rows if r["batch"] == 1),
        "best_batch": best["batch"],
        "best_chars_per_s": best["chars_per_s"],
        "best_audio_s_per_s": best["audio_s_per_s"],
        "per_replica": results,
    }


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
) -> dict[str, Any]:
    """Drive one level and return its summary with the CPU use (and the worker's view) of its window."""
    start = time.monotonic()
    metering = meter_window(start + plan.warmup_s, start + plan.warmup_s + window_s, probe=probe, counters=counters)
    run = run_closed_loop(
        client, texts, callers=callers, warmup_s=plan.warmup_s, window_s=window_s, drain_s=plan.drain_s, seed=seed
    )
    meter = metering.result()  # the loop can return right at the window's end, before the last readings
    summary = summarize(run)
    summary["queue"] = {k: meter.pop(k) for k in ("queue_mean", "queue_max") if k in meter} or None
    summary.update(worker_view(meter.pop("counters", {}), window_s))
    summary["cpu_roles"] = meter.pop("roles", None)
    summary["cpu"] = dict(meter)
    summary["wall_s"] = round(time.monotonic() - start, 1)
    return summary


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


def add_stack_arguments(parser: argparse.ArgumentParser, *, levels: str) -> None:
    """Add the options every benchmark that drives the service stack shares."""
    parser.add_argument("--model", default="chattts-tiny", help="registry model (chattts needs its weights)")
    parser.add_argument("--levels", default=levels, help="concurrent callers per level")
    parser.add_argument("--duration", type=float, help="measured seconds per level (default 30, quick 8)")
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch CPU threads, worker and baseline alike (see NOTES)"
    )
    parser.add_argument("--device", default=None, help="cpu for the tiny model, auto otherwise")
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="model host processes in the worker (default: on CPU, cores ÷ torch threads; else 1); "
        "the engine limit is measured with as many engines side by side",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the service, the baseline and the engine measurement alike, "
        "e.g. TTS_WORKER_CONCURRENCY=64 or OMP_WAIT_POLICY=PASSIVE (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)


def resolve_stack_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on other options: the device and the model hosts."""
    args.device = args.device or ("cpu" if args.model == "chattts-tiny" else "auto")
    if args.replicas is None:
        args.replicas = default_replicas(args.device, args.torch_threads)
    return args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.headline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_stack_arguments(parser, levels="1,10,50")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    return resolve_stack_arguments(parser.parse_args(argv))


def default_replicas(device: str, torch_threads: int) -> int:
    """Return the model hosts a worker runs by default: on CPU, one per core's share of threads; else one."""
    return max(1, (os.cpu_count() or 1) // max(1, torch_threads)) if device == "cpu" else 1


def service_env(args: argparse.Namespace, out: Path) -> dict[str, str]:
    """Return the environment the worker, the API, the baseline and the engine measurement share."""
    env = {
        "TTS_MODELS_FILE": str(bench_models_file(out)),
        "TTS_DEFAULT_MODEL": args.model,
        "TTS_DEVICE": args.device,
        "TTS_TORCH_THREADS": str(args.torch_threads),
        "TTS_HEARTBEAT_S": str(HEARTBEAT_S),
        "TTS_MODEL_REPLICAS": str(args.replicas),
        "TTS_LOG_LEVEL": "INFO",
    }
    for pair in args.service_env:
        name, _, value = pair.partition("=")
        env[name] = value
    os.environ.update(env)  # this process reads the same settings (registry, segment caps)
    env.update(prepare_model(args.model))
    os.environ.update(env)
    return env


def corpus_texts(model: str) -> list[tuple[str, int]]:
    """Return each corpus text with the characters the service will synthesise of it."""
    from core.registry import load_registry
    from core.settings import load_settings

    language = load_registry(load_settings()).get(model).language
    return [(t, sum(map(len, service_segments(t, language=language)))) for t in read_corpus()]


def drive(args: argparse.Namespace, plan: Plan, env: dict[str, str], out: Path) -> tuple[list[dict[str, Any]], Any]:
    """Start both servers and run every level against each; return the levels and the cache-on line."""
    texts = corpus_texts(args.model)
    levels = [int(x) for x in args.levels.split(",")]
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
        served = ServedClient(stack.api.url, model=args.model)
        for n, callers in enumerate(levels):
            level: dict[str, Any] = {"callers": callers}
            stack.wait_idle()
            after = level["after"] = run_level(
                served,
                texts,
                callers,
                plan,
                window_s=plan.window_s,
                seed=n,
                probe=stack.queued,
                counters=stack.worker_totals,
            )
            from_heartbeat = counter.after_level(after["segments_total"])
            if after.get("mean_batch_size") is None:
                after["mean_batch_size"] = from_heartbeat
            progress("after", after)
            if baseline:
                baseline.wait_idle()
                client = BaselineClient(baseline.url)
                before = level["before"] = run_level(
                    client, texts, callers, plan, window_s=plan.window_s, seed=n, counters=baseline.totals
                )
                progress("before", before)
            results.append(level)
        if plan.cache_window_s:
            stack.wait_idle()
            cached = ServedClient(stack.api.url, model=args.model, cache=True, fixed_seed=1)
            cache_line = run_level(cached, texts, 10, plan, window_s=plan.cache_window_s, seed=99)
            progress("cache", cache_line)
    finally:
        if baseline:
            baseline.stop()
        stack.stop()
        shutil.rmtree(out / "redis", ignore_errors=True)
    return results, cache_line


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
    engine = None if args.skip_engine else measure_engine(env, plan, args, out)
    if engine is not None and "TTS_BATCH_MAX_SIZE" not in {**os.environ, **env}:
        env["TTS_BATCH_MAX_SIZE"] = str(engine["service_batch"])
        print(f"service batch size: {engine['service_batch']} (the engine's best)")
    results, cache_line = drive(args, plan, env, out)
    meta = {"args": args, "plan": plan, "elapsed": time.monotonic() - started}
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
    title = (
        f"{args.model} on {os.cpu_count()} CPUs, torch threads {args.torch_threads}, "
        f"{args.replicas} model host{'s' if args.replicas > 1 else ''} in the worker, "
        f"{plan.window_s:g}s per level, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    rows = report.targets(results, engine)
    parts = [
        f"## Headline benchmark: {title}",
        "",
        report.level_table(results),
        "",
        report.engine_table(engine, results),
        "",
        report.targets_table(rows),
    ]
    if cache_line:
        hit = cache_line["cached_segments"] / max(1, cache_line["segments_total"])
        parts += [
            "",
            f"Cache on (10 callers, one seed, {cache_line['window_s']:g}s): "
            f"{cache_line['jobs_per_s']:.2f} jobs/s, p50 first audio {cache_line['first_audio_p50']:.2f} s, "
            f"{hit:.0%} of segments from the cache.",
        ]
    others = [
        side["cpu"].get("others_pct", 0.0) for lv in results for side in (lv.get("after"), lv.get("before")) if side
    ]
    if others and max(others) > CONTENDED_PCT:
        parts += [
            "",
            f"WARNING: other processes used up to {max(others):.0f}% of the CPUs during the measured windows "
            "(row 'CPU busy'); expect noisier, possibly lower numbers than a quiet machine gives.",
        ]
    if plan.window_s < FULL_WINDOW_S:
        fewest = min(
            (side["jobs_measured"] for lv in results for side in lv.values() if isinstance(side, dict)), default=0
        )
        parts += [
            "",
            f"Short run ({plan.window_s:g}s per level, as few as {fewest} jobs in a level): a smoke test; "
            "judge the targets on a full run.",
        ]
    parts += ["", f"Whole run: {elapsed:.0f}s. Files: {out}"]
    document = "\n".join(parts)
    (out / "headline.md").write_text(document + "\n", encoding="utf-8")
    record = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "plan": asdict(plan),
        "levels": results,
        "engine": engine,
        "cache_line": cache_line,
        "targets": rows,
        "elapsed_s": elapsed,
    }
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    if results:
        chart.draw(results, out / "headline.png", title=title)
        shutil.copy(out / "headline.png", out.parent / "headline.png")
    shutil.copy(out / "headline.md", out.parent / "headline.md")
    return document


if __name__ == "__main__":
    sys.exit(main())

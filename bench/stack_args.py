"""The command line, durations and environment that every benchmark driving the service stack shares."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bench.engine_limit import read_corpus, service_segments
from bench.headline_stack import bench_models_file
from bench.report import RESULTS

#: Worker heartbeat period during the run: the per-level mean batch size is read from it.
HEARTBEAT_S = 1.0


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


#: The real-size model makes about 2 characters a second at batch 1 on 2 cores, 100 times slower than the tiny
#: one: a level's window is long enough for a 50-caller queue to turn over twice, the drain lets the slow
#: baseline's queue finish (or be abandoned), and the engine limit measures only batch 1 and the best batch.
REAL_SIZE = Plan(120, 5, 200, "1,16", 32, 20, 0)
#: Real-size runs draw only the corpus texts up to this many characters (122 of its 229: the short prompts,
#: replies and announcements), so that 50 callers' jobs fit a window at 2 characters a second.
REAL_SIZE_MAX_CHARS = 30


def make_plan(args: argparse.Namespace) -> Plan:
    """Return the durations for a full run (about 8 minutes on 2 cores), a quick one (about 2) or a real-size one."""
    quick = Plan(8, 2, 40, "1,8", 32, 5, 0)  # a smoke test: shorter drain, small engine check
    full = Plan(30, 4, 240, "1,8,16,32", 64, 15, 12)
    plan = quick if args.quick else REAL_SIZE if args.real_size else full
    if args.duration:
        plan = replace(plan, window_s=args.duration, cache_window_s=min(plan.cache_window_s, args.duration))
    return plan


def prepare_model(model: str) -> dict[str, str]:
    """Build a random-weight model if it is the one asked for and missing; refuse a real model without weights."""
    from core.settings import load_settings

    settings = load_settings()
    if model == "chattts-tiny":
        from workers.engines.chattts_tiny import build_tiny_model, is_complete

        tiny = settings.tiny_model_dir
        if not is_complete(tiny):
            print(f"building the tiny ChatTTS in {tiny}")
            build_tiny_model(tiny)
        return {"TTS_TINY_MODEL_DIR": str(tiny)}
    if model == "chattts-random":
        from bench.full_model import ensure_full_model, model_spec

        ensure_full_model(model_spec(model))  # nothing to do when it is already built
        return {}
    if model == "chattts" and not settings.chattts_weights_dir.is_dir():
        from workers.engines.chattts import where_weights_go

        sys.exit(f"no ChatTTS weights: {where_weights_go(settings.chattts_weights_dir)}")
    return {}


def add_stack_arguments(parser: argparse.ArgumentParser, *, levels: str) -> None:
    """Add the options every benchmark that drives the service stack shares."""
    parser.add_argument("--model", default="chattts-tiny", help="registry model (chattts needs its weights)")
    parser.add_argument("--levels", default=levels, help="concurrent callers per level")
    parser.add_argument("--duration", type=float, help="measured seconds per level (default 30, quick 8)")
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run")
    parser.add_argument(
        "--real-size",
        action="store_true",
        help=f"the real-size random-weight model (make full-model), texts up to {REAL_SIZE_MAX_CHARS} characters, "
        f"{REAL_SIZE.window_s:g}s windows",
    )
    parser.add_argument(
        "--max-chars", type=int, default=None, help="draw only the corpus texts up to this many characters"
    )
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
    if args.real_size:
        args.model = "chattts-random" if args.model == "chattts-tiny" else args.model
        args.max_chars = args.max_chars or REAL_SIZE_MAX_CHARS
    args.device = args.device or ("cpu" if args.model == "chattts-tiny" or not has_cuda() else "auto")
    if args.replicas is None:
        args.replicas = default_replicas(args.device, args.torch_threads)
    return args


def has_cuda() -> bool:
    """Say whether torch sees a GPU (on a CPU-only machine "auto" is the CPU, with one model host per core)."""
    import torch

    return bool(torch.cuda.is_available())


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


def corpus_texts(model: str, *, max_chars: int | None = None) -> list[tuple[str, int]]:
    """Return each corpus text (up to ``max_chars`` long) with the characters the service will synthesise of it."""
    from core.registry import load_registry
    from core.settings import load_settings

    language = load_registry(load_settings()).get(model).language
    texts = [t for t in read_corpus() if max_chars is None or len(t) <= max_chars]
    return [(t, sum(map(len, service_segments(t, language=language)))) for t in texts]

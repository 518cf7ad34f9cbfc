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
from core.settings_worker import WorkerSettings
from workers.layout import AUTO, Layout, resolve_layout, usable_cores

#: The worker's heartbeat period at its default: the per-level mean batch size is read from the heartbeat.
HEARTBEAT_S: float = WorkerSettings.model_fields["heartbeat_s"].default


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
        "--torch-threads",
        type=int,
        default=None,
        help="torch CPU threads, worker and baseline alike (default: the service's auto layout; setting it "
        "changes a default, and the table says so)",
    )
    parser.add_argument("--device", default=None, help="cpu for the tiny model, auto otherwise")
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="model host processes in the worker (default: the service's auto layout; setting it changes a "
        "default, and the table says so); the engine limit is measured with as many engines side by side",
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
    """Fill the defaults that depend on other options: the device, and the model hosts and threads the service's
    ``auto`` layout gives (which the baseline and the engine measurement then use too)."""
    if args.real_size:
        args.model = "chattts-random" if args.model == "chattts-tiny" else args.model
        args.max_chars = args.max_chars or REAL_SIZE_MAX_CHARS
    args.layout_set = [f"{n}={v}" for n, v in (("TTS_DEVICE", args.device), ("TTS_MODEL_REPLICAS", args.replicas),
                                               ("TTS_TORCH_THREADS", args.torch_threads)) if v is not None]  # fmt: skip
    cuda = has_cuda()
    args.device = args.device or ("auto" if cuda else "cpu")
    layout = resolve_layout(
        AUTO if args.replicas is None else args.replicas,
        AUTO if args.torch_threads is None else args.torch_threads,
        gpus=1 if cuda and args.device != "cpu" else 0,
        cores=usable_cores(),
    )
    args.replicas, args.torch_threads = layout.replicas, layout.torch_threads
    return args


def default_layout() -> Layout:
    """Return the model hosts and threads the service's ``auto`` layout gives a worker on this machine's CPUs."""
    return resolve_layout(AUTO, AUTO, gpus=0, cores=usable_cores())


def changed_settings(args: argparse.Namespace) -> list[str]:
    """Return the ``NAME=VALUE`` settings a run changes from `make run`'s defaults: those its command line set."""
    return [*args.layout_set, *args.service_env]


def settings_line(args: argparse.Namespace) -> str:
    """Return the settings a run changed from `make run`'s defaults (beside the model it measures), in words."""
    changed = ", ".join(changed_settings(args))
    return f"settings changed from `make run`'s defaults: {changed}" if changed else "`make run`'s default settings"


def has_cuda() -> bool:
    """Say whether torch sees a GPU (on a CPU-only machine "auto" is the CPU, with one model host per core)."""
    import torch

    return bool(torch.cuda.is_available())


def service_env(args: argparse.Namespace, out: Path) -> dict[str, str]:
    """Return the environment the worker, the API, the baseline and the engine measurement share: the model under
    test, and whatever the command line changed."""
    env = {"TTS_MODELS_FILE": str(bench_models_file(out)), "TTS_DEFAULT_MODEL": args.model}
    for pair in changed_settings(args):  # only what the command line set: the rest is `make run`'s defaults
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

"""FIFO against deadline scheduling, same engine, one run (``make bench-schedule``).

``python -m bench.schedule [--levels 10,50] [--duration S] [--quick]``

Two stacks (Redis, one worker, the API) differ only in ``TTS_SCHEDULER``. Both are started first
and stay up; each level then drives them in turn with the headline benchmark's closed-loop callers
and listener model, alternating which goes first. The table gives, per level and scheduler, p99
first audio, the share of jobs with a playback stall, p99 total stall, jobs/s and chars/s, and the
targets of issue 9: at 50 callers p99 first audio ≤ 0.5x FIFO's with jobs/s within 10%; at 10
callers no stall in at least 99% of jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bench.headline_levels import compare_stacks
from bench.headline_stack import ServiceStack
from bench.report import (
    ERRORS,
    FIRST_AUDIO,
    JOBS,
    JOBS_PER_S,
    STALL_P99,
    STALLED,
    Column,
    cell,
    side_by_side,
    write_run,
)
from bench.stack_args import (
    HEARTBEAT_S,
    Plan,
    add_stack_arguments,
    corpus_texts,
    make_plan,
    resolve_stack_arguments,
    service_env,
)
from core.settings import load_settings

SCHEDULERS = ("fifo", "deadline")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line (the headline benchmark's stack options)."""
    parser = argparse.ArgumentParser(prog="python -m bench.schedule", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_stack_arguments(parser, levels="10,50")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=8,
        help="TTS_BATCH_MAX_SIZE of both stacks (default 8: on CPU an engine call lasts as long as its batch is "
        "big, and first audio waits for one; 16, the service's default, gives the tiny engine its best throughput)",
    )
    args = resolve_stack_arguments(parser.parse_args(argv))
    if not any(pair.startswith("TTS_BATCH_MAX_SIZE=") for pair in args.service_env):
        args.service_env.append(f"TTS_BATCH_MAX_SIZE={args.batch_max}")
    return args


def settings_value(name: str) -> object:
    """Return a setting as the service reads it (defaults, then this process's environment)."""
    return getattr(load_settings(), name)


def table(levels: list[dict[str, Any]]) -> str:
    """Return the markdown comparison, one row per level and scheduler."""
    columns: list[Column] = [
        JOBS_PER_S, ("chars/s", lambda s: f"{s['chars_per_s']:.0f}"), FIRST_AUDIO, STALLED, STALL_P99,
        ("p99 done (s)", lambda s: cell(s["latency_p99"])), ("mean batch", lambda s: cell(s.get("mean_batch_size"))),
        ERRORS, JOBS,
    ]  # fmt: skip
    return side_by_side(levels, {name: name for name in SCHEDULERS}, "scheduler", columns)


def verdicts(levels: list[dict[str, Any]]) -> list[str]:
    """Return one line per target of issue 9."""
    out = []
    by = {level["callers"]: level for level in levels}
    if 50 in by:
        fifo, edf = by[50]["fifo"], by[50]["deadline"]
        if fifo["first_audio_p99"] and edf["first_audio_p99"] is not None:
            ratio = edf["first_audio_p99"] / fifo["first_audio_p99"]
            out.append(f"- 50 callers, p99 first audio deadline ÷ FIFO: {ratio:.2f}× (target ≤ 0.5×): "
                       f"{'met' if ratio <= 0.5 else 'NOT met'}")  # fmt: skip
        jobs = edf["jobs_per_s"] / fifo["jobs_per_s"] if fifo["jobs_per_s"] else 0.0
        out.append(f"- 50 callers, jobs/s deadline ÷ FIFO: {jobs:.2f}× (target ≥ 0.9×): "
                   f"{'met' if jobs >= 0.9 else 'NOT met'}")  # fmt: skip
    if 10 in by:
        share = by[10]["deadline"]["stall_share"]
        if share is not None:
            out.append(f"- 10 callers, jobs without a stall (deadline): {1 - share:.1%} (target ≥ 99%): "
                       f"{'met' if share <= 0.01 else 'NOT met'}")  # fmt: skip
    return out


def document(args: argparse.Namespace, plan: Plan, levels: list[dict[str, Any]], footer: str) -> str:
    """Return the markdown: the settings both stacks ran with, the table, the verdicts and ``footer``."""
    return "\n".join(
        [
            f"## FIFO vs deadline scheduling: {args.model}, {os.cpu_count()} CPUs, torch threads "
            f"{args.torch_threads}, {args.replicas} model host(s), {plan.window_s:g}s per level, "
            f"{time.strftime('%Y-%m-%d %H:%M')}",
            "",
            "Service settings of both stacks: "
            + ", ".join(f"`{pair}`" for pair in args.service_env)
            + f"; the deadline stack's first-segment priority {settings_value('deadline_first_priority_s')} s.",
            "",
            table(levels),
            "",
            *verdicts(levels),
            "",
            footer,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Start both stacks, drive every level against each, print and write the table."""
    args = parse_args(argv)
    plan = make_plan(args)
    out = args.out / f"schedule-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    env = service_env(args, out)
    texts = corpus_texts(args.model)
    print(f"schedule benchmark: {args.model}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"levels {args.levels}, {plan.window_s:g}s each; results in {out}", flush=True)  # fmt: skip
    started = time.monotonic()
    stacks = {}
    for name in SCHEDULERS:
        (out / name).mkdir(exist_ok=True)
        stacks[name] = ServiceStack({**env, "TTS_SCHEDULER": name}, out / name, api_processes=2)
    levels = compare_stacks(stacks, model=args.model, levels=args.levels, plan=plan, texts=texts)
    footer = f"Whole run: {time.monotonic() - started:.0f}s (heartbeat {HEARTBEAT_S:g}s). Files: {out}"
    document_text = document(args, plan, levels, footer)
    write_run(out, "schedule", document_text, levels)
    print()
    print(document_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One worker against the same model hosts split over two workers, one run (``make bench-workers``).

``python -m bench.split_workers [--levels 10,20] [--duration S]``

Production runs one worker per GPU, and a job's segments go to whichever worker takes them: its first segment
is often made by one worker while another holds its later ones. Two stacks (Redis, the API, deadline scheduling)
differ only in how their model hosts are spread: ``one`` runs one worker with two hosts, ``split`` two workers
with one host each, on the same Redis. Both are started first and stay up; each level drives them in turn with
the headline benchmark's closed-loop callers and listener model, alternating which goes first. The table gives,
per level and layout, jobs/s, first audio, the share of jobs whose listener stalled and p99 total stall, and from
the engine calls every worker recorded (the shared statistics in the stack's Redis) the mean batch and the
characters made per second a host was busy; the verdict asks that splitting the hosts over workers cost no stalls
at 10 callers (at most 1% of jobs, as one worker does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
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
from bench.stack_args import HEARTBEAT_S, add_stack_arguments, corpus_texts, make_plan, service_env
from devstack.local import free_port
from devstack.worker import WorkerProcess

LAYOUTS = ("one", "split")
#: Model hosts in either layout: one per core of this 2-core machine, each with one torch thread.
HOSTS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line (the headline benchmark's stack options, the hosts fixed at two)."""
    parser = argparse.ArgumentParser(prog="python -m bench.split_workers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_stack_arguments(parser, levels="10,20")
    parser.add_argument("--batch-max", type=int, default=8, help="TTS_BATCH_MAX_SIZE of every worker (default 8)")
    args = parser.parse_args(argv)
    args.device = args.device or "cpu"
    args.replicas = 1  # per worker of the split layout; the one worker gets HOSTS (see stack_env)
    if not any(pair.startswith("TTS_BATCH_MAX_SIZE=") for pair in args.service_env):
        args.service_env.append(f"TTS_BATCH_MAX_SIZE={args.batch_max}")
    return args


def stack_env(env: dict[str, str], layout: str) -> dict[str, str]:
    """Return a layout's environment: its workers' model hosts add up to HOSTS."""
    return {**env, "TTS_MODEL_REPLICAS": str(HOSTS if layout == "one" else 1)}


class SplitStack(ServiceStack):
    """The bench stack with a second worker on the same Redis, each worker with its own metrics port."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        super().__init__(env, workdir, api_processes=2)
        self.second = WorkerProcess({**self.env, "TTS_METRICS_PORT": str(free_port())}, workdir / "worker2.log")

    def start(self, *, ready_timeout: float = 300, overlap: bool = False) -> None:
        """Start Redis, both workers and the API."""
        super().start(ready_timeout=ready_timeout, overlap=overlap)
        self.second.start()
        self.second.wait_heartbeat(self.client, timeout=ready_timeout)

    def stop(self) -> None:
        """Stop the second worker, then the rest."""
        try:
            self.second.stop()
        finally:
            super().stop()


def table(levels: list[dict[str, Any]]) -> str:
    """Return the markdown comparison, one row per level and layout."""
    columns: list[Column] = [
        JOBS_PER_S, FIRST_AUDIO, STALLED, STALL_P99, ("mean batch", lambda s: cell(s.get("mean_batch_size"), ".1f")),
        ("chars per busy host-second", lambda s: cell(s.get("chars_per_busy_s"), ".0f")), ERRORS, JOBS,
    ]  # fmt: skip
    names = {"one": f"one worker × {HOSTS}", "split": f"{HOSTS} workers × 1"}
    return side_by_side(levels, names, "model hosts", columns)


def verdicts(levels: list[dict[str, Any]]) -> list[str]:
    """Return the verdict: at 10 callers, split workers stall no more than 1% of jobs."""
    by = {level["callers"]: level for level in levels}
    share = by[10]["split"]["stall_share"] if 10 in by else None
    if share is None:
        return []
    return [f"- 10 callers, jobs without a stall on {HOSTS} workers: {1 - share:.1%} (target ≥ 99%): "
            f"{'met' if share <= 0.01 else 'NOT met'}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Start both stacks, drive every level against each, print and write the table."""
    args = parse_args(argv)
    plan = make_plan(args)
    out = args.out / f"split-workers-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    env = service_env(args, out)
    texts = corpus_texts(args.model)
    print(f"split-workers benchmark: {args.model}, {os.cpu_count()} CPUs, levels {args.levels}, "
          f"{plan.window_s:g}s each; results in {out}", flush=True)  # fmt: skip
    started = time.monotonic()
    for layout in LAYOUTS:
        (out / layout).mkdir(exist_ok=True)
    stacks: dict[str, ServiceStack] = {
        "one": ServiceStack(stack_env(env, "one"), out / "one", api_processes=2),
        "split": SplitStack(stack_env(env, "split"), out / "split"),
    }
    # Only the first worker's metrics could be read in the split layout: neither is read.
    levels = compare_stacks(stacks, model=args.model, levels=args.levels, plan=plan, texts=texts, counters=False)
    document = "\n".join(
        [
            f"## One worker against split workers: {args.model}, {os.cpu_count()} CPUs, {HOSTS} model hosts of "
            f"{args.torch_threads} torch thread(s) either way, {plan.window_s:g}s per level, "
            f"{time.strftime('%Y-%m-%d %H:%M')}",
            "",
            "Service settings of both stacks: " + ", ".join(f"`{pair}`" for pair in args.service_env) + ".",
            "",
            table(levels),
            "",
            *verdicts(levels),
            "",
            f"Whole run: {time.monotonic() - started:.0f}s (heartbeat {HEARTBEAT_S:g}s). Files: {out}",
        ]
    )
    write_run(out, "split-workers", document, levels)
    print()
    print(document)
    return 0


if __name__ == "__main__":
    sys.exit(main())

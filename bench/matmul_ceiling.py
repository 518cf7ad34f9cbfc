"""The most batching can buy on this machine at ChatTTS's real sizes: its Llama's matrix multiplies and nothing else.

``python -m bench.matmul_ceiling [--rows 1,2,4,5,8,10,16,32] [--steps 20]`` (part of ``make bench-engine``)

A decode step of ChatTTS's GPT is, for the most part (80% of a model host's samples at 16 callers, py-spy), its
Llama's linear layers: per layer the q, k, v and o projections (hidden × hidden) and the MLP's gate, up and down
(hidden × intermediate), at the real sizes (``workers/engines/chattts_presets.FULL``). This times exactly those, with
random weights, for a given number of rows (one per segment being made), in each torch threads × replicas layout that
fills the cores, the replicas side by side as a worker's model hosts run. No attention, norms, heads, sampling, prompt
pass, decoder or vocoder, and no row ever ends: every real engine, scheduler and service does less well than this.

From it, for C concurrent callers (one segment each, spread over the replicas): the batching gain ceiling (tokens/s of
the best layout with C rows ÷ the best layout with one row per replica, as batching off runs) and the first-segment
slowdown floor (a step with C rows ÷ a step with one, in the best batched layout): what a first segment made among C
others costs against one made alone, before anything but the matrix maths. Writes bench/results/matmul_ceiling.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any

from bench.engine_real import run_replicas, settings_to_try
from bench.report import write_result
from workers.engines.chattts_presets import FULL


def _replica(threads: int, rows: list[int], steps: int, barrier: Any, results: Any) -> None:
    """Build one Llama's linear layers, then time ``steps`` decode steps at each row count, together with the rest."""
    import torch

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(3)
    hidden, inner = FULL.hidden, FULL.intermediate

    def weight(out: int, into: int) -> torch.Tensor:
        return torch.randn(out, into, generator=generator) / into**0.5

    layers = [
        (
            [weight(hidden, hidden) for _ in range(4)],
            weight(inner, hidden),
            weight(inner, hidden),
            weight(hidden, inner),
        )
        for _ in range(FULL.layers)
    ]
    linear = torch.nn.functional.linear

    def step(x: torch.Tensor) -> torch.Tensor:
        for (q, k, v, o), gate, up, down in layers:
            linear(x, k), linear(x, v)
            x = x + linear(linear(x, q), o)
            x = x + linear(linear(x, gate) * linear(x, up), down)
        return x

    times = {}
    with torch.inference_mode():
        for count in rows:
            x = torch.randn(count, hidden, generator=generator)
            step(x)  # untimed: the first call's allocations
            barrier.wait(timeout=600)  # every replica times the same row count at once
            started = time.perf_counter()
            for _ in range(steps):
                step(x)
            times[count] = (time.perf_counter() - started) / steps
    results.put(times)


def measure(threads: int, replicas: int, rows: list[int], steps: int) -> dict[int, float]:
    """Return each row count's step time (the slowest replica's) with ``replicas`` processes side by side."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(replicas), context.Queue()
    processes = [
        context.Process(target=_replica, args=(threads, rows, steps, barrier, results)) for _ in range(replicas)
    ]
    found = run_replicas(processes, results)
    return {count: max(times[count] for times in found) for count in rows}


def ceilings(layouts: dict[tuple[int, int], dict[int, float]], callers: int) -> tuple[float, float, str] | None:
    """Return the batching gain ceiling, the first-segment slowdown floor and the layout that gives them, at
    ``callers`` rows spread evenly over the replicas (None where no layout can spread them evenly)."""
    batch1 = max(replicas / step[1] for (_, replicas), step in layouts.items())
    best = None
    for (threads, replicas), step in layouts.items():
        if callers % replicas or callers // replicas not in step:
            continue
        rate = callers / step[callers // replicas]
        if best is None or rate > best[0]:
            best = (rate, step[callers // replicas] / step[1], f"{threads} × {replicas}")
    return None if best is None else (best[0] / batch1, best[1], best[2])


def document(layouts: dict[tuple[int, int], dict[int, float]], rows: list[int], steps: int, wall_s: float) -> str:
    """Return the markdown: tokens/s by layout and rows, then the ceilings at a few caller counts."""
    names = [f"{t} threads × {r} replicas" for t, r in layouts]
    lines = [
        f"## The matrix-maths ceiling on {os.cpu_count()} CPU cores (ChatTTS's Llama linears at real size, fp32)",
        "",
        f"{FULL.layers} layers of hidden {FULL.hidden}, intermediate {FULL.intermediate}; {steps} timed steps per "
        f"cell; whole run {wall_s:.0f}s. Tokens/s are all replicas' together (each replica carries the rows given).",
        "",
        "| rows per replica | " + " | ".join(f"{n}: ms a step / tokens/s" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for count in rows:
        cells = [f"{1000 * step[count]:.0f} / {r * count / step[count]:.1f}" for (_, r), step in layouts.items()]
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| concurrent callers (one segment each) | batching gain ceiling (× the best layout at batch 1) | "
        "first-segment slowdown floor (× a step alone) | layout |",
        "|---|---|---|---|",
    ]
    for callers in (4, 8, 10, 16, 32):
        found = ceilings(layouts, callers)
        if found is not None:
            lines.append(f"| {callers} | {found[0]:.2f}× | {found[1]:.2f}× | {found[2]} |")
    lines += [
        "",
        "Nothing else runs in these steps, and no row ends: a real engine, and the service around it, stay below the "
        "gain and above the slowdown.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Time every layout that fills the cores at every row count, and write the tables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.matmul_ceiling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,2,4,5,8,10,16,32", help="rows per replica (1 is always measured)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    rows = sorted({1, *(int(r) for r in args.rows.split(","))})
    started = time.perf_counter()
    layouts = {}
    for threads, replicas in settings_to_try(os.cpu_count() or 1):
        print(f"{threads} torch threads × {replicas} replicas: rows {rows}", flush=True)
        layouts[threads, replicas] = measure(threads, replicas, rows, args.steps)
    write_result("matmul_ceiling", document(layouts, rows, args.steps, time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())

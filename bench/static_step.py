"""The static decode step against today's growing-cache loop on this machine's CPU, at full size, batch 1, 4 and 16.

``python -m bench.static_step [--batches 1,4,16] [--repeats 3] [--threads N]`` (part of ``make bench-engine``)

One process loads the full-size random-weight ChatTTS (``make full-model``) twice on the CPU: graphs ``off`` (the
growing key/value cache, today's loop) and ``on`` (the static cache of workers/engines/static_cache.py, its step run
eagerly: there is nothing to capture graphs on). For each batch size both run the same speech-code generation
(``chattts_generate.generate`` over ``engine.code_prompts``, the Llama and its sampler only: no decoder, no
vocoder): the same segments of bench/corpus_zh.txt, the same seeds, each item exactly its own token budget (fixed
budgets: no item ends early), so both make the same tokens. The two alternate which goes first, ``--repeats``
times; the table gives medians. A step's time is from one decode step's Llama forward to the next (sampling and the
loop's bookkeeping included, the prompt pass not); tokens/s is the whole generation's, prompt pass included.

The issue's target: at batch 16 the static step's tokens/s is not below today's (within 5%, the same run). On a CPU
``auto`` serves whichever path this table finds faster. Writes bench/results/static_step.md and publishes it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.engine_limit import read_corpus, segment_pool
from bench.fragment_joins import random_preset
from bench.gpu_check_engine import pick_texts
from bench.report import RESULTS, write_result
from devstack.local import ROOT
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_generate import generate

#: The two paths, by their ``set_graphs`` mode: today's loop first.
PATHS = {"off": "growing cache (today's loop)", "on": "static cache, eager step"}
#: Below this share of today's tokens/s at the largest batch, the static step misses the issue's target.
TARGET = 0.95


@dataclass(frozen=True)
class Generation:
    """One timed generation of one batch on one path."""

    tokens: int
    seconds: float
    step_s: float  # the median decode step
    ids: list[torch.Tensor]


@dataclass(frozen=True)
class Row:
    """One path at one batch size, medians over the repeats."""

    batch: int
    mode: str
    decode_path: str
    tokens: int
    step_ms: float
    tokens_per_s: float
    #: This path's tokens/s ÷ today's loop's at the same batch (1 on today's own row).
    ratio: float
    #: Every item's tokens equal today's loop's, in every repeat.
    identical: bool


def lone_call_threads() -> tuple[int, str]:
    """Return the torch threads `make run`'s ``auto`` layout gives a call running alone here, and why."""
    from bench.stack_args import default_layout

    layout = default_layout()
    threads = layout.shared_cores or layout.torch_threads or torch.get_num_threads()
    return threads, f"what `make run`'s auto layout gives a call running alone ({layout.describe()})"


def load(weights: Path, mode: str, *, rows: int, positions: int, tokens_per_char: float, max_tokens: int
         ) -> ChatTTSEngine:  # fmt: skip
    """Load ChatTTS from ``weights`` on the CPU with graphs ``mode``, each item exactly its token budget."""
    engine = ChatTTSEngine(weights_dir=weights, device="cpu", tokens_per_char=tokens_per_char, max_tokens=max_tokens,
                           fixed_token_budget=True, static_rows=rows, static_positions=positions)  # fmt: skip
    engine.set_graphs(mode)
    engine.load()
    return engine


def requests_for(pool: list[str], batch: int) -> list[SynthesisRequest]:
    """Return ``batch`` segments spread over the pool's lengths, each with its own fixed seed."""
    return [SynthesisRequest(text=text, seed=100 + i) for i, text in enumerate(pick_texts(pool, batch))]


def generation(engine: ChatTTSEngine, requests: list[SynthesisRequest]) -> Generation:
    """Generate ``requests``' speech codes on ``engine``'s path; time the whole and each decode step."""
    chat = engine.chat
    prompts = engine.code_prompts(requests)  # untimed: tokenising and embedding, the same on both paths
    starts: list[float] = []
    hook = chat.gpt.gpt.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))
    try:
        with torch.inference_mode():
            chat.context.set(False)
            began = time.perf_counter()
            # The engine's own static step (None on today's loop), as its synthesis passes it.
            result = generate(chat, prompts, chat.InferCodeParams(show_tqdm=False), infer_text=False,
                              static=engine.static_step)  # fmt: skip
            ended = time.perf_counter()
    finally:
        hook.remove()
    # starts[0] is the prompt pass; each decode step runs from its Llama forward to the next one (or the end).
    marks = [*starts[1:], ended]
    steps = [b - a for a, b in itertools.pairwise(marks)]
    ids = [t.clone() for t in result.ids]
    return Generation(sum(len(t) for t in ids), ended - began, statistics.median(steps) if steps else 0.0, ids)


def compare(engines: dict[str, ChatTTSEngine], pool: list[str], batches: list[int], repeats: int,
            say: Callable[[str], None] = print) -> list[Row]:  # fmt: skip
    """Run each batch on every engine (``off`` first: the reference), alternating which goes first; return rows."""
    rows = []
    for batch in batches:
        requests = requests_for(pool, batch)
        runs: dict[str, list[Generation]] = {mode: [] for mode in engines}
        for repeat in range(repeats):
            order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
            for mode in order:
                runs[mode].append(generation(engines[mode], requests))
                run = runs[mode][-1]
                say(f"  batch {batch:>2}, graphs {mode:>3}, repeat {repeat + 1}: {run.tokens} tokens in "
                    f"{run.seconds:.1f}s, {1000 * run.step_s:.0f} ms a step")  # fmt: skip
        reference = runs["off"][0].ids
        rates = {mode: statistics.median(r.tokens / r.seconds for r in found) for mode, found in runs.items()}
        for mode, found in runs.items():
            same = all(len(r.ids) == len(reference) and all(map(torch.equal, r.ids, reference)) for r in found)
            rows.append(Row(batch=batch, mode=mode, decode_path=engines[mode].decode_path, tokens=found[0].tokens,
                            step_ms=1000 * statistics.median(r.step_s for r in found), tokens_per_s=rates[mode],
                            ratio=rates[mode] / rates["off"], identical=same))  # fmt: skip
    return rows


def verdict(rows: list[Row]) -> list[str]:
    """Return what the largest batch says: the target met or missed, and which path is the faster here."""
    largest = max(r.batch for r in rows)
    static = next((r for r in rows if r.batch == largest and r.mode == "on"), None)
    if static is None:
        return []
    met = "meets" if static.ratio >= TARGET else "misses"
    if abs(static.ratio - 1) < 1 - TARGET:
        faster = f"neither: the two are alike on this CPU at batch {largest}"
    else:
        faster = f"{'the static step' if static.ratio > 1 else 'the growing loop'} on this CPU at batch {largest}"
    return [
        f"At batch {largest} the static step makes {static.ratio:.2f}× today's loop's tokens/s: it {met} the target "
        f"(not below today's, within {100 * (1 - TARGET):.0f}%). The faster path: {faster}. On a CPU `auto` "
        "serves the growing loop and `on` the static step (workers/engines/chattts_static.py's `checked_static_step`).",
    ]


def document(rows: list[Row], settings: dict[str, Any]) -> str:
    """Return the markdown: what ran, the table, and what it says."""
    lines = [
        f"## The static decode step against today's loop on {os.cpu_count()} CPU cores ({settings['model']})",
        "",
        f"Speech-code generation only (the Llama, its heads and the per-item sampler; no decoder or vocoder), "
        f"torch threads {settings['threads']}: {settings['threads_why']}. Segments of bench/corpus_zh.txt spread "
        f"over their lengths, fixed seeds, each item exactly {settings['tokens_per_char']:g} audio tokens per "
        f"character (at least 24, at most {settings['max_tokens']}). Static cache {settings['rows']} rows × "
        f"{settings['positions']} positions. {settings['repeats']} repeat(s) per path and batch, alternating which "
        f"path goes first; medians. Whole run {settings['wall_s']:.0f}s (load average {settings['load']:.1f} at its "
        "start).",
        "",
        "| batch | path | tokens | ms per step (median) | tokens/s | ratio static / growing | identical tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.batch} | {PATHS.get(r.mode, r.mode)} | {r.tokens} | {r.step_ms:.0f} | {r.tokens_per_s:.1f} "
            f"| {r.ratio:.2f}× | {'yes' if r.identical else 'no'} |"
        )
    paths = {PATHS.get(r.mode, r.mode): r.decode_path for r in rows}
    lines += [
        "",
        *verdict(rows),
        "",
        "A step is one decode step's Llama forward to the next one's (sampling and bookkeeping included, the prompt "
        "pass not); tokens/s is the whole generation's, prompt pass included. Identical tokens: every item's tokens "
        "equal today's loop's, in every repeat. What each engine said serves: "
        + "; ".join(f"{name}: {path}" for name, path in paths.items())
        + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Load both paths, compare them at each batch size, print and write the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.static_step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights", type=Path, default=None, help="default: models/chattts-random (built if need be)")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens-per-char", type=float, default=6.0, help="the engine's own default")
    parser.add_argument("--max-tokens", type=int, default=150, help="the most audio tokens an item makes")
    parser.add_argument("--positions", type=int, default=768, help="the static cache's positions (the engine's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: a lone call's, `make run`)")
    parser.add_argument("--no-publish", action="store_true", help="write bench/results/ only (a smoke run)")
    args = parser.parse_args(argv)
    started, load_average = time.perf_counter(), os.getloadavg()[0]
    weights = args.weights
    if weights is None:
        from bench.full_model import ensure_full_model, model_spec

        ensure_full_model(model_spec())
        weights = ROOT / "models" / "chattts-random"
    threads, why = (args.threads, "set on the command line") if args.threads else lone_call_threads()
    torch.set_num_threads(threads)
    batches = [int(b) for b in args.batches.split(",")]
    # The static cache's rows: the largest batch. A CPU's eager step reads only the rows in use, so more rows
    # would cost memory (a gigabyte and a half per 16 rows at full size in fp32) and no time.
    rows = max(batches)
    engines = {mode: load(weights, mode, rows=rows, positions=args.positions, tokens_per_char=args.tokens_per_char,
                          max_tokens=args.max_tokens) for mode in PATHS}  # fmt: skip
    pool = segment_pool(read_corpus(), max(32, rows), language="zh", seed=7)
    # Untimed, at the largest batch: the first call's one-off costs (ChatTTS's jitted code, allocations, and the
    # static cache's pages, which the OS hands over as they are first written: about 1 s at 16 rows, measured).
    for engine in engines.values():
        generation(engine, requests_for(pool, rows))
    print(f"torch threads {threads} ({why}); batches {batches}, {args.repeats} repeat(s)", flush=True)
    found = compare(engines, pool, batches, args.repeats)
    preset = random_preset(weights)
    what = f"random weights, {preset} preset" if preset else "ChatTTS's real weights"
    settings = {"model": f"{weights.name}: {what}", "threads": threads,
                "threads_why": why, "tokens_per_char": args.tokens_per_char, "max_tokens": args.max_tokens,
                "rows": rows, "positions": args.positions, "repeats": args.repeats,
                "wall_s": time.perf_counter() - started, "load": load_average}  # fmt: skip
    markdown = document(found, settings)
    if args.no_publish:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "static_step.md").write_text(markdown + "\n", encoding="utf-8")
        print(markdown)
    else:
        write_result("static_step", markdown)
    return 0 if all(r.identical for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())

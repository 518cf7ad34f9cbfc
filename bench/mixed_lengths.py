"""How much a batch of mixed lengths costs against a length-sorted one, in-process, on the service's segments.

``python -m bench.mixed_lengths [--model chattts-tiny] [--batch 16] [--rounds 2]``

Cuts the benchmark corpus into the service's segments, draws a pool spread over their lengths
(as ``bench.engine_limit`` does), and runs the same pool as length-sorted batches and as batches in
random order, alternating, ``--rounds`` times. It prints chars/s for each and the padding share:
the part of ``batch × longest`` that is not an item's own length (what a loop that runs every row
to the longest item's end computes for nothing).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from bench.engine_limit import load_engine, read_corpus, segment_pool


def padding(groups: list[list[str]]) -> float:
    """Return the share of ``len(group) × longest`` that is padding, over all groups."""
    total = sum(max(map(len, g)) * len(g) for g in groups)
    return 1 - sum(len(t) for g in groups for t in g) / total


def run(engine: Any, groups: list[list[str]]) -> float:
    """Synthesise the groups one call each; return chars/s."""
    from workers.engines.base import SynthesisRequest

    started, chars = time.perf_counter(), 0
    for group in groups:
        engine.synthesize([SynthesisRequest(text=t, seed=i) for i, t in enumerate(group)])
        chars += sum(map(len, group))
    return chars / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    """Measure sorted against random-order batches and print both."""
    parser = argparse.ArgumentParser(prog="python -m bench.mixed_lengths", description=__doc__)
    parser.add_argument("--model", default="chattts-tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pool", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args(argv)
    engine, language = load_engine(args.model, torch_threads=args.torch_threads)
    pool = segment_pool(read_corpus(), args.pool, language=language, seed=7)
    ordered = sorted(pool, key=len)
    shuffled = list(pool)
    random.Random(3).shuffle(shuffled)
    sorted_groups = [ordered[i : i + args.batch] for i in range(0, len(ordered), args.batch)]
    random_groups = [shuffled[i : i + args.batch] for i in range(0, len(shuffled), args.batch)]
    print(f"padding: length-sorted {padding(sorted_groups):.2f}, random order {padding(random_groups):.2f}")
    for n in range(args.rounds):
        print(
            f"round {n + 1}: length-sorted {run(engine, sorted_groups):.0f} chars/s, "
            f"random order {run(engine, random_groups):.0f} chars/s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

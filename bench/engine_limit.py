"""Measure the raw engine in-process: batch 1, then length-sorted batches, on the service's own segments.

Run as ``python -m bench.engine_limit --model chattts-tiny --json out.json``. The settings (models file,
tiny model directory) come from the environment, as the worker's do. The texts are the segments the
service would make of the benchmark corpus, drawn as the load generator draws them, so characters per
second here and in the served run count the same characters.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from core.settings import load_settings
from core.text.plan import plan_segments

CORPUS = Path(__file__).with_name("corpus_zh.txt")


def read_corpus(path: Path = CORPUS) -> list[str]:
    """Return the corpus texts, one per non-empty line."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_engine(model: str, *, torch_threads: int, device: str = "cpu") -> tuple[Any, str]:
    """Build, load and warm the model's engine on ``device``; return it and the model's language."""
    import torch

    from core.registry import load_registry
    from workers.engines.factory import build_engine

    if torch_threads:
        torch.set_num_threads(torch_threads)
    spec = load_registry(load_settings()).get(model)
    engine = build_engine(spec, device=device)
    engine.load()
    engine.warmup()
    return engine, spec.language


def service_segments(text: str, *, language: str) -> list[str]:
    """Return the segments the service cuts ``text`` into, under the same settings."""
    settings = load_settings()
    return plan_segments(
        text,
        max_chars=settings.segment_max_chars,
        first_max_chars=settings.first_segment_max_chars,
        language=language,
    )


def segment_pool(texts: list[str], size: int, *, language: str, seed: int) -> list[str]:
    """Return ``size`` segments spread evenly over the lengths the service makes of the corpus, shuffled.

    The load generator draws texts uniformly, so the service sees every text's segments equally often;
    a systematic sample of that population, sorted by length, has its length distribution.
    """
    population = sorted((s for t in texts for s in service_segments(t, language=language)), key=len)
    step = len(population) / size
    pool = [population[min(len(population) - 1, int((i + 0.5) * step))] for i in range(size)]
    random.Random(seed).shuffle(pool)
    return pool


def measure(engine: Any, pool: list[str], *, batch: int, seconds: float, seed: int) -> dict[str, float]:
    """Run the pool in length-sorted batches of ``batch`` (random order of batches) for up to ``seconds``."""
    from workers.engines.base import SynthesisRequest

    ordered = sorted(pool, key=len) if batch > 1 else list(pool)
    groups = [ordered[i : i + batch] for i in range(0, len(ordered), batch)]
    random.Random(seed).shuffle(groups)
    chars = items = 0
    audio = elapsed = 0.0
    for n, group in enumerate(groups):
        started = time.perf_counter()
        waves = engine.synthesize([SynthesisRequest(text=t, seed=seed + n * batch + i) for i, t in enumerate(group)])
        elapsed += time.perf_counter() - started
        chars += sum(len(t) for t in group)
        items += len(group)
        audio += sum(len(w) for w in waves) / engine.sample_rate
        if elapsed >= seconds:
            break
    return {
        "batch": batch,
        "segments": items,
        "seconds": round(elapsed, 3),
        "chars_per_s": chars / elapsed,
        "segments_per_s": items / elapsed,
        "audio_s_per_s": audio / elapsed,
    }


def run(
    model: str, *, batches: list[int], pool_size: int, seconds: float, torch_threads: int, device: str
) -> dict[str, Any]:
    """Measure every batch size on the same pool of segments; the best chars/s is the machine's limit."""
    engine, language = load_engine(model, torch_threads=torch_threads, device=device)
    pool = segment_pool(read_corpus(), pool_size, language=language, seed=7)
    rows = [measure(engine, pool, batch=b, seconds=seconds if b == 1 else float("inf"), seed=11) for b in batches]
    best = max(rows, key=lambda r: r["chars_per_s"])
    return {
        "model": model,
        "torch_threads": torch_threads,
        "pool_segments": len(pool),
        "pool_mean_chars": sum(map(len, pool)) / len(pool),
        "rows": rows,
        "batch1_chars_per_s": next(r["chars_per_s"] for r in rows if r["batch"] == 1),
        "best_batch": best["batch"],
        "best_chars_per_s": best["chars_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure the engine and write the numbers as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.engine_limit", description=__doc__)
    parser.add_argument("--model", default="chattts-tiny")
    parser.add_argument("--batches", default="1,8,16,32", help="batch sizes to try (1 is always measured)")
    parser.add_argument("--pool", type=int, default=64, help="segments every batch size runs through")
    parser.add_argument("--batch1-seconds", type=float, default=15.0, help="time given to batch 1")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    batches = sorted({1, *(int(b) for b in args.batches.split(","))})
    result = run(
        args.model,
        batches=batches,
        pool_size=args.pool,
        seconds=args.batch1_seconds,
        torch_threads=args.torch_threads,
        device=args.device,
    )
    args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for row in result["rows"]:
        print(f"engine batch {row['batch']:>2}: {row['chars_per_s']:7.1f} chars/s over {row['segments']} segments")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The engine alone at ChatTTS's real sizes on this machine's CPUs: throughput by batch size, where the time goes,
and which torch thread and replica settings serve best.

``python -m bench.engine_real [--batches 1,4,8,16,32] [--precisions fp32,int8] [--pool 32]`` (``make bench-engine``)

It runs the random-weight full-size model (``chattts-random``, ``make full-model``), whose compute is ChatTTS's
and whose audio is noise, on length-sorted batches of the service's own segments of bench/corpus_zh.txt, each
segment's token budget fixed in proportion to its characters. The batch table runs each precision (fp32, and
int8: the Llama's Linear layers quantized, as the ``fast`` mode runs them) at the first setting. Every setting
runs as that many model processes side by side (as a worker's replicas do), each on its share of the same pool.
Stage shares come from wrapping ChatTTS's own methods (workers/engines/chattts_stages.py). Writes
bench/results/engine_real.md and .json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import sys
import time
from typing import Any

from bench.engine_limit import read_corpus, segment_pool
from bench.full_model import MODEL, ensure_full_model, loaded_engine, model_spec
from bench.report import RESULTS, write_result

STAGE_COLUMNS = ("prefill", "gpt", "sampling", "decoder", "vocoder", "other")


def run_batches(engine: Any, pool: list[str], *, batch: int, seconds: float, seed: int) -> dict[str, Any]:
    """Run ``pool`` in length-sorted batches of ``batch`` (random order of batches), stopping after ``seconds``."""
    from workers.engines.base import SynthesisRequest
    from workers.engines.chattts_stages import StageClock

    ordered = sorted(pool, key=len)
    groups = [ordered[i : i + batch] for i in range(0, len(ordered), batch)]
    random.Random(seed).shuffle(groups)
    clock = StageClock()
    chars = items = tokens = 0
    audio = elapsed = 0.0
    with clock.installed(engine.chat):
        for n, group in enumerate(groups):
            requests = [SynthesisRequest(text=t, seed=seed + n * batch + i) for i, t in enumerate(group)]
            started = time.perf_counter()
            waves = engine.synthesize(requests)
            elapsed += time.perf_counter() - started
            chars += sum(map(len, group))
            items += len(group)
            tokens += sum(engine.token_budget(t) for t in group)
            audio += sum(len(w) for w in waves) / engine.sample_rate
            if elapsed >= seconds:
                break
    return {"batch": batch, "segments": items, "chars": chars, "tokens": tokens, "audio_s": audio,
            "seconds": elapsed, "stage_seconds": dict(clock.seconds)}  # fmt: skip


def _replica(options: dict[str, Any], pool: list[str], batches: list[int], barrier: Any, results: Any) -> None:
    """Load the engine in this process, wait for the other replicas, run every batch size, send the rows."""
    from workers.pool.host import resident_mb

    spec = model_spec(options["model"], precision=options["precision"], tokens_per_char=options["tokens_per_char"],
                      max_tokens=options["max_tokens"])  # fmt: skip
    engine = loaded_engine(spec, device="cpu", torch_threads=options["threads"])
    loaded_mb = resident_mb()
    rows = []
    for batch in batches:
        # Every replica starts each batch size together, so they share the machine as a worker's replicas do.
        barrier.wait(timeout=900)
        seconds = options["batch1_seconds"] if batch == 1 else float("inf")
        rows.append({**run_batches(engine, pool, batch=batch, seconds=seconds, seed=11), "loaded_mb": loaded_mb})
    results.put(rows)


def measure_setting(
    threads: int, replicas: int, batches: list[int], pool: list[str], args: Any, *, precision: str = "fp32"
) -> dict[str, Any]:
    """Run ``replicas`` engine processes of ``threads`` torch threads side by side; return their summed rows."""
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold torch's thread pools
    barrier, results = context.Barrier(replicas), context.Queue()
    options = {"model": args.model, "threads": threads, "tokens_per_char": args.tokens_per_char,
               "max_tokens": args.max_tokens, "batch1_seconds": args.batch1_seconds,
               "precision": precision}  # fmt: skip
    processes = [
        context.Process(target=_replica, args=(options, pool[i::replicas], batches, barrier, results))
        for i in range(replicas)
    ]
    started = time.perf_counter()
    per_replica: list[list[dict[str, Any]]] = run_replicas(processes, results)
    rows = [combine(list(rows)) for rows in zip(*per_replica, strict=True)]
    return {"threads": threads, "replicas": replicas, "precision": precision, "rows": rows,
            "wall_s": time.perf_counter() - started}  # fmt: skip


def run_replicas(processes: list[Any], results: Any) -> list[Any]:
    """Start ``processes`` (each puts one result on ``results``), wait for every result and the processes' end;
    return the results. A process that exits without its result ends them all with a RuntimeError at once."""
    for process in processes:
        process.start()
    found: list[Any] = []
    while len(found) < len(processes):
        try:
            found.append(results.get(timeout=1))
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if failed:
                for process in processes:
                    process.terminate()
                raise RuntimeError(f"a replica exited with {failed[0]}") from None
    for process in processes:
        process.join()
    return found


def combine(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum one batch size's rows from replicas that ran side by side; rates divide by the longest one's time."""
    seconds = max(r["seconds"] for r in rows)
    total = {key: sum(r[key] for r in rows) for key in ("segments", "chars", "tokens", "audio_s", "loaded_mb")}
    stage_seconds = {stage: sum(r["stage_seconds"][stage] for r in rows) for stage in rows[0]["stage_seconds"]}
    busy = sum(r["seconds"] for r in rows)
    shares = {stage: s / busy for stage, s in stage_seconds.items()}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return {
        "batch": rows[0]["batch"],
        **total,
        "seconds": seconds,
        "chars_per_s": total["chars"] / seconds,
        "audio_s_per_s": total["audio_s"] / seconds,
        "tokens_per_s": total["tokens"] / seconds,
        # The Llama's decode steps alone (each replica's time): comparable with a plain Llama forward's tokens/s.
        "gpt_tokens_per_s": total["tokens"] / stage_seconds["gpt"] * len(rows) if stage_seconds["gpt"] else None,
        "shares": shares,
    }


def settings_to_try(cores: int) -> list[tuple[int, int]]:
    """Return the (torch threads, replicas) pairs that fill the machine's cores exactly, most threads first."""
    return [(t, cores // t) for t in range(cores, 0, -1) if cores % t == 0]


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def document(result: dict[str, Any]) -> str:
    """Return the markdown: the batch table of the first setting, then every setting side by side."""
    head, args = result["settings"][0], result["args"]
    lines = [
        f"## ChatTTS at real size on {os.cpu_count()} CPU cores ({MODEL}: random weights)",
        "",
        f"{args['pool']} segments of bench/corpus_zh.txt (mean {result['pool_mean_chars']:.1f} characters), "
        f"{args['tokens_per_char']:g} audio tokens per character (at least 24, at most {args['max_tokens']}), "
        f"length-sorted batches; batch 1 runs for {args['batch1_seconds']:g}s, larger batches the whole pool. "
        f"Model build: {result['build_s']:.0f}s (nothing to do when already built). "
        f"Whole run: {result['wall_s']:.0f}s.",
        "",
        f"### By batch size and precision ({head['threads']} torch threads, {head['replicas']} replica)",
        "",
        "| precision | batch | segments | chars/s | audio s/s | audio tokens/s | × fp32 | Llama decode-step tokens/s "
        "| GPT prompt pass | GPT decode steps | sampling | decoder | vocoder | other | resident MiB after load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fp32 = {row["batch"]: row["tokens_per_s"] for row in head["rows"]}
    for measured in result["precisions"]:
        for row in measured["rows"]:
            gpt_rate = "–" if row["gpt_tokens_per_s"] is None else f"{row['gpt_tokens_per_s']:.1f}"
            shares = " | ".join(_pct(row["shares"][stage]) for stage in STAGE_COLUMNS)
            ratio = f"{row['tokens_per_s'] / fp32[row['batch']]:.2f}×" if fp32.get(row["batch"]) else "–"
            lines.append(
                f"| {measured['precision']} | {row['batch']} | {row['segments']} "
                f"| {row['chars_per_s']:.2f} | {row['audio_s_per_s']:.2f} | {row['tokens_per_s']:.1f} | {ratio} "
                f"| {gpt_rate} | {shares} | {row['loaded_mb']:.0f} |"
            )
    lines += ["", "### Torch threads × replicas (the whole machine each time)", "",
              "| torch threads | replicas | batch per replica | chars/s | audio s/s | audio tokens/s |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for setting in result["settings"]:
        for row in setting["rows"]:
            if row["batch"] in result["settings_batches"]:
                lines.append(
                    f"| {setting['threads']} | {setting['replicas']} | {row['batch']} | {row['chars_per_s']:.2f} "
                    f"| {row['audio_s_per_s']:.2f} | {row['tokens_per_s']:.1f} |"
                )
    best = result["best"]
    lines += ["", f"Best here: {best['threads']} torch threads × {best['replicas']} replicas at batch "
              f"{best['batch']} per replica, {best['chars_per_s']:.2f} chars/s, {best['audio_s_per_s']:.2f} audio s/s "
              f"(TTS_TORCH_THREADS={best['threads']} TTS_MODEL_REPLICAS={best['replicas']} "
              f"TTS_BATCH_MAX_SIZE={best['batch']}).",
              "Stage shares are of engine time: the GPT prompt pass is the Llama's forward over the prompts, GPT "
              "decode steps its forwards of one token per item (their rate is the decode-step tokens/s, comparable "
              "with a plain Llama forward's), sampling the per-item sampler, decoder ChatTTS's Decoder, vocoder "
              "Vocos; other is the rest (tokenising, embeddings, the code heads, the loop's bookkeeping). int8 is "
              "the Llama's Linear layers in dynamic int8 (workers/engines/chattts_int8.py), the rest fp32; the "
              "settings table is fp32. Resident memory is the replicas' together, after loading and warming "
              "up."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure every batch size at the first setting, then the other settings, and write the tables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_real", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--batches", default="1,4,8,16,32")
    parser.add_argument("--settings-batches", default="1,16", help="batch sizes every threads × replicas setting runs")
    parser.add_argument("--pool", type=int, default=32, help="segments each batch size runs through")
    parser.add_argument("--tokens-per-char", type=float, default=6.0)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--batch1-seconds", type=float, default=30.0)
    parser.add_argument("--settings", default=None, help="threads×replicas pairs, e.g. 2x1,1x2 (default: fill cores)")
    parser.add_argument("--precisions", default="fp32,int8", help="precisions the batch table runs (fp32 first)")
    args = parser.parse_args(argv)
    if args.precisions.split(",")[0] != "fp32":
        parser.error("--precisions starts with fp32: the other precisions' rows are measured against it")
    started = time.perf_counter()
    cores = os.cpu_count() or 1
    pairs = (
        [(int(t), int(r)) for t, r in (p.split("x") for p in args.settings.split(","))]
        if args.settings
        else settings_to_try(cores)
    )
    build_s = ensure_full_model(model_spec(args.model))
    pool = segment_pool(read_corpus(), args.pool, language="zh", seed=7)
    batches = [int(b) for b in args.batches.split(",")]
    settings_batches = [int(b) for b in args.settings_batches.split(",")]
    settings = []
    precisions = []
    for n, (threads, replicas) in enumerate(pairs):
        wanted = batches if n == 0 else settings_batches
        # A replica has 1/replicas of the pool: a batch larger than its share would be its share.
        runnable = [b for b in wanted if b <= len(pool) // replicas]
        for precision in args.precisions.split(",") if n == 0 else ["fp32"]:
            print(f"{threads} torch threads × {replicas} replicas, {precision}: batches {runnable}", flush=True)
            measured = measure_setting(threads, replicas, runnable, pool, args, precision=precision)
            for row in measured["rows"]:
                print(f"  batch {row['batch']:>2}: {row['chars_per_s']:.2f} chars/s, {row['tokens_per_s']:.1f} "
                      "tokens/s", flush=True)  # fmt: skip
            if n == 0:
                precisions.append(measured)
            if precision == "fp32":
                settings.append(measured)
    candidates = [{**row, "threads": s["threads"], "replicas": s["replicas"]} for s in settings for row in s["rows"]]
    result = {
        "args": vars(args),
        "build_s": build_s,
        "pool_mean_chars": sum(map(len, pool)) / len(pool),
        "settings": settings,
        "precisions": precisions,
        "settings_batches": settings_batches,
        "best": max(candidates, key=lambda r: r["chars_per_s"]),
        "wall_s": time.perf_counter() - started,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_real.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    write_result("engine_real", document(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

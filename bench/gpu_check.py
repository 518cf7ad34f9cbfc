"""The one prepared GPU check: ChatTTS at its real sizes on a GPU, the engine alone and then served.

``make gpu-check`` on a CUDA machine (sized to finish within 8 minutes, model build included: 200 steps per
engine call, 30 s per service level), or rehearsed on a CPU with a small step count:
``make gpu-check BENCH_ARGS=--rehearse``.

1. Builds the full-size random-weight model (``make full-model``; nothing to do when it is complete).
2. The engine in fp32, fp16 and bf16 at batch 1, 16 and 64, every segment ``--steps`` audio tokens:
   RTF, tokens/s and peak GPU memory (bench/gpu_check_engine.py).
3. The service (devstack: Redis, one worker pinned to the device, the API) at 1, 16 and 64 closed-loop
   callers, ``--window`` seconds each: jobs/s, audio s/s, p50/p95 first audio and stalls
   (bench/gpu_check_service.py).
4. Writes one markdown table to bench/results/gpu_check.md (and the numbers to gpu_check.json) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.engine_limit import read_corpus, segment_pool
from bench.full_model import MODEL, ensure_full_model, model_spec
from bench.gpu_check_engine import EngineCell, NewLength, measure_new_lengths, measure_precision
from bench.gpu_check_service import ServiceLevel, models_file, run_levels, service_env
from bench.report import RESULTS, save_result, write_result

#: What ``--rehearse`` changes: the CPU, a small step count, batches and a precision it runs in minutes (on 2 cores
#: a batch of 64 prompts in fp16 takes minutes: torch's CPU half-precision matmul is 3-18x slower than fp32 here).
#: Its service levels are few and long enough that a real-size job (5 segments, about 10 s on 2 cores) finishes
#: inside them: at 20 s and 64 callers none did, and the table said nothing.
REHEARSAL = {"device": "cpu", "steps": 24, "batches": "1,4,16", "service_max_tokens": 24, "window": 60.0,
             "levels": "1,4", "service_precision": "fp32"}  # fmt: skip
#: The check itself, on a GPU.
GPU = {"device": "cuda:0", "steps": 200, "batches": "1,16,64", "window": 30.0, "levels": "1,16,64"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line; ``--rehearse`` fills in what was not given with the CPU rehearsal's values."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rehearse", action="store_true", help="run on the CPU with a small step count")
    parser.add_argument("--device", default=None, help="default cuda:0 (cpu when rehearsing)")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--batches", default=None, help="engine batch sizes (1,16,64)")
    parser.add_argument("--steps", type=int, default=None, help="audio tokens per segment in the engine part (200)")
    parser.add_argument("--new-lengths", default="97,131,173",
                        help="segment lengths (audio tokens) to time the decoder and vocoder at, twice")  # fmt: skip
    parser.add_argument("--levels", default=None, help="concurrent callers per service level (1,16,64)")
    parser.add_argument("--window", type=float, default=None, help="measured seconds per level (30)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--drain", type=float, default=30.0, help="longest wait for a level's jobs after its window")
    parser.add_argument("--service-max-tokens", type=int, default=None, help="cap each served segment's tokens")
    parser.add_argument("--service-precision", default=None, help="the served model's precision (the registry's)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch CPU threads (default: all cores)")
    parser.add_argument("--skip-service", action="store_true")
    parser.add_argument("--no-build", action="store_true", help="use --model as it is (the tiny model, say)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    preset = REHEARSAL if args.rehearse else GPU
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.torch_threads = args.torch_threads or os.cpu_count() or 1
    return args


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(cells: list[EngineCell], levels: list[ServiceLevel], precision: str = "registry's") -> list[str]:
    """Return the one table: an engine row per precision and batch size, then a service row per level."""
    lines = [
        "| part | precision (Llama ran in) | batch / callers | RTF | tokens/s | peak GPU MiB | jobs/s | audio s/s "
        "| first audio p50 / p95 s | stalled jobs | stall p95 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| engine | {c.precision} ({c.llama_dtype}) | {c.batch} | {c.rtf:.3f} | {c.tokens_per_s:.0f} "
            f"| {_f(c.peak_memory_mb, 0)} | – | {c.audio_s_per_s:.2f} | – | – | – |"
        )
    for lv in levels:
        stalled = "–" if lv.stalled_share is None else f"{100 * lv.stalled_share:.0f}%"
        errors = f" (errors {lv.errors})" if lv.errors else ""
        lines.append(
            f"| service | {precision} | {lv.callers} | – | – | – | {lv.jobs_per_s:.2f} ({lv.jobs_ok} jobs){errors} "
            f"| {lv.audio_s_per_s:.2f} | {_f(lv.first_audio_p50_s)} / {_f(lv.first_audio_p95_s)} | {stalled} "
            f"| {_f(lv.stall_p95_s)} |"
        )
    return lines


def new_length_table(probes: list[NewLength]) -> list[str]:
    """Return the decoder and vocoder's cost at segment lengths they had not seen, and again (none: nothing)."""
    if not probes:
        return []
    return [
        "",
        "Decoder and vocoder on one segment (the first precision's engine, after its cells): at a length it had "
        "not decoded before, then the same length again.",
        "",
        "| audio tokens | first s | again s |",
        "|---|---|---|",
        *[f"| {p.tokens} | {p.first_s:.3f} | {p.again_s:.3f} |" for p in probes],
    ]


def document(args: argparse.Namespace, device_words: str, timings: dict[str, float], cells: list[EngineCell],
             levels: list[ServiceLevel], *, service_error: str | None = None,
             new_lengths: list[NewLength] | None = None) -> str:  # fmt: skip
    """Return the markdown: what ran where, the table, and what each column means."""
    kind = "CPU REHEARSAL (small step count: the figures say nothing of a GPU)" if args.rehearse else "GPU check"
    size = "random weights, ChatTTS's real sizes" if args.model == MODEL else "not ChatTTS's real sizes"
    return "\n".join([
        f"## {kind}: {args.model} ({size}) on {args.device}, {device_words}",
        "",
        f"Engine: one timed call per cell ({'after' if args.device.startswith('cuda') else 'without'} an untimed "
        f"one of the same shapes), every segment {args.steps} audio tokens. Service: one worker, "
        f"one model host on {args.device}, precision {args.service_precision or 'as the registry says'}, "
        f"{args.window:g}s per level after "
        f"{args.warmup:g}s of warm-up, texts from bench/corpus_zh.txt"
        + (f", each segment capped at {args.service_max_tokens} tokens" if args.service_max_tokens else "")
        + f". Times: model build {timings['build']:.0f}s, engine {timings['engine']:.0f}s, "
        f"service {timings['service']:.0f}s, whole run {timings['total']:.0f}s.",
        "",
        *table(cells, levels, args.service_precision or "registry's"),
        *([] if service_error is None else ["", f"**The service part failed:** {service_error}"]),
        *new_length_table(new_lengths or []),
        "",
        "RTF: seconds per second of one segment's audio (below 1 is faster than real time). tokens/s: audio tokens "
        "made per second by the whole batch. Peak GPU MiB: torch's peak allocation during the call. Service "
        "throughput counts jobs finished inside the window; first audio is from submission to the first "
        "segment's audio in the caller's hands; a stalled job's listener waited at least once for the next segment.",
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Build the model, measure the engine and the service, and write the table."""
    args = parse_args(argv)
    from workers.engines.chattts_device import device_name, memory_budget, on_cuda

    if args.device.startswith("cuda") and not on_cuda(args.device):
        sys.exit(f"no CUDA device {args.device} here; `make gpu-check BENCH_ARGS=--rehearse` rehearses on the CPU")
    started = time.perf_counter()
    out = args.out / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    timings = {"build": 0.0 if args.no_build else ensure_full_model(model_spec(args.model))}
    budget = memory_budget(args.device)
    words = device_name(args.device) + (f", {budget.total_mb:.0f} MiB" if budget else "")
    print(f"gpu check on {args.device} ({words}); model build {timings['build']:.0f}s", flush=True)
    pool = segment_pool(read_corpus(), 64, language="zh", seed=7)
    batches = [int(b) for b in args.batches.split(",")]
    cells: list[EngineCell] = []
    new_lengths: list[NewLength] = []
    lengths = [int(n) for n in args.new_lengths.split(",") if n]

    def probe(engine: Any) -> None:
        new_lengths.extend(measure_new_lengths(engine, device=args.device, lengths=lengths))

    engine_started = time.perf_counter()
    for n, precision in enumerate(args.precisions.split(",")):
        cells += measure_precision(args.model, precision=precision, device=args.device, batches=batches,
                                   steps=args.steps, pool=pool, torch_threads=args.torch_threads,
                                   after=probe if n == 0 else None)  # fmt: skip
    timings["engine"] = time.perf_counter() - engine_started
    # The engine's figures are written whatever the service part does: a lease may not run the check twice.
    partial = {**timings, "service": 0.0, "total": 0.0}
    save_result("gpu_check", document(args, words, partial, cells, [], new_lengths=new_lengths))
    levels: list[ServiceLevel] = []
    service_error = None
    service_started = time.perf_counter()
    if not args.skip_service:
        try:
            levels = serve(args, out)
        except Exception as e:  # the table says the service part failed, and why; the logs are in ``out``
            service_error = f"{type(e).__name__}: {e}"
            print(f"service part failed: {service_error} (logs in {out})", file=sys.stderr, flush=True)
    timings["service"] = time.perf_counter() - service_started
    timings["total"] = time.perf_counter() - started
    record: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "device": words,
        "timings": timings,
        "engine": [c.record() for c in cells],
        "service": [lv.record() for lv in levels],
        "service_error": service_error,
        "new_lengths": [p.record() for p in new_lengths],
    }
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    write_result("gpu_check", document(args, words, timings, cells, levels, service_error=service_error,
                                       new_lengths=new_lengths))  # fmt: skip
    return 1 if service_error else 0


def serve(args: argparse.Namespace, out: Path) -> list[ServiceLevel]:
    """Run the service levels on the registry's model, its options capped as asked."""
    from bench.stack_args import corpus_texts

    options = {"max_tokens": args.service_max_tokens} if args.service_max_tokens else {}
    levels = [int(n) for n in args.levels.split(",")]
    models = models_file(out, args.model, options, precision=args.service_precision)
    env = service_env(model=args.model, device=args.device, models=models, max_batch=max(levels),
                      torch_threads=args.torch_threads)  # fmt: skip
    os.environ.update(env)  # this process plans the texts with the same registry and settings
    return run_levels(env, out, model=args.model, texts=corpus_texts(args.model), levels=levels,
                      window_s=args.window, warmup_s=args.warmup, drain_s=args.drain)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

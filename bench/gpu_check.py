"""The one prepared GPU check: ChatTTS at its real sizes on a GPU, the engine alone and then served.

``make gpu-check`` on a CUDA machine (sized to finish within 8 minutes, model build included: see ``GPU``), or
rehearsed on a CPU with a small step count: ``make gpu-check BENCH_ARGS=--rehearse``.

1. Builds the full-size random-weight model (``make full-model``; nothing to do when it is complete).
2. The engine in fp32, fp16 and bf16, eager (graphs off: today's loop) against CUDA graphs (on), at batch 1, 16
   and 64, every segment ``--steps`` audio tokens: ms a step, tokens/s, audio s/s, peak GPU memory, the graphs'
   capture time and the decode path each engine said serves (bench/gpu_check_engine.py); then the decoder and
   vocoder at segment lengths they have not seen.
3. The service (devstack: Redis, one worker pinned to the device with CUDA graphs at their default, ``auto``, and
   the API) at 1, 16 and 64 closed-loop callers, ``--window`` seconds each: jobs/s, audio s/s, first audio p50/p95
   (the first fragment) and the listeners who heard a gap (bench/gpu_check_service.py).
4. Writes its tables as it goes, after every engine cell and service level, to bench/results/gpu_check.md (the
   numbers to gpu_check.json in the run's folder) and docs/benchmarks/results/gpu_check.md, so that a run cut
   short still leaves every table it finished; prints them at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.engine_limit import read_corpus, segment_pool
from bench.full_model import MODEL, ensure_full_model, model_spec
from bench.gpu_check_engine import EngineCell, NewLength, measure_new_lengths, measure_precision
from bench.gpu_check_service import ServiceLevel, models_file, run_levels, served_path, service_env
from bench.report import RESULTS, save_result

#: What ``--rehearse`` changes: the CPU, a small step count, batches and a precision it runs in minutes (on 2 cores
#: a batch of 64 prompts in fp16 takes minutes: torch's CPU half-precision matmul is 3-18x slower than fp32 here).
#: Its service levels are few and long enough that a real-size job (5 segments, about 10 s on 2 cores) finishes
#: inside them: at 20 s and 64 callers none did, and the table said nothing.
REHEARSAL = {"device": "cpu", "steps": 24, "batches": "1,4,16", "service_max_tokens": 24, "window": 60.0,
             "drain": 30.0, "levels": "1,4", "service_precision": "fp32"}  # fmt: skip
#: The check itself, on a GPU, sized to fit one lease with the offline script's own stages (the published
#: gpu_check.md gives each part's seconds). Its engine part loads each precision twice (graphs off and on), so a
#: cell times speech-code generation only (the decoder and vocoder have their own probe) over as many steps as a
#: step's ms needs; the service's levels are as short as a first fragment's percentiles allow.
GPU = {"device": "cuda:0", "steps": 128, "batches": "1,16,64", "window": 20.0, "drain": 15.0, "levels": "1,16,64"}
#: The static cache's rows the engine is loaded with on a GPU (ChatTTSEngine's default, as the service runs it).
SERVED_ROWS = 64
#: Columns an engine cell's prompt may take before its tokens (the corpus's longest segment is about 70 tokens).
PROMPT_ROOM = 96


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
    parser.add_argument("--steps", type=int, default=None, help="audio tokens per segment in the engine part (128)")
    parser.add_argument("--graphs", default="off,on",
                        help="the engine's CUDA graph settings (off: eager, today's loop; on: graphs)")  # fmt: skip
    parser.add_argument("--new-lengths", default="97,131,173",
                        help="segment lengths (audio tokens) to time the decoder and vocoder at, twice")  # fmt: skip
    parser.add_argument("--levels", default=None, help="concurrent callers per service level (1,16,64)")
    parser.add_argument("--window", type=float, default=None, help="measured seconds per level (30)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--drain", type=float, default=None, help="longest wait for a level's jobs after its window")
    parser.add_argument("--service-max-tokens", type=int, default=None, help="cap each served segment's tokens")
    parser.add_argument("--service-precision", default=None, help="the served model's precision (the registry's)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch CPU threads (default: all cores)")
    parser.add_argument(
        "--service-graphs",
        default="auto",
        choices=("auto", "on", "off"),
        help="the service's TTS_CUDA_GRAPHS (auto, make run's default)",
    )
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


def engine_table(cells: list[EngineCell]) -> list[str]:
    """Return the engine's table: a row per precision, batch and graphs setting, eager first; "× eager" is a row's
    tokens/s over the eager row's of its precision and batch."""
    precisions = list(dict.fromkeys(c.precision for c in cells))
    modes = list(dict.fromkeys(c.graphs for c in cells))
    ordered = sorted(cells, key=lambda c: (precisions.index(c.precision), c.batch, modes.index(c.graphs)))
    eager = {(c.precision, c.batch): c.tokens_per_s for c in cells if c.graphs == "off"}
    lines = [
        "| precision (Llama ran in) | batch | graphs | ms a step | tokens/s | audio s/s | × eager | peak GPU MiB "
        "| capture s | decode path |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in ordered:
        base = eager.get((c.precision, c.batch))
        ratio = f"{c.tokens_per_s / base:.2f}×" if base else "–"
        lines.append(
            f"| {c.precision} ({c.llama_dtype}) | {c.batch} | {c.graphs} | {c.step_ms:.1f} | {c.tokens_per_s:,.0f} "
            f"| {c.audio_s_per_s:.2f} | {ratio} | {_f(c.peak_memory_mb, 0)} | {_f(c.capture_s)} | {c.decode_path} |"
        )
    return lines


def service_table(levels: list[ServiceLevel]) -> list[str]:
    """Return the service's table: a row per level of callers."""
    lines = [
        "| callers | jobs/s | audio s/s | first audio p50 / p95 s (first fragment) | listeners with a gap "
        "| gap p95 s | refusals (retried) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        gapped = "–" if lv.gap_share is None else f"{100 * lv.gap_share:.0f}%"
        errors = sum(lv.errors.values()) if lv.errors else 0
        lines.append(
            f"| {lv.callers} | {lv.jobs_per_s:.2f} ({lv.jobs_ok} jobs) | {lv.audio_s_per_s:.2f} "
            f"| {_f(lv.first_audio_p50_s)} / {_f(lv.first_audio_p95_s)} | {gapped} | {_f(lv.gap_p95_s)} "
            f"| {lv.refusals} | {errors} |"
        )
    return lines


def new_length_table(probes: list[NewLength]) -> list[str]:
    """Return the decoder and vocoder's cost at segment lengths they had not seen, and again (none: nothing)."""
    if not probes:
        return []
    return [
        "",
        "Decoder and vocoder on one segment (the first engine loaded, after its cells): at a length it had not "
        "decoded before, then the same length again.",
        "",
        "| audio tokens | first s | again s |",
        "|---|---|---|",
        *[f"| {p.tokens} | {p.first_s:.3f} | {p.again_s:.3f} |" for p in probes],
    ]


class Check:
    """What the check has found so far; ``save`` writes it whole, as each engine cell and service level ends."""

    def __init__(self, args: argparse.Namespace, device_words: str, out: Path,
                 save: Callable[[str, str], Any] = save_result) -> None:  # fmt: skip
        self.args, self.device_words, self.out, self.write = args, device_words, out, save
        self.started = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.running: dict[str, float] = {}  # the parts under way: when each began
        self.cells: list[EngineCell] = []
        self.new_lengths: list[NewLength] = []
        self.engine_errors: list[str] = []
        self.levels: list[ServiceLevel] = []
        self.service_error: str | None = None
        self.service_path: str | None = None
        self.finished = False

    def begin(self, part: str) -> None:
        """Start timing ``part`` (build, engine, service)."""
        self.running[part] = time.perf_counter()

    def end(self, part: str) -> None:
        """Stop timing ``part``."""
        self.timings[part] = time.perf_counter() - self.running.pop(part)

    def cell(self, cell: EngineCell) -> None:
        """Keep an engine cell and write everything out."""
        self.cells.append(cell)
        self.save()

    def level(self, level: ServiceLevel) -> None:
        """Keep a service level and write everything out."""
        self.levels.append(level)
        self.save()

    def times(self) -> dict[str, float]:
        """Return each part's seconds, those under way so far, and the whole run's."""
        now = time.perf_counter()
        return {**self.timings, **{p: now - began for p, began in self.running.items()}, "total": now - self.started}

    def record(self) -> dict[str, Any]:
        """Return everything as JSON values."""
        return {
            "args": {k: str(v) for k, v in vars(self.args).items()},
            "device": self.device_words,
            "finished": self.finished,
            "timings": self.times(),
            "engine": [c.record() for c in self.cells],
            "engine_errors": self.engine_errors,
            "new_lengths": [p.record() for p in self.new_lengths],
            "service": [lv.record() for lv in self.levels],
            "service_error": self.service_error,
            "service_path": self.service_path,
        }

    def save(self) -> str:
        """Write the markdown (bench/results and the published copy) and the JSON as they stand; return the markdown."""
        markdown = document(self)
        self.write("gpu_check", markdown)
        (self.out / "gpu_check.json").write_text(json.dumps(self.record(), indent=1), encoding="utf-8")
        return markdown


def progress(check: Check) -> list[str]:
    """Return, while the run goes on, how far it got: what a run cut short says of itself."""
    if check.finished:
        return []
    args = check.args
    cells = len(args.precisions.split(",")) * len(args.graphs.split(",")) * len(args.batches.split(","))
    levels = 0 if args.skip_service else len(args.levels.split(","))
    return ["", f"*Written as the run goes: {len(check.cells)} of {cells} engine cells and {len(check.levels)} of "
            f"{levels} service levels so far (a run cut short ends here).*"]  # fmt: skip


def document(check: Check) -> str:
    """Return the markdown: what ran where, the engine's table, the service's, and what each column means."""
    args, timings = check.args, check.times()
    kind = "CPU REHEARSAL (small step count: the figures say nothing of a GPU)" if args.rehearse else "GPU check"
    size = "random weights, ChatTTS's real sizes" if args.model == MODEL else "not ChatTTS's real sizes"
    parts = ", ".join(f"{name} {timings[name]:.0f}s" for name in ("build", "engine", "service") if name in timings)
    service: list[str] = []
    if not args.skip_service:
        served = f" The worker said its decode step ran as: {check.service_path}." if check.service_path else ""
        service = [
            "",
            f"### The service on {args.device} (CUDA graphs at their default, auto)",
            "",
            f"One worker, one model host, precision {args.service_precision or 'as the registry says'}, "
            f"{args.window:g}s per level after {args.warmup:g}s of warm-up, texts from bench/corpus_zh.txt"
            + (f", each segment capped at {args.service_max_tokens} tokens" if args.service_max_tokens else "")
            + f".{served}",
            "",
            *(service_table(check.levels) if check.levels else ["No level has finished yet."]),
            *([] if check.service_error is None else ["", f"**The service part failed:** {check.service_error}"]),
        ]
    return "\n".join([
        f"## {kind}: {args.model} ({size}) on {args.device}, {check.device_words}",
        "",
        f"Times: {parts}, whole run {timings['total']:.0f}s.",
        *progress(check),
        "",
        f"### The engine: eager against CUDA graphs, every segment {args.steps} audio tokens",
        "",
        f"One timed speech-code generation per cell ({'after' if args.device.startswith('cuda') else 'without'} an "
        "untimed one of the same shapes); graphs off is today's loop, on the static cache and its graphs (on a CPU "
        "its step runs eagerly).",
        "",
        *(engine_table(check.cells) if check.cells else ["No cell has finished yet."]),
        *[f"\n**An engine load failed:** {error}" for error in check.engine_errors],
        *new_length_table(check.new_lengths),
        *service,
        "",
        "ms a step: the generation's seconds ÷ its steps (the prompt pass included). tokens/s: audio tokens made per "
        "second by the whole batch; audio s/s: tokens/s × 512 samples ÷ 24,000 a second. × eager: tokens/s over the "
        "graphs-off row's at the same precision and batch. Peak GPU MiB: torch's peak allocation during the call, "
        "the weights and the static cache included. Capture s: what the load spent making the static cache, "
        "capturing each batch bucket's graph and checking it against the eager step. Decode path: what the engine "
        "said serves (a graph that failed or differed leaves the eager step, and says why). Service throughput "
        "counts jobs finished inside the window; first audio is from submission to the first fragment in the "
        "listener's hands; a listener with a gap, playing from the first fragment, waited over 0.1 s for a later "
        "one at least once.",
    ]) + "\n"  # fmt: skip


def run_engine(check: Check, pool: list[str]) -> None:
    """Measure every precision with each graphs setting, saving as each cell ends; a load that fails is noted."""
    args = check.args
    from workers.engines.chattts_device import on_cuda
    from workers.engines.static_step import WIDTH_STEP

    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.new_lengths.split(",") if n]
    # The rows a GPU serves with; on a CPU the largest batch (its eager step reads only the rows in use, and 64 rows
    # of the full model's cache in fp32 are 6 GB of memory).
    rows = max(SERVED_ROWS, *batches) if on_cuda(args.device) else max(batches)

    def probe(engine: Any) -> None:
        check.new_lengths.extend(measure_new_lengths(engine, device=args.device, lengths=lengths))
        check.save()

    # The columns the cells need (a prompt of at most about 70 tokens, then ``steps``), in the engine's steps of
    # WIDTH_STEP: fewer width buckets to capture than the service's 768 positions, at the widths the cells reach.
    positions = WIDTH_STEP * math.ceil((args.steps + 1 + PROMPT_ROOM) / WIDTH_STEP)
    # Every eager load first: a graph fault that broke the CUDA context would otherwise lose the eager rows too.
    loads = [(graphs, precision) for graphs in args.graphs.split(",") for precision in args.precisions.split(",")]
    for n, (graphs, precision) in enumerate(loads):
        try:
            measure_precision(args.model, precision=precision, device=args.device, batches=batches,
                              steps=args.steps, pool=pool, torch_threads=args.torch_threads, graphs=graphs,
                              static_rows=rows, static_positions=positions, done=check.cell,
                              after=probe if n == 0 and lengths else None)  # fmt: skip
        except Exception as e:  # the rest still run: one lease, one run
            check.engine_errors.append(f"{precision}, graphs {graphs}: {type(e).__name__}: {e}")
            print(f"engine part failed: {check.engine_errors[-1]}", file=sys.stderr, flush=True)
            check.save()


def main(argv: list[str] | None = None) -> int:
    """Build the model, measure the engine and the service, writing the tables as they fill."""
    args = parse_args(argv)
    from workers.engines.chattts_device import device_name, memory_budget, on_cuda

    if args.device.startswith("cuda") and not on_cuda(args.device):
        sys.exit(f"no CUDA device {args.device} here; `make gpu-check BENCH_ARGS=--rehearse` rehearses on the CPU")
    out = args.out / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    budget = memory_budget(args.device)
    check = Check(args, device_name(args.device) + (f", {budget.total_mb:.0f} MiB" if budget else ""), out)
    check.begin("build")
    if not args.no_build:
        ensure_full_model(model_spec(args.model))
    check.end("build")
    print(f"gpu check on {args.device} ({check.device_words}); model build {check.timings['build']:.0f}s", flush=True)
    check.begin("engine")
    run_engine(check, segment_pool(read_corpus(), 64, language="zh", seed=7))
    check.end("engine")
    check.save()  # the engine's figures are written whatever the service part does: a lease may not run it twice
    if not args.skip_service:
        check.begin("service")
        try:
            serve(check)
        except Exception as e:  # the table says the service part failed, and why; the logs are in ``out``
            check.service_error = f"{type(e).__name__}: {e}"
            print(f"service part failed: {check.service_error} (logs in {out})", file=sys.stderr, flush=True)
        check.end("service")
    check.finished = True
    print(check.save())
    print(f"(written to bench/results/gpu_check.md, published, and {out / 'gpu_check.json'})")
    return 1 if check.service_error or check.engine_errors else 0


def serve(check: Check) -> None:
    """Run the service levels on the registry's model, its options capped as asked, graphs at their default."""
    from bench.stack_args import corpus_texts

    args, out = check.args, check.out
    options = {"max_tokens": args.service_max_tokens} if args.service_max_tokens else {}
    levels = [int(n) for n in args.levels.split(",")]
    models = models_file(out, args.model, options, precision=args.service_precision)
    env = service_env(model=args.model, device=args.device, models=models, max_batch=max(levels),
                      torch_threads=args.torch_threads, graphs=args.service_graphs)  # fmt: skip
    os.environ.update(env)  # this process plans the texts with the same registry and settings

    def level(found: ServiceLevel) -> None:
        check.service_path = served_path(out / "worker.log")
        check.level(found)

    try:
        run_levels(env, out, model=args.model, texts=corpus_texts(args.model), levels=levels, window_s=args.window,
                   warmup_s=args.warmup, drain_s=args.drain, done=level)  # fmt: skip
    finally:
        check.service_path = served_path(out / "worker.log") or check.service_path


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark batching and the model pool in-process: the worker's own Batcher and ModelPool, tiny ChatTTS, CPU.

Run with ``python -m bench.batch`` (``make bench-batch``); the table goes to ``bench/results/batch.md``.
Part 1: 16 callers, each a different job, submit segments in a closed loop through a Batcher of max_batch 16
("on") and of max_batch 1 ("off"), in alternating rounds on the same model host. Part 2: load a second
model, evict it, load it again; time each step and total the resident memory of this process and every host.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.report import machine_header, median, write_result
from bench.texts import STORY
from bench.threads import in_threads
from bench.tiny_model import TORCH_THREADS, ensure_tiny_model
from core.registry import ModelSpec, load_registry
from core.settings import load_settings
from core.text import split_sentences
from workers.batcher import Batcher
from workers.engines.base import SynthesisRequest
from workers.pool.handle import ModelHost
from workers.pool.pool import ModelPool

CALLERS = 16
PER_CALLER = 2  # segments each caller submits per round
PAIRS = 3  # rounds of (on, off), in alternating order
SHORTEST, LONGEST = 8, 70


def corpus() -> list[str]:
    """Return the story's sentences of 8–70 characters, in story order (mixed lengths)."""
    sentences = split_sentences(STORY.read_text(encoding="utf-8"))
    return [s for s in sentences if SHORTEST <= len(s) <= LONGEST]


@dataclass
class Round:
    """What one round of closed-loop callers did."""

    batching: bool
    segments: int
    audio_s: float
    wall_s: float
    mean_batch: float
    max_batch: int

    @property
    def throughput(self) -> float:
        """Return audio seconds made per wall second."""
        return self.audio_s / self.wall_s


def run_round(
    pool: ModelPool, spec: ModelSpec, texts: list[str], *, batching: bool, pair: int, per_caller: int = PER_CALLER
) -> Round:
    """Let CALLERS threads each synthesise ``per_caller`` segments, one after another, through a fresh batcher."""
    settings = load_settings()
    sizes: list[int] = []
    lock = threading.Lock()

    def observe(_model: str, size: int, *_: object) -> None:
        with lock:
            sizes.append(size)

    batcher = Batcher(
        pool.synthesize,
        max_batch=settings.batch_max_size if batching else 1,
        max_wait_s=settings.batch_wait_ms / 1000,
        max_ratio=settings.batch_max_ratio,
        observe=observe,
    )

    def caller(i: int) -> float:
        audio = 0.0
        for k in range(per_caller):
            text = texts[((pair * CALLERS + i) * per_caller + k) % len(texts)]
            request = SynthesisRequest(text=text, voice="default", seed=100 * i + k)
            wave, rate = batcher.submit(spec, request).result(timeout=300)
            audio += len(wave) / rate
        return audio

    started = time.perf_counter()
    audio = in_threads(CALLERS, caller)
    wall = time.perf_counter() - started
    batcher.close()
    return Round(batching, CALLERS * per_caller, sum(audio), wall, batcher.mean_batch_size(), max(sizes))


def throughput(pool: ModelPool, spec: ModelSpec) -> list[str]:
    """Alternate batching on and off (on-off, off-on, …) and tabulate each round and the medians."""
    texts = corpus()
    run_round(pool, spec, texts, batching=True, pair=PAIRS, per_caller=1)  # warm-up, not counted
    rounds: list[tuple[int, Round]] = []
    for pair in range(PAIRS):
        for batching in (True, False) if pair % 2 == 0 else (False, True):
            result = run_round(pool, spec, texts, batching=batching, pair=pair)
            rounds.append((pair, result))
            print(
                f"  pair {pair + 1} batching {'on ' if batching else 'off'}: {result.throughput:.2f} audio s/s, "
                f"mean batch {result.mean_batch:.2f}",
                flush=True,
            )
    on = [r for _, r in rounds if r.batching]
    off = [r for _, r in rounds if not r.batching]
    ratio = median([r.throughput for r in on]) / median([r.throughput for r in off])
    mean_batch = sum(r.segments for r in on) / sum(r.segments / r.mean_batch for r in on)
    lengths = [len(t) for t in texts]
    return [
        f"### Throughput at {CALLERS} concurrent segments from different jobs",
        "",
        f"{CALLERS} caller threads, each its own seed, {PER_CALLER} segments each per round in a closed loop; "
        f"{len(texts)} sentences of {min(lengths)}–{max(lengths)} characters (mean {sum(lengths) / len(lengths):.0f}), "
        "fixed token budgets (6 per character). Rounds alternate so drift in the machine's load cancels.",
        "",
        "| round | batching | segments | audio s | wall s | audio s / wall s | mean batch | largest batch |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {pair + 1} | {'on (max 16)' if r.batching else 'off (max 1)'} | {r.segments} | {r.audio_s:.1f} "
            f"| {r.wall_s:.2f} | {r.throughput:.2f} | {r.mean_batch:.2f} | {r.max_batch} |"
            for pair, r in rounds
        ),
        "",
        f"- median audio s / wall s: on **{median([r.throughput for r in on]):.2f}**, "
        f"off **{median([r.throughput for r in off]):.2f}**, ratio **{ratio:.2f}×** (target ≥ 2.5×)",
        f"- mean batch size with batching on: **{mean_batch:.2f}** (target ≥ 4)",
        "",
    ]


def resident_mb(pid: int) -> float:
    """Return a process's resident memory in MiB from /proc (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def total_mb(pool: ModelPool) -> tuple[float, float]:
    """Return this process's resident MiB and that plus every loaded host's."""
    own = resident_mb(os.getpid())
    return own, own + sum(resident_mb(m["pid"]) for m in pool.loaded() if m["pid"])


def wait_gone(pid: int, timeout: float = 30) -> None:
    """Wait until a process has ended (or is a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise TimeoutError(f"process {pid} still running {timeout}s after its model was unloaded")


def pool_cycle(pool: ModelPool, spec: ModelSpec) -> list[str]:
    """Load a second model, evict it, load it again; time each step and total memory around them."""
    other = replace(spec, name=f"{spec.name}-b")
    request = [SynthesisRequest(text="灯塔的光穿过了雾。", voice="default", seed=1)]
    rows = []

    def snapshot(step: str, seconds: str = "–", load_s: str = "–") -> float:
        own, total = total_mb(pool)
        rows.append(f"| {step} | {seconds} | {load_s} | {', '.join(m['model'] for m in pool.loaded())} "
                    f"| {own:.0f} | {total:.0f} |")  # fmt: skip
        return total

    before = snapshot(f"{spec.name} loaded (before loading B)")
    started = time.perf_counter()
    pool.synthesize(other, request)
    snapshot("load B, first batch", f"{time.perf_counter() - started:.2f}", f"{pool.load_seconds[-1]:.2f}")
    pid = pool.host_pid(other.name)
    started = time.perf_counter()
    pool.unload(other.name)
    evict_s = time.perf_counter() - started
    if pid is not None:
        wait_gone(pid)
    after = snapshot("evict B (pool.unload: the host process ends)", f"{evict_s:.2f}")
    started = time.perf_counter()
    pool.synthesize(other, request)
    snapshot("reload B, first batch", f"{time.perf_counter() - started:.2f}", f"{pool.load_seconds[-1]:.2f}")
    return [
        "### Model pool: load, evict, reload (B is a second copy of the tiny ChatTTS under its own name)",
        "",
        "Memory is resident memory from /proc: this process (the worker's side: pool and batcher) plus every "
        "model host process. `host load` is spawn → engine loaded and warmed up, as the host reports it.",
        "",
        "| step | wall s | host load s | loaded | this process MiB | total MiB |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"- memory after evicting B: **{after:.0f} MiB** vs {before:.0f} MiB before loading it: "
        f"**{after / before - 1:+.1%}** (target within ±10%)",
        "",
    ]


def main() -> None:
    """Run the throughput rounds and the pool cycle on one pool and write the table."""
    started = time.perf_counter()
    model_dir = ensure_tiny_model()
    settings = load_settings(tiny_model_dir=Path(model_dir))
    spec = load_registry(settings).get("chattts-tiny")
    pool = ModelPool(
        lambda s, _replica: ModelHost(s, device="cpu", log_level="WARNING", torch_threads=TORCH_THREADS),
        budget_mb=settings.model_budget_mb,
        idle_s=3600,
        call_timeout_s=600,
    )
    try:
        started_load = time.perf_counter()
        pool.synthesize(spec, [SynthesisRequest(text="预热。", voice="default")])
        print(f"loaded {spec.name} in {time.perf_counter() - started_load:.1f}s; throughput rounds …", flush=True)
        lines = throughput(pool, spec)
        print("model pool cycle …", flush=True)
        lines += pool_cycle(pool, spec)
    finally:
        pool.close()
    title = "bench-batch: batching and the model pool, in-process (tiny ChatTTS, CPU)"
    write_result("batch", "\n".join(machine_header(title, started, TORCH_THREADS) + lines))


if __name__ == "__main__":
    main()

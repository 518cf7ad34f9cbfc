"""The GPU check's engine part: the real-size model in one precision, graphs on or off, at a few batch sizes.

Each cell is one timed speech-code generation (on a GPU after an untimed one of the same shapes): the Llama, its
heads and the per-item sampler over a batch whose every segment runs exactly ``steps`` tokens; no decoder or
vocoder (``measure_new_lengths`` times those). So tokens/s is batch × steps ÷ seconds, a step is the seconds ÷
steps (the prompt pass included), and audio s/s is tokens/s × 512 samples a token ÷ 24,000 a second. Graphs
``off`` is today's loop (the growing key/value cache, each kernel launched from Python); ``on`` is the static
cache with each batch bucket's step replayed from a CUDA graph (on a CPU, the same step run eagerly). The capture
time is what the engine's load spent preparing that (its ``step_prepare_s``: the cache, every bucket's capture
and probe against the eager step, and the check against the growing loop). Peak memory is torch's own count on
the device (none on the CPU), from the call's start: the weights and the static cache are in it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from bench.full_model import model_spec

T = TypeVar("T")


@dataclass(frozen=True)
class EngineCell:
    """One precision, graphs on or off, at one batch size."""

    precision: str
    #: What the Llama ran in: a CPU without a half-precision matmul falls back to fp32.
    llama_dtype: str
    #: The engine's ``set_graphs``: "off" (today's loop) or "on".
    graphs: str
    #: What the engine said serves a decode step: a capture that failed or differed shows here as an eager step.
    decode_path: str
    batch: int
    steps: int
    seconds: float
    step_ms: float
    tokens_per_s: float
    audio_s_per_s: float
    peak_memory_mb: float | None
    #: The seconds the load spent preparing the static step and its graphs (None: graphs off).
    capture_s: float | None

    def record(self) -> dict[str, Any]:
        """Return the cell as JSON values."""
        return asdict(self)


@dataclass(frozen=True)
class NewLength:
    """ChatTTS's decoder and vocoder on one segment of a length not decoded before, then at once again."""

    tokens: int
    first_s: float
    again_s: float

    def record(self) -> dict[str, Any]:
        """Return the probe as JSON values."""
        return asdict(self)


def timed(device: str, work: Callable[[], T]) -> tuple[T, float]:
    """Run ``work`` from an idle ``device`` until the device is idle again; return its result and the seconds."""
    from workers.engines.chattts_device import synchronize

    synchronize(device)
    started = time.perf_counter()
    result = work()
    synchronize(device)
    return result, time.perf_counter() - started


def measure_new_lengths(engine: Any, *, device: str, lengths: list[int]) -> list[NewLength]:
    """Time the decoder and vocoder on one segment's hidden states at each of ``lengths`` audio tokens, twice.

    The service decodes every segment at its own length; a GPU library that prepares its work per input shape
    pays for that the first time a length comes, which the engine cells (every segment one length, after an
    untimed call) never show. The first GPU run's service made one segment of 108 tokens in 9.6 s where the
    engine made 200 in 3-4 s: this tells whether new lengths are where that time went.
    """
    import torch

    chat = engine.chat

    def decode(hidden: torch.Tensor) -> Any:
        return chat._decode_to_wavs([hidden.clone()], True)  # it deletes what it is given

    found = []
    with torch.inference_mode():
        for tokens in lengths:
            hidden = torch.randn(tokens, chat.config.gpt.hidden_size, device=torch.device(device))
            seconds = [timed(device, functools.partial(decode, hidden))[1] for _ in range(2)]
            found.append(NewLength(tokens=tokens, first_s=seconds[0], again_s=seconds[1]))
            print(f"  decoder + vocoder at {tokens} new tokens: {seconds[0]:.3f}s, again {seconds[1]:.3f}s", flush=True)
    return found


def pick_texts(pool: list[str], batch: int) -> list[str]:
    """Return ``batch`` segments spread evenly over the pool's lengths (the whole pool, cycled, if it is smaller)."""
    ordered = sorted(pool, key=len)
    step = len(ordered) / batch
    return [ordered[int(i * step) % len(ordered)] for i in range(batch)]


def load_engine(spec: Any, *, device: str, graphs: str, torch_threads: int, warm: bool) -> tuple[Any, float]:
    """Build and load ``spec``'s engine on ``device`` with graphs ``graphs``; return it and its capture seconds.

    Unless every cell is warmed by an untimed call of its own (``warm``), the engine's own warm-up runs first.
    """
    import torch

    from workers.engines.factory import build_engine

    if torch_threads:
        torch.set_num_threads(torch_threads)
    engine = build_engine(spec, device=device)
    engine.set_graphs(graphs)
    engine.load()
    if not warm:
        engine.warmup()
    return engine, engine.step_prepare_s


def measure_precision(
    model: str,
    *,
    precision: str,
    device: str,
    batches: list[int],
    steps: int,
    pool: list[str],
    torch_threads: int = 0,
    graphs: str = "off",
    static_rows: int | None = None,
    static_positions: int | None = None,
    warm: bool | None = None,
    after: Callable[[Any], None] | None = None,
    done: Callable[[EngineCell], None] | None = None,
) -> list[EngineCell]:
    """Load ``model`` in ``precision`` on ``device`` with graphs ``graphs`` and time one generation per batch size,
    each segment ``steps`` tokens.

    ``static_rows`` and ``static_positions`` size the static cache (default: the engine's); ``warm`` (default: on
    a GPU) runs each cell's call once untimed first; ``done`` is told each cell as it is measured; ``after`` is
    given the loaded engine once the cells are done.
    """
    from workers.engines.base import SynthesisRequest
    from workers.engines.chattts_device import on_cuda, peak_memory_mb, reset_peak_memory
    from workers.engines.fragments import SAMPLES_PER_TOKEN

    warm = on_cuda(device) if warm is None else warm
    # A token budget of exactly ``steps`` for every text: more tokens per character than any text needs, capped.
    spec = model_spec(model, precision=precision, tokens_per_char=float(10 * steps), max_tokens=steps,
                      fixed_token_budget=True, static_rows=static_rows, static_positions=static_positions)  # fmt: skip
    engine, capture_s = load_engine(spec, device=device, graphs=graphs, torch_threads=torch_threads, warm=warm)
    cells = []
    try:
        dtype = str(engine.llama_dtype).removeprefix("torch.")
        for batch in batches:
            requests = [SynthesisRequest(text=t, seed=i) for i, t in enumerate(pick_texts(pool, batch))]
            tokens = sum(engine.token_budget(r.text) for r in requests)
            if warm:
                # The first call at new shapes pays one-off costs (the allocator's first blocks, kernel choice)
                # that serving never pays again. On the CPU none showed (measured), and it would double the time.
                engine.hidden_states(requests)
            static = engine.static_step
            outgrown = static.outgrown if static is not None else 0
            reset_peak_memory(device)
            _, seconds = timed(device, functools.partial(engine.hidden_states, requests))
            outgrown = (static.outgrown if static is not None else 0) - outgrown
            # A call that outgrew the static cache ran on the growing loop: the row would not measure the graphs.
            path = engine.decode_path + (" (this call outgrew it: the growing loop ran)" if outgrown else "")
            cell = EngineCell(
                precision=precision,
                llama_dtype=dtype,
                graphs=graphs,
                decode_path=path,
                batch=batch,
                steps=tokens // batch,
                seconds=seconds,
                step_ms=1000 * seconds / (tokens // batch),
                tokens_per_s=tokens / seconds,
                audio_s_per_s=tokens * SAMPLES_PER_TOKEN / engine.sample_rate / seconds,
                peak_memory_mb=peak_memory_mb(device),
                capture_s=None if graphs == "off" else capture_s,
            )
            cells.append(cell)
            print(f"  {precision} graphs {graphs} batch {batch:>2}: {seconds:.2f}s, {cell.step_ms:.1f} ms a step, "
                  f"{cell.tokens_per_s:.0f} tokens/s ({engine.decode_path})", flush=True)  # fmt: skip
            if done is not None:
                done(cell)
        if after is not None:
            after(engine)
    finally:
        engine.unload()
    return cells

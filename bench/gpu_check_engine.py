"""The GPU check's engine part: the real-size model in one precision at a few batch sizes, a fixed step count each.

Each cell is one timed call (on a GPU after an untimed one of the same shapes): every segment runs ``steps`` tokens,
so tokens/s is batch × steps ÷ seconds and RTF is seconds ÷ one segment's audio (what a listener waits per
second of speech). Peak memory is torch's own count on the device (none on the CPU).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from bench.full_model import loaded_engine, model_spec

T = TypeVar("T")


@dataclass(frozen=True)
class EngineCell:
    """One precision at one batch size."""

    precision: str
    #: What the Llama ran in: a CPU without a half-precision matmul falls back to fp32.
    llama_dtype: str
    batch: int
    steps: int
    seconds: float
    tokens_per_s: float
    audio_s_per_s: float
    rtf: float
    peak_memory_mb: float | None

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


def measure_precision(
    model: str,
    *,
    precision: str,
    device: str,
    batches: list[int],
    steps: int,
    pool: list[str],
    torch_threads: int = 0,
    warm: bool | None = None,
    after: Callable[[Any], None] | None = None,
) -> list[EngineCell]:
    """Load ``model`` in ``precision`` on ``device`` and time one call per batch size, each segment ``steps`` tokens.

    ``warm`` (default: on a GPU) runs each cell's call once untimed first; ``after`` is given the loaded engine
    once the cells are done.
    """
    from workers.engines.base import SynthesisRequest
    from workers.engines.chattts_device import on_cuda, peak_memory_mb, reset_peak_memory

    warm = on_cuda(device) if warm is None else warm

    # A token budget of exactly ``steps`` for every text: more tokens per character than any text needs, capped.
    spec = model_spec(model, precision=precision, tokens_per_char=float(10 * steps), max_tokens=steps,
                      fixed_token_budget=True)  # fmt: skip
    engine = loaded_engine(spec, device=device, torch_threads=torch_threads)
    cells = []
    try:
        dtype = str(engine.llama_dtype).removeprefix("torch.")
        for batch in batches:
            requests = [SynthesisRequest(text=t, seed=i) for i, t in enumerate(pick_texts(pool, batch))]
            tokens = sum(engine.token_budget(r.text) for r in requests)
            if warm:
                # The first call at new shapes pays one-off costs (the allocator's first blocks, kernel choice)
                # that serving never pays again. On the CPU none showed (measured), and it would double the time.
                engine.synthesize(requests)
            reset_peak_memory(device)
            waves, seconds = timed(device, functools.partial(engine.synthesize, requests))
            audio = sum(len(w) for w in waves) / engine.sample_rate
            cell = EngineCell(
                precision=precision,
                llama_dtype=dtype,
                batch=batch,
                steps=tokens // batch,
                seconds=seconds,
                tokens_per_s=tokens / seconds,
                audio_s_per_s=audio / seconds,
                rtf=seconds / (audio / batch),
                peak_memory_mb=peak_memory_mb(device),
            )
            cells.append(cell)
            print(f"  {precision} batch {batch:>2}: {seconds:.2f}s, {tokens / seconds:.0f} tokens/s", flush=True)
        if after is not None:
            after(engine)
    finally:
        engine.unload()
    return cells

"""Where a ChatTTS synthesis spends its time: GPT decode, sampling, decoder and vocoder.

Each stage is timed by wrapping the real method that does it (a wrapper that calls through and adds up
the time), never by doing the stage's work a second way, so what is timed is what serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

from workers.engines.sampling import PerItemSampler

F = TypeVar("F", bound=Callable[..., Any])

#: Each stage and what it wraps. The rest of a call (prompt encoding, the heads, the loop's bookkeeping) is "other".
STAGES = {
    "prefill": "the Llama's forward pass (chat.gpt.gpt) over the prompts",
    "gpt": "the Llama's forward passes (chat.gpt.gpt) of the decode steps, one token per item each",
    "sampling": "the per-item sampler (PerItemSampler.sample): penalty, top-k/top-p, the draw",
    "decoder": "ChatTTS's Decoder (chat.decoder): hidden states to mel frames",
    "vocoder": "Vocos (chat._vocos_decode): mel frames to samples",
}


class StageClock:
    """Add up the seconds spent in each stage while installed on a loaded ChatTTS.

    ``sync`` waits for the device's queued work, so that on a GPU a stage is charged its own kernels
    (it costs overlap there; on the CPU it is a no-op).
    """

    def __init__(self, sync: Callable[[], None] = lambda: None) -> None:
        self.sync = sync
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.calls = dict.fromkeys(STAGES, 0)
        self._inside = False

    def wrap(self, stage: str | Callable[..., str], function: F) -> F:
        """Return ``function`` timed as ``stage``, or as what ``stage(*args, **kwargs)`` names for each call.

        A call made inside another timed call is not counted twice.
        """

        @wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return function(*args, **kwargs)
            name = stage if isinstance(stage, str) else stage(*args, **kwargs)
            self.sync()
            self._inside = True
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1
                self._inside = False

        return timed  # type: ignore[return-value]

    def shares(self, total_s: float) -> dict[str, float]:
        """Return each stage's share of ``total_s`` and the rest as "other"."""
        shares = {stage: seconds / total_s for stage, seconds in self.seconds.items()} if total_s else {}
        if shares:
            shares["other"] = max(0.0, 1.0 - sum(shares.values()))
        return shares

    def reset(self) -> None:
        """Start counting from zero."""
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.calls = dict.fromkeys(STAGES, 0)

    @contextmanager
    def installed(self, chat: Any) -> Iterator[StageClock]:
        """Time ``chat``'s stages until the block ends, then put its own methods back."""
        instance_methods: list[tuple[Any, str, str | Callable[..., str]]] = [
            (chat.gpt.gpt, "forward", _llama_pass),
            (chat.decoder, "forward", "decoder"),
            (chat, "_vocos_decode", "vocoder"),
        ]
        for owner, name, stage in instance_methods:
            # An instance attribute shadows the class's method; deleting it afterwards restores that.
            setattr(owner, name, self.wrap(stage, getattr(owner, name)))
        sample = PerItemSampler.sample
        PerItemSampler.sample = self.wrap("sampling", sample)  # type: ignore[method-assign]
        try:
            yield self
        finally:
            PerItemSampler.sample = sample  # type: ignore[method-assign]
            for owner, name, _ in instance_methods:
                delattr(owner, name)


def _llama_pass(*args: Any, inputs_embeds: Any = None, **kwargs: Any) -> str:
    """Name a Llama call: the prompt pass sees many positions per item, a decode step one."""
    return "prefill" if inputs_embeds is not None and inputs_embeds.size(1) > 1 else "gpt"

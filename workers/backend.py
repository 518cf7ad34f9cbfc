"""The worker's synthesis backend: segments go through the batcher to the model pool."""

from __future__ import annotations

from typing import Protocol

from core.registry import ModelSpec
from workers.batcher import Batcher
from workers.engines.base import SegmentFragment, SynthesisRequest, Waveform
from workers.planner import Due, Early
from workers.pool.pool import ModelPool


class SynthesisBackend(Protocol):
    """Anything that turns a segment request into a waveform for a model."""

    def synthesize(
        self,
        spec: ModelSpec,
        request: SynthesisRequest,
        *,
        deadline: Due | None = None,
        early: Early = False,
        fragment: SegmentFragment | None = None,
    ) -> tuple[Waveform, int]:
        """Return the waveform and its sample rate; ``deadline``, ``early``: when it is needed (see Batcher);
        ``fragment`` is told its fragments and their rate as they are made (joined, they are the waveform)."""
        ...

    def loaded_models(self) -> list[str]:
        """Return the names of the models held in memory."""
        ...

    def close(self) -> None:
        """Unload every model."""
        ...


class PooledBackend:
    """Batch concurrent segments per model and run them on the model's host process."""

    def __init__(self, *, batcher: Batcher, pool: ModelPool, timeout_s: float) -> None:
        self.batcher = batcher
        self.pool = pool
        self.timeout_s = timeout_s

    def synthesize(
        self,
        spec: ModelSpec,
        request: SynthesisRequest,
        *,
        deadline: Due | None = None,
        early: Early = False,
        fragment: SegmentFragment | None = None,
    ) -> tuple[Waveform, int]:
        """Wait for this segment's share of a batched engine call; give up after one hung call ahead plus its own."""
        future = self.batcher.submit(spec, request, deadline=deadline, early=early, fragment=fragment)
        try:
            return future.result(timeout=2 * self.timeout_s)
        except TimeoutError:
            future.cancel()  # nobody waits for it now: the batcher drops it instead of running it
            raise

    def loaded_models(self) -> list[str]:
        """Return the names of the models whose hosts are running."""
        return sorted({m["model"] for m in self.pool.loaded()})

    def close(self) -> None:
        """Stop the batcher and every model host."""
        self.batcher.close()
        self.pool.close()

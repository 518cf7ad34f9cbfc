"""Build the engine a registry entry names; heavy imports happen only when needed."""

from __future__ import annotations

from core.registry import ModelSpec
from workers.engines.base import Engine


def resolve_device(device: str) -> str:
    """Turn 'auto' into 'cuda:0' when a GPU is visible, else 'cpu'."""
    if device != "auto":
        return device
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def build_engine(spec: ModelSpec, *, device: str) -> Engine:
    """Return an unloaded engine for ``spec`` on ``device``."""
    if spec.engine == "espeak":
        from workers.engines.espeak import EspeakEngine

        return EspeakEngine(voices=dict(spec.voices), **spec.options)
    if spec.engine == "faulty":
        from workers.engines.faulty import FaultyEngine

        return FaultyEngine(voices=dict(spec.voices), **spec.options)
    if spec.engine == "chattts":
        from workers.engines.chattts import ChatTTSEngine

        if spec.weights is None:
            raise ValueError(f"model {spec.name!r} has no weights directory")
        return ChatTTSEngine(
            weights_dir=spec.weights,
            device=resolve_device(device),
            precision=spec.precision,
            voices=dict(spec.voices),
            **spec.options,
        )
    raise ValueError(f"unknown engine {spec.engine!r}")

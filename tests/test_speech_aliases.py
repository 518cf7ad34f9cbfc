"""OpenAI's model and voice names reach our models, modes and voices through /v1/audio/speech."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from api.contract import SpeechBody
from api.speech import OPENAI_VOICES, job_of

#: OpenAI's voices and the voice every registry model has that each one stands for.
EXPECTED_VOICES = {
    "alloy": "default", "ash": "male", "ballad": "male", "coral": "female", "echo": "male", "fable": "default",
    "onyx": "male", "nova": "female", "sage": "female", "shimmer": "female", "verse": "default", "marin": "female",
    "cedar": "male",
}  # fmt: skip


def _speech_job(client: FlaskClient, **body: object) -> dict[str, object]:
    """Ask for speech and return the job the answer names."""
    response = client.post("/v1/audio/speech", json={"input": "Hello there. Nice to meet you.", **body})
    assert response.status_code == 200, response.get_data(as_text=True)
    response.close()
    job: dict[str, object] = client.get(f"/v1/jobs/{response.headers['X-Job-Id']}").get_json()
    return job


@pytest.mark.parametrize(
    ("model", "voice", "mode", "ours"),
    [("tts-1-hd", "nova", "quality", "female"), ("tts-1", "onyx", "balanced", "male"),
     ("gpt-4o-mini-tts", "alloy", "balanced", "default")],
)  # fmt: skip
def test_openai_model_names_speak_with_the_default_model_and_tts_1_hd_in_quality_mode(
    served: FlaskClient, model: str, voice: str, mode: str, ours: str
) -> None:
    job = _speech_job(served, model=model, voice=voice, response_format="wav")
    default = served.get("/v1/models").get_json()["default"]
    assert (job["model"], job["mode"], job["voice"]) == (default, mode, ours)


def test_every_openai_voice_name_maps_to_a_voice_every_model_has() -> None:
    assert OPENAI_VOICES == EXPECTED_VOICES
    for name, ours in EXPECTED_VOICES.items():
        job = job_of(SpeechBody(input="hi", model="tts-1", voice=name))
        assert (job.voice, job.model, job.mode) == (ours, None, "balanced")


def test_a_model_or_voice_of_our_own_passes_through_unchanged(served: FlaskClient) -> None:
    job = _speech_job(served, model="espeak-en", voice="female", response_format="pcm")
    assert (job["model"], job["voice"], job["mode"]) == ("espeak-en", "female", "balanced")

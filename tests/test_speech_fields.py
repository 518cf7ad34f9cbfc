"""/v1/audio/speech takes exactly OpenAI's fields: a misspelt one is refused, every one OpenAI's package sends works."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
from flask import Flask
from flask.testing import FlaskClient

from api.contract import SpeechBody
from tests.support.http import serving
from tests.support.servers import WorkerProcess


def test_a_misspelt_field_is_a_422_that_names_it_and_the_fields_allowed(served: FlaskClient) -> None:
    response = served.post("/v1/audio/speech", json={"input": "Which format?", "respones_format": "wav"})
    assert response.status_code == 422, (response.status_code, response.content_type)
    error = response.get_json()["error"]
    assert error["code"] == "invalid_field" and error["field"] == "respones_format"
    assert "unknown field" in error["message"] and "response_format" in error["message"]
    assert [e["field"] for e in error["errors"]] == ["respones_format"]


def test_openais_ignored_fields_are_checked_like_every_other() -> None:
    body = SpeechBody.model_validate({"input": "hi", "instructions": "Speak warmly.", "stream_format": "audio"})
    assert (body.instructions, body.stream_format) == ("Speak warmly.", "audio")
    for wrong in ({"instructions": 1}, {"stream_format": "video"}):
        assert not _valid({"input": "hi", **wrong}), wrong


def test_an_sse_stream_which_this_service_does_not_make_is_a_422_saying_to_use_audio(served: FlaskClient) -> None:
    response = served.post("/v1/audio/speech", json={"input": "As events?", "stream_format": "sse"})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["field"] == "stream_format" and "use audio" in error["message"]


def _valid(body: dict[str, object]) -> bool:
    try:
        SpeechBody.model_validate(body)
    except ValueError:
        return False
    return True


def test_every_field_the_openai_package_can_send_is_one_the_body_declares() -> None:
    from openai.types.audio.speech_create_params import SpeechCreateParams

    sent = SpeechCreateParams.__required_keys__ | SpeechCreateParams.__optional_keys__
    assert sent <= set(SpeechBody.model_fields), sorted(sent - set(SpeechBody.model_fields))


def test_every_voice_and_model_name_the_openai_package_knows_is_mapped() -> None:
    from typing import get_args

    from openai.types.audio.speech_create_params import Voice
    from openai.types.audio.speech_model import SpeechModel

    from api.speech import OPENAI_MODELS, OPENAI_VOICES

    voices = {name for arg in get_args(Voice) for name in get_args(arg)}  # the Literal inside the Union
    assert voices and voices <= set(OPENAI_VOICES), sorted(voices - set(OPENAI_VOICES))
    assert set(get_args(SpeechModel)) <= OPENAI_MODELS, sorted(set(get_args(SpeechModel)) - OPENAI_MODELS)


def test_the_openai_package_gets_audio_when_it_sends_every_field_it_has(app: Flask, worker: WorkerProcess) -> None:
    from openai import OpenAI

    with serving(app) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused-locally")
        response = client.audio.speech.create(
            model="tts-1",
            voice="nova",
            input="Every field the package has. It still speaks.",
            instructions="Speak calmly.",
            response_format="wav",
            speed=1.25,
            stream_format="audio",
        )
        samples, rate = sf.read(io.BytesIO(response.read()))
    assert rate in (22050, 24000)
    assert len(samples) / rate > 0.5
    assert np.abs(samples).max() > 0.01

"""The client against a service whose long-polls are shorter than its own (TTS_MAX_WAIT_S=5): real API and worker."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
import requests
import soundfile as sf

from client import TTSClient, TTSClientError
from client.api import LONG_POLL_S, allowed_wait
from client.cli import main
from tests.support.apps import api_app
from tests.support.http import serving
from tests.support.servers import WorkerProcess

SERVER_MAX_WAIT_S = 5.0
TEXT = "The tide came in slowly. The gulls went quiet. Night fell over the harbour, and the lamps were lit."


class WaitRecordingSession(requests.Session):
    """A session that records the ``?wait=`` of each request and the status it got."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[str, int]] = []

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().request(method, url, *args, **kwargs)
        wait = parse_qs(urlsplit(str(url)).query).get("wait")
        if wait:
            self.waits.append((wait[0], response.status_code))
        return response


@pytest.fixture
def short_wait_url(settings_env: dict[str, str], redis_client: redis.Redis, worker: WorkerProcess) -> Iterator[str]:
    """Serve an API whose longest long-poll is ``SERVER_MAX_WAIT_S``, a valid setting under the client's own."""
    app = api_app(settings_env, max_wait_s=SERVER_MAX_WAIT_S)
    try:
        with serving(app) as url:
            yield url
    finally:
        app.extensions["tts"].close()


def test_the_service_refuses_the_clients_usual_wait(short_wait_url: str) -> None:
    with TTSClient(short_wait_url) as tts:
        job = tts.submit(TEXT, model="espeak-en", cache=False)
    answer = requests.get(f"{short_wait_url}/v1/jobs/{job['id']}/segments/0?wait={LONG_POLL_S:g}", timeout=30)
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "wait"


def test_segment_and_segments_lower_their_wait_to_the_services_and_keep_it(short_wait_url: str) -> None:
    session = WaitRecordingSession()
    with TTSClient(short_wait_url, session=session) as tts:
        job = tts.submit(TEXT, model="espeak-en", format="wav", cache=False)
        audio, duration, rate = tts.segment(job["id"], 0)
        assert rate == 22050
        assert sf.info(io.BytesIO(audio)).duration == pytest.approx(duration, abs=0.002)
        got = [index for index, _, _ in tts.segments(job["id"])]
        assert got == list(range(job["segments_total"]))
        assert tts.long_poll_s == SERVER_MAX_WAIT_S
    # One refusal, then every long-poll asks for what the service allows.
    assert session.waits[0] == (f"{LONG_POLL_S:g}", 422)
    assert {wait for wait, _ in session.waits[1:]} == {f"{SERVER_MAX_WAIT_S:g}"}
    assert [status for _, status in session.waits].count(200) == 1 + job["segments_total"]
    session.close()


def test_download_works_against_a_shorter_wait(short_wait_url: str, tmp_path: Path) -> None:
    with TTSClient(short_wait_url) as tts:
        job = tts.submit(TEXT, model="espeak-en", format="wav", cache=False)
        path = tts.download(job["id"], tmp_path / "tide.wav")
    assert sf.info(path).samplerate == 22050


def test_book_works_against_a_shorter_wait(short_wait_url: str, tmp_path: Path) -> None:
    text_file = tmp_path / "tide.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "tide.wav"
    assert main(["book", str(text_file), "-o", str(out), "--url", short_wait_url, "--model", "espeak-en"]) == 0
    assert sf.info(out).samplerate == 22050
    assert not (tmp_path / "tide.wav.part").exists()


@pytest.mark.parametrize(
    ("message", "asked", "allowed"),
    [
        ("wait: must be between 0 and 5 seconds", 30.0, 5.0),
        ("wait: must be between 0 and 0.25 seconds", 30.0, 0.25),
        ("wait: must be between 0 and 2.5 seconds", 5.0, 2.5),
        ("wait: too long", 30.0, 5.0),  # a service that does not say its limit: step down
        ("wait: too long", 5.0, 1.0),
        ("wait: too long", 1.0, 0.0),
        ("wait: must be between 0 and 40 seconds", 30.0, 5.0),  # a limit over what was asked is no answer
        ("wait: must be between 0 and nan seconds", 30.0, 5.0),
    ],
)
def test_a_refused_wait_is_lowered_to_what_the_service_says_or_else_step_by_step(
    message: str, asked: float, allowed: float
) -> None:
    error = TTSClientError(422, "invalid_field", message, details={"field": "wait"})
    assert allowed_wait(error, asked) == allowed


def test_the_limit_the_service_states_as_max_is_taken_before_the_message() -> None:
    error = TTSClientError(422, "invalid_field", "wait: out of range", details={"field": "wait", "max": 7.5})
    assert allowed_wait(error, 30.0) == 7.5


def test_a_refusal_of_something_else_or_of_no_wait_lowers_nothing() -> None:
    assert allowed_wait(TTSClientError(422, "invalid_field", "speed: too fast", details={"field": "speed"}), 30) is None
    assert allowed_wait(TTSClientError(404, "not_found", "no job"), 30.0) is None
    assert allowed_wait(TTSClientError(422, "invalid_field", "wait: no", details={"field": "wait"}), 0.0) is None

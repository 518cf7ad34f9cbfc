"""API keys in the Python client and the command line, against a real API that asks for one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import requests
import soundfile as sf

from client import TTSClient, TTSClientError
from client.cli import main
from tests.support.apps import api_app
from tests.support.http import serving

KEY = "client-test-key-0123456789abcdef"
OTHER_KEY = "client-other-key-0123456789abcdef"
TEXT = "Hello there. The key works."


@pytest.fixture(scope="module")
def keyed_server(settings_env: dict[str, str]) -> Iterator[str]:
    """Serve, over real HTTP, an API that accepts only ``KEY`` and ``OTHER_KEY``: one app for the module."""
    app = api_app(settings_env, api_keys=f"{KEY},{OTHER_KEY}")
    with serving(app) as url:
        yield url


@pytest.fixture
def keyed_url(keyed_server: str, redis_client: redis.Redis) -> str:
    """Return the keyed API's URL, its jobs dropped before and after the test (no worker: nothing is made)."""
    return keyed_server


@pytest.fixture
def keyed_worked_url(keyed_url: str, worker: object) -> str:
    """Return the keyed API's URL with a real worker behind it."""
    return keyed_url


class SentSession(requests.Session):
    """A session that records the method, path and Authorization header of each request as sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, str | None]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        auth = request.headers.get("Authorization")
        self.sent.append((str(request.method), urlsplit(str(request.url)).path, None if auth is None else str(auth)))
        return super().send(request, **kwargs)


def test_the_client_sends_its_key_as_a_bearer_token_on_every_request(keyed_worked_url: str, tmp_path: Path) -> None:
    session = SentSession()
    with session, TTSClient(keyed_worked_url, api_key=KEY, session=session) as tts:
        assert "espeak-en" in {model["id"] for model in tts.models()["data"]}
        job = tts.submit(TEXT, model="espeak-en", format="wav", cache=False)
        assert [e["event"] for e in tts.events(job["id"])][-1] == "done"
        assert tts.wait(job["id"])["status"] == "done"
        audio, duration, _ = tts.segment(job["id"], 0)
        assert audio and duration > 0
        path = tts.download(job["id"], tmp_path / "keyed.wav")
    assert sf.info(path).duration > 0.5
    paths = {path for _, path, _ in session.sent}
    assert {"/v1/models", "/v1/jobs", f"/v1/jobs/{job['id']}/events", f"/v1/jobs/{job['id']}/audio"} <= paths
    assert {auth for _, _, auth in session.sent} == {f"Bearer {KEY}"}
    assert "Authorization" not in session.headers  # a session passed in is not changed


def test_a_client_without_a_key_or_with_a_wrong_one_gets_a_401_from_a_keyed_service(keyed_url: str) -> None:
    for key in (None, "wrong-key-0123456789abcdef"):
        with TTSClient(keyed_url, api_key=key) as tts, pytest.raises(TTSClientError) as refused:
            tts.models()
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")


def test_the_cli_reads_the_key_from_tts_api_key(
    keyed_worked_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTS_API_KEY", KEY)
    out = tmp_path / "env-key.wav"
    assert main(["say", TEXT, "-o", str(out), "--url", keyed_worked_url, "--model", "espeak-en"]) == 0
    assert sf.info(out).duration > 0.5


def test_the_cli_takes_api_key_over_tts_api_key_and_the_url_from_tts_url(
    keyed_worked_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTS_API_KEY", "stale-key-0123456789abcdef")
    monkeypatch.setenv("TTS_URL", keyed_worked_url)
    session = SentSession()
    out = tmp_path / "flag-key.wav"
    with session:
        assert main(["say", TEXT, "-o", str(out), "--api-key", OTHER_KEY, "--model", "espeak-en"], session=session) == 0
    assert sf.info(out).duration > 0.5
    assert {auth for _, _, auth in session.sent} == {f"Bearer {OTHER_KEY}"}
    assert all(path.startswith("/v1/") for _, path, _ in session.sent)


def test_a_401_without_a_key_says_to_pass_api_key_or_set_tts_api_key(
    keyed_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TTS_API_KEY", raising=False)
    assert main(["say", TEXT, "-o", str(tmp_path / "no-key.wav"), "--url", keyed_url]) == 1
    err = capsys.readouterr().err
    assert f"error: {keyed_url} needs an API key; pass --api-key KEY or set TTS_API_KEY" in err
    assert "Traceback" not in err
    assert not (tmp_path / "no-key.wav").exists()


def test_a_401_with_a_wrong_key_says_the_key_was_refused(
    keyed_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TTS_API_KEY", "wrong-key-0123456789abcdef")
    text_file = tmp_path / "chapter.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    assert main(["book", str(text_file), "-o", str(tmp_path / "chapter.wav"), "--url", keyed_url]) == 1
    err = capsys.readouterr().err
    assert f"error: {keyed_url} refused the API key" in err
    assert "pass a valid one with --api-key or set TTS_API_KEY" in err
    assert "wrong-key-0123456789abcdef" not in err

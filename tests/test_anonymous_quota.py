"""Without API keys, TTS_ANONYMOUS_PER_MINUTE limits each client address's submissions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from flask import Flask

from tests.support.apps import api_app


@pytest.fixture
def limited(settings_env: dict[str, str], worker: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    """Return an API app whose quota comes from the environment, as the service reads it: two a minute."""
    monkeypatch.setenv("TTS_ANONYMOUS_PER_MINUTE", "2")
    monkeypatch.delenv("TTS_API_KEYS", raising=False)
    app = api_app(settings_env)
    yield app
    app.extensions["tts"].close()


def _address() -> dict[str, str]:
    """Return a client address of the test's own: quotas live in Redis, shared with other tests' callers."""
    number = uuid.uuid4().int
    return {"REMOTE_ADDR": f"10.{number % 251}.{number // 251 % 251}.{number // 63001 % 251}"}


def test_each_address_may_submit_tts_anonymous_per_minute_jobs_a_minute(limited: Flask) -> None:
    assert limited.extensions["tts"].settings.anonymous_per_minute == 2
    client, first, second = limited.test_client(), _address(), _address()
    accepted = [client.post("/v1/jobs", json={"text": f"Quota {n}."}, environ_base=first) for n in range(2)]
    assert [r.status_code for r in accepted] == [202, 202]
    refused = client.post("/v1/jobs", json={"text": "One too many."}, environ_base=first)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "too_many_requests"
    assert "2 submissions per minute" in refused.get_json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    speech = client.post("/v1/audio/speech", json={"input": "Me too."}, environ_base=first)
    assert speech.status_code == 429, "speech spends the same quota"
    job_id = accepted[0].get_json()["id"]
    assert client.get(f"/v1/jobs/{job_id}", environ_base=first).status_code == 200, "only submissions count"
    assert client.post("/v1/jobs", json={"text": "Another address."}, environ_base=second).status_code == 202


def test_with_no_limit_set_an_address_is_never_refused(settings_env: dict[str, str], worker: object) -> None:
    app = api_app(settings_env, anonymous_per_minute=0)
    try:
        client, address = app.test_client(), _address()
        answers = [client.post("/v1/jobs", json={"text": f"Free {n}."}, environ_base=address) for n in range(4)]
        assert [r.status_code for r in answers] == [202] * 4
    finally:
        app.extensions["tts"].close()

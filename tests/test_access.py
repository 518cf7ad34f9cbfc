"""API keys, quotas and idempotency keys."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from api import create_app


def _app(settings_env: dict[str, str], **overrides: Any) -> Flask:
    return create_app(
        {
            "redis_url": settings_env["REDIS_URL"],
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "espeak-en",
            **overrides,
        }
    )


@pytest.fixture
def keyed(settings_env: dict[str, str], redis_client: redis.Redis, worker: object) -> FlaskClient:
    """Return a client of an API that requires keys: alice may submit twice a minute, bob without limit."""
    for key in redis_client.scan_iter(match="tts:quota:*"):
        redis_client.delete(key)
    return _app(settings_env, api_keys="alice-key=2,bob-key").test_client()


def test_without_a_key_every_route_but_health_is_a_401(keyed: FlaskClient) -> None:
    for method, path in [
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs/abc"),
        ("get", "/v1/models"),
        ("post", "/v1/audio/speech"),
    ]:
        response = getattr(keyed, method)(path, json={"text": "hi"})
        assert response.status_code == 401, path
        assert response.get_json()["error"]["code"] == "unauthorized"
    assert keyed.get("/healthz").status_code == 200
    assert keyed.get("/metrics").status_code == 200


def test_a_wrong_key_is_a_401_and_a_right_one_passes(keyed: FlaskClient) -> None:
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer bob-key"}).status_code == 200
    assert keyed.get("/v1/models", headers={"X-API-Key": "alice-key"}).status_code == 200


def test_a_caller_over_its_quota_gets_a_429_with_retry_after(keyed: FlaskClient) -> None:
    body = {"text": "Quota check.", "priority": "batch"}
    alice = {"X-API-Key": "alice-key"}
    assert [keyed.post("/v1/jobs", json=body, headers=alice).status_code for _ in range(2)] == [202, 202]
    refused = keyed.post("/v1/jobs", json=body, headers=alice)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "too_many_requests"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert keyed.post("/v1/jobs", json=body, headers={"X-API-Key": "bob-key"}).status_code == 202
    assert keyed.get("/v1/models", headers=alice).status_code == 200, "polling does not spend quota"


def test_the_same_idempotency_key_and_body_return_the_same_job(client: FlaskClient) -> None:
    body = {"text": "Only once, please.", "priority": "batch"}
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-17"})
    again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202
    assert first.get_json()["id"] == again.get_json()["id"]
    other = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-18"})
    assert other.get_json()["id"] != first.get_json()["id"]


def test_the_same_idempotency_key_with_another_body_is_a_422(client: FlaskClient) -> None:
    client.post("/v1/jobs", json={"text": "First body."}, headers={"Idempotency-Key": "k-1"})
    response = client.post("/v1/jobs", json={"text": "Second body."}, headers={"Idempotency-Key": "k-1"})
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "Idempotency-Key"


def test_an_overlong_idempotency_key_is_a_422(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", json={"text": "Hi."}, headers={"Idempotency-Key": "x" * 300})
    assert response.status_code == 422

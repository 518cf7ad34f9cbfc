"""API keys, quotas, idempotency keys, and tenancy: with keys on, a job answers only the key that submitted it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from cache import keys
from tests.support.apps import api_app
from tests.support.processes import wait_for

ALICE = "alice-0123456789abcdef"
BOB = "bob-0123456789abcdef00"


@pytest.fixture
def keyed(settings_env: dict[str, str], redis_client: redis.Redis, worker: object) -> Iterator[FlaskClient]:
    """Return a client of an API that requires keys: alice may submit twice a minute, bob without limit."""
    for key in redis_client.scan_iter(match="tts:quota:*"):
        redis_client.delete(key)
    yield from _client(api_app(settings_env, api_keys=f"{ALICE}=2,{BOB}"))


def _client(app: Flask) -> Iterator[FlaskClient]:
    yield app.test_client()
    app.extensions["tts"].close()


@pytest.fixture
def tenants(settings_env: dict[str, str], worker: object) -> Iterator[FlaskClient]:
    """Return a client of an API with two keys and no quotas, the sentence cache at its default scope."""
    yield from _client(api_app(settings_env, api_keys=f"{ALICE},{BOB}"))


@pytest.fixture
def sharing(settings_env: dict[str, str], worker: object) -> Iterator[FlaskClient]:
    """Return a client of an API with two keys whose sentence cache is shared between them."""
    yield from _client(api_app(settings_env, api_keys=f"{ALICE},{BOB}", cache_scope="shared"))


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
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer "}).status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": f"Bearer {ALICE}x"}).status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": f"Bearer {BOB}"}).status_code == 200
    assert keyed.get("/v1/models", headers={"X-API-Key": ALICE}).status_code == 200


def test_a_caller_over_its_quota_gets_a_429_with_retry_after(keyed: FlaskClient) -> None:
    body = {"text": "Quota check.", "priority": "batch"}
    alice = {"X-API-Key": ALICE}
    assert [keyed.post("/v1/jobs", json=body, headers=alice).status_code for _ in range(2)] == [202, 202]
    refused = keyed.post("/v1/jobs", json=body, headers=alice)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "too_many_requests"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert keyed.post("/v1/jobs", json=body, headers={"X-API-Key": BOB}).status_code == 202
    assert keyed.get("/v1/models", headers=alice).status_code == 200, "polling does not spend quota"


def test_replaying_an_idempotency_key_spends_no_quota(keyed: FlaskClient) -> None:
    body = {"text": "Submitted once, retried after a timeout.", "priority": "batch"}
    alice = {"X-API-Key": ALICE, "Idempotency-Key": f"retry-me-{uuid.uuid4().hex}"}
    first = keyed.post("/v1/jobs", json=body, headers=alice)
    replays = [keyed.post("/v1/jobs", json=body, headers=alice) for _ in range(4)]
    assert [r.status_code for r in replays] == [202] * 4, [r.get_json() for r in replays]
    assert {r.get_json()["id"] for r in replays} == {first.get_json()["id"]}
    other = keyed.post("/v1/jobs", json=body, headers={"X-API-Key": ALICE})
    assert other.status_code == 202, "the replays left the second of alice's two submissions a minute"
    assert keyed.post("/v1/jobs", json=body, headers={"X-API-Key": ALICE}).status_code == 429


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


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _done(client: FlaskClient, job_id: str, key: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=_as(key)).get_json()
        return view if view["status"] == "done" else None

    return wait_for(finished, 60, f"job {job_id} done")


def test_another_keys_job_is_a_404_on_every_job_route(tenants: FlaskClient) -> None:
    created = tenants.post("/v1/jobs", json={"text": "Alice's own words."}, headers=_as(ALICE))
    assert created.status_code == 202
    job_id = created.get_json()["id"]
    _done(tenants, job_id, ALICE)
    routes = [("get", ""), ("get", "/segments/0"), ("get", "/audio"), ("get", "/events"), ("delete", "")]
    for method, suffix in routes:
        other = getattr(tenants, method)(f"/v1/jobs/{job_id}{suffix}", headers=_as(BOB))
        unknown = getattr(tenants, method)(f"/v1/jobs/{'0' * 32}{suffix}", headers=_as(BOB))
        assert other.status_code == unknown.status_code == 404, suffix
        assert other.get_json()["error"]["code"] == "not_found"
    assert tenants.get(f"/v1/jobs/{job_id}", headers=_as(ALICE)).get_json()["status"] == "done", "bob canceled nothing"
    assert tenants.get(f"/v1/jobs/{job_id}/segments/0", headers=_as(ALICE)).status_code == 200


def test_another_keys_text_stream_takes_none_of_its_pieces(tenants: FlaskClient) -> None:
    opened = tenants.post("/v1/jobs", json={"text": "", "text_stream": True}, headers=_as(ALICE))
    assert opened.status_code == 202
    job_id = opened.get_json()["id"]
    piece = {"seq": 0, "text": "Bob's words."}
    assert tenants.post(f"/v1/jobs/{job_id}/text", json=piece, headers=_as(BOB)).status_code == 404
    assert (
        tenants.post(f"/v1/jobs/{job_id}/text", json={**piece, "text": "Alice's."}, headers=_as(ALICE)).status_code
        == 200
    )
    tenants.delete(f"/v1/jobs/{job_id}", headers=_as(ALICE))


def test_the_same_idempotency_key_from_two_callers_makes_two_jobs(tenants: FlaskClient) -> None:
    key = {"Idempotency-Key": "order-1"}
    alice = tenants.post("/v1/jobs", json={"text": "For Alice."}, headers={**_as(ALICE), **key})
    bob = tenants.post("/v1/jobs", json={"text": "For Bob."}, headers={**_as(BOB), **key})
    assert alice.status_code == bob.status_code == 202, "another body under the same key is no conflict across callers"
    assert alice.get_json()["id"] != bob.get_json()["id"]
    again = tenants.post("/v1/jobs", json={"text": "For Alice."}, headers={**_as(ALICE), **key})
    assert again.get_json()["id"] == alice.get_json()["id"]


def test_idempotency_keys_of_callers_with_colons_never_share_a_redis_key() -> None:
    assert keys.idempotency("ip-::1", "a") != keys.idempotency("ip-:", ":1:a")
    assert keys.idempotency("ip-::1", "a") != keys.idempotency("ip-::1:a", "")


def test_with_keys_on_the_sentence_cache_is_per_key_by_default(tenants: FlaskClient) -> None:
    body = {"text": "A sentence only Alice has said so far.", "model": "espeak-en"}
    first = tenants.post("/v1/jobs", json=body, headers=_as(ALICE)).get_json()
    _done(tenants, first["id"], ALICE)
    bob = tenants.post("/v1/jobs", json=body, headers=_as(BOB)).get_json()
    assert bob["cached_segments"] == 0, "bob must not learn that alice said it"
    again = tenants.post("/v1/jobs", json=body, headers=_as(ALICE)).get_json()
    assert again["cached_segments"] == again["segments_total"] >= 1


def test_a_shared_cache_scope_lets_keys_reuse_each_others_segments(sharing: FlaskClient) -> None:
    shared = sharing
    body = {"text": "A sentence everyone may reuse.", "model": "espeak-en"}
    first = shared.post("/v1/jobs", json=body, headers=_as(ALICE)).get_json()
    _done(shared, first["id"], ALICE)
    bob = shared.post("/v1/jobs", json=body, headers=_as(BOB)).get_json()
    assert bob["cached_segments"] == bob["segments_total"] >= 1

"""Every bad request gets the right status and a JSON error, and the service keeps serving."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from cache.jobstore import JobStore
from tests.support.jobs import REQUEST


def _post(client: FlaskClient, body: Any) -> Any:
    return client.post("/v1/jobs", json=body)


def _assert_error(response: Any, status: int, code: str | None = None, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.is_json
    error = response.get_json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    if field is not None:
        assert error.get("field") == field, error
    return error


def test_malformed_json_is_a_400(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", data='{"text": "hi"', content_type="application/json")
    _assert_error(response, 400, "bad_request")


def test_invalid_utf8_is_a_400(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", data=b'{"text": "\xff\xfe"}', content_type="application/json")
    _assert_error(response, 400, "bad_request")


def test_a_body_that_is_not_json_is_a_415(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", data="text=hello", content_type="application/x-www-form-urlencoded")
    _assert_error(response, 415, "unsupported_media_type")


def test_a_body_over_the_limit_is_a_413(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", data='{"text": "' + "a" * 300_000 + '"}', content_type="application/json")
    _assert_error(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": "   \n\t "}, "text"),
        ({"text": 42}, "text"),
        ({"text": ["a"]}, "text"),
        ({"text": "a" * 20_001}, "text"),
        ({"text": "😀😀😀"}, "text"),
        ({"text": "hi", "format": "aiff"}, "format"),
        ({"text": "hi", "speed": 0.1}, "speed"),
        ({"text": "hi", "speed": 9}, "speed"),
        ({"text": "hi", "speed": "fast"}, "speed"),
        ({"text": "hi", "speed": True}, "speed"),
        ({"text": "hi", "mode": "turbo"}, "mode"),
        ({"text": "hi", "priority": "urgent"}, "priority"),
        ({"text": "hi", "seed": -1}, "seed"),
        ({"text": "hi", "seed": 1.5}, "seed"),
        ({"text": "hi", "model": 7}, "model"),
        ({"text": "hi", "voice": ""}, "voice"),
        ({"text": "hi", "colour": "blue"}, "colour"),
        (["text"], "body"),
        ("just a string", "body"),
    ],
)
def test_invalid_fields_are_a_422_naming_the_field(client: FlaskClient, body: Any, field: str) -> None:
    _assert_error(_post(client, body), 422, "invalid_field", field)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinite_speed_is_a_422_naming_speed(client: FlaskClient, number: str) -> None:
    response = client.post("/v1/jobs", data=f'{{"text": "hi", "speed": {number}}}', content_type="application/json")
    _assert_error(response, 422, "invalid_field", "speed")


@pytest.mark.parametrize("model", ["nope", "../../etc/passwd", "/tmp/models", "chattts/../espeak-en"])
def test_unknown_or_path_like_models_are_a_404(client: FlaskClient, model: str) -> None:
    _assert_error(_post(client, {"text": "hi", "model": model}), 404, "not_found", "model")


def test_a_model_without_weights_is_a_404_that_says_where_weights_go(client: FlaskClient) -> None:
    error = _assert_error(_post(client, {"text": "hi", "model": "chattts"}), 404, "not_found", "model")
    assert "weights" in error["message"]


def test_an_unknown_voice_is_a_404(client: FlaskClient) -> None:
    _assert_error(_post(client, {"text": "hi", "model": "espeak-en", "voice": "darth"}), 404, "not_found", "voice")


def test_an_unknown_job_is_a_404(client: FlaskClient) -> None:
    _assert_error(client.get("/v1/jobs/0123456789abcdef"), 404, "not_found")
    _assert_error(client.get("/v1/jobs/0123456789abcdef/segments/0"), 404, "not_found")
    _assert_error(client.get("/v1/jobs/0123456789abcdef/audio"), 404, "not_found")
    _assert_error(client.delete("/v1/jobs/0123456789abcdef"), 404, "not_found")


def test_an_unknown_route_and_a_wrong_method_are_json_errors(client: FlaskClient) -> None:
    _assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    _assert_error(client.put("/v1/jobs"), 405, "method_not_allowed")


def test_a_wrong_method_is_answered_with_the_allow_header_and_says_which_methods_the_route_takes(
    client: FlaskClient,
) -> None:
    response = client.put("/v1/jobs")
    error = _assert_error(response, 405, "method_not_allowed")
    assert set(response.headers["Allow"].split(", ")) >= {"POST"}
    assert "PUT" in error["message"] and "POST" in error["message"]


def test_a_segment_past_a_jobs_end_names_the_segments_it_has(app: Flask, client: FlaskClient) -> None:
    store = JobStore(app.extensions["tts"].redis, ttl=600)
    one = store.create(REQUEST, ["Only one."], pending=[0])
    error = _assert_error(client.get(f"/v1/jobs/{one}/segments/3"), 404, "not_found")
    assert "has segment 0, not segment 3" in error["message"]
    store.cancel(one)


def test_the_service_keeps_serving_after_bad_requests(client: FlaskClient) -> None:
    for _ in range(3):
        client.post("/v1/jobs", data="{{{", content_type="application/json")
    assert client.get("/healthz").status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_models_lists_the_registry_with_availability(client: FlaskClient) -> None:
    body = client.get("/v1/models").get_json()
    by_id = {m["id"]: m for m in body["data"]}
    assert body["default"] == "espeak-en"
    assert by_id["espeak-cmn"]["available"] is True
    assert by_id["chattts-tiny"]["available"] is True
    assert "default" in by_id["espeak-en"]["voices"]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("post", "/v1/jobs", {"data": "", "content_type": "application/json"}, 400),
        ("post", "/v1/jobs", {"data": "null", "content_type": "application/json"}, 422),
        ("post", "/v1/jobs", {"data": '{"text": "hi"}', "content_type": "text/plain"}, 415),
        ("post", "/v1/jobs", {"json": {"text": "\x00\x01\x02\x1f"}}, 422),
        ("post", "/v1/jobs", {"json": {"text": "a" * 100_000, "priority": "realtime"}}, 422),
        ("post", "/v1/jobs", {"json": {"text": "hi", "speed": -1}}, 422),
        ("post", "/v1/jobs", {"json": {"text": "hi", "cache": "yes"}}, 422),
        ("post", "/v1/jobs", {"json": {"text": "hi", "seed": 2**40}}, 422),
        ("post", "/v1/jobs", {"json": {"text": "hi", "format": None, "mode": 3}}, 422),
        (
            "post",
            "/v1/jobs",
            {"data": '{"text": "hi", "text": ' * 1 + '"again"}', "content_type": "application/json"},
            202,
        ),
        ("get", "/v1/jobs/x/segments/abc", {}, 404),
        ("get", "/v1/jobs/x/segments/-1", {}, 404),
        ("post", "/v1/audio/speech", {"json": {"input": "hi", "response_format": "wma"}}, 422),
        ("post", "/v1/audio/speech", {"json": {"input": "hi", "model": "../etc"}}, 404),
        ("post", "/v1/audio/speech", {"data": "[1,2", "content_type": "application/json"}, 400),
    ],
)
def test_more_bad_requests_get_a_clear_json_answer(
    client: FlaskClient, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    response = getattr(client, method)(path, **kwargs)
    assert response.status_code == status, response.get_data(as_text=True)
    if status >= 400:
        assert response.get_json()["error"]["message"]


def test_bad_wait_values_are_a_422(app: Any, client: FlaskClient) -> None:
    from cache.jobstore import JobRequest

    store = app.extensions["tts"].store
    job_id = store.create(JobRequest("espeak-en", "default", 1.0, "balanced", "wav", "realtime", None), ["a b"])
    for bad in ("abc", "-1", "nan", "inf", "31"):
        response = client.get(f"/v1/jobs/{job_id}/segments/0?wait={bad}")
        assert response.status_code == 422, bad
        assert response.get_json()["error"]["field"] == "wait"
    too_long = client.get(f"/v1/jobs/{job_id}/segments/0?wait=31").get_json()["error"]
    assert too_long["max"] == 30.0, "the limit, for a client to ask again within it"
    client.delete(f"/v1/jobs/{job_id}")
    for bad in ("abc", "-1"):  # the whole audio's too, whatever the job's state (here canceled)
        response = client.get(f"/v1/jobs/{job_id}/audio?wait={bad}")
        assert response.status_code == 422, bad
        assert response.get_json()["error"]["field"] == "wait"

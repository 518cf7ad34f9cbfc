"""The request contract: pydantic models parse every body, malformed JSON is a 400, a wrong field a 422 naming it,
and nothing a client sends (deep nesting, huge numbers, lone surrogates, huge bodies, lines or headers) is a 500.
The edges of the HTTP server itself are tried on the real server `make run` uses (gunicorn, gevent workers)."""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from api.contract import JobBody, SpeechBody
from tests.support.servers import ApiProcess


def _raw(client: FlaskClient, body: bytes, path: str = "/v1/jobs", **headers: str) -> Any:
    return client.post(path, data=body, content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("100,000 nested [", b"[" * 100_000),
        ("a nested object in a field", b'{"text": ' + b"[" * 100_000),
        ("an integer of 5,000 digits", b'{"text": "hi", "seed": ' + b"9" * 5000 + b"}"),
        ("a lone high surrogate", b'{"text": "\\ud800"}'),
        ("a lone low surrogate", b'{"text": "a\\udc00b"}'),
        ("invalid UTF-8", b'{"text": "\xff"}'),
        ("nothing", b""),
    ],
)
def test_malformed_json_of_any_kind_is_a_400(client: FlaskClient, name: str, body: bytes) -> None:
    response = _raw(client, body)
    assert response.status_code == 400, (name, response.get_data(as_text=True))
    assert response.get_json()["error"]["code"] == "bad_request"
    assert "not valid JSON" in response.get_json()["error"]["message"]


def test_a_lone_surrogate_with_an_idempotency_key_is_a_400_not_a_500(client: FlaskClient) -> None:
    response = _raw(client, b'{"text": "hi \\ud83d there"}', **{"Idempotency-Key": "surrogate-1"})
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"text": "hi", "speed": ' + b"9" * 400 + b"}", "speed"),
        (b'{"text": "hi", "speed": 1e400}', "speed"),
        (b'{"text": "hi", "speed": NaN}', "speed"),
        (b'{"text": "hi", "seed": 1e3}', "seed"),
        (b'{"text": "hi", "cache": 1}', "cache"),
        (b'{"text": "hi", "model": ""}', "model"),
        (b'{"text": "hi", "voice": "' + b"v" * 101 + b'"}', "voice"),
        (b'{"text": "hi", "priority": "now"}', "priority"),
    ],
)
def test_a_wrong_field_is_a_422_that_names_it(client: FlaskClient, body: bytes, field: str) -> None:
    response = _raw(client, body)
    assert response.status_code == 422, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "invalid_field" and error["field"] == field
    assert error["errors"][0]["field"] == field


def test_every_wrong_field_is_listed(client: FlaskClient) -> None:
    error = _raw(client, b'{"text": 1, "speed": "x", "colour": "blue"}').get_json()["error"]
    assert {e["field"] for e in error["errors"]} == {"text", "speed", "colour"}
    colour = next(e for e in error["errors"] if e["field"] == "colour")
    assert "unknown field" in colour["message"] and "text" in colour["message"]


def test_a_repeated_key_counts_once_the_last_value_wins(client: FlaskClient) -> None:
    response = _raw(client, b'{"text": "first", "text": "Second one.", "model": "espeak-en"}')
    assert response.status_code == 202


def test_the_openai_route_is_checked_by_its_own_model(client: FlaskClient) -> None:
    aac = client.post("/v1/audio/speech", json={"input": "hi", "response_format": "aac"})
    assert aac.status_code == 422 and aac.get_json()["error"]["field"] == "response_format"
    assert "mp3" in aac.get_json()["error"]["message"]
    deep = _raw(client, b'{"input": ' + b"[" * 50_000, path="/v1/audio/speech")
    assert deep.status_code == 400
    speed = client.post("/v1/audio/speech", json={"input": "hi", "speed": 4.0})
    assert speed.status_code == 422 and speed.get_json()["error"]["field"] == "speed"


def test_the_document_is_generated_from_the_models_that_parse_requests(client: FlaskClient) -> None:
    document = client.get("/openapi.json").get_json()
    schemas = document["components"]["schemas"]
    assert set(schemas["JobBody"]["properties"]) == set(JobBody.model_fields)
    assert set(schemas["SpeechBody"]["properties"]) == set(SpeechBody.model_fields)
    assert schemas["JobBody"]["additionalProperties"] is False
    speed = schemas["JobBody"]["properties"]["speed"]
    assert (speed["minimum"], speed["maximum"]) == (0.5, 2.0)
    body = document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/JobBody"}


def test_request_metrics_label_only_known_methods(gunicorn_api: ApiProcess) -> None:
    for method in ("FOOBAR", "XYZZY1"):
        assert requests.request(method, f"{gunicorn_api.url}/v1/jobs", timeout=10).status_code == 405
    scraped = requests.get(f"{gunicorn_api.url}/metrics", timeout=10).text
    assert "FOOBAR" not in scraped and "XYZZY1" not in scraped
    assert 'method="other"' in scraped


def test_a_body_over_the_limit_gets_a_413_the_client_can_read(gunicorn_api: ApiProcess) -> None:
    big = b'{"text": "' + b"a" * 20_000_000 + b'"}'
    # urllib sends Connection: close: a server that answered and closed mid-upload would reset the connection.
    request = urllib.request.Request(
        f"{gunicorn_api.url}/v1/jobs", data=big, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert b"payload_too_large" in refused.value.read()
    chunked = requests.post(f"{gunicorn_api.url}/v1/jobs", data=iter([big[:1_000_000]] * 2),
                            headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    assert chunked.status_code == 413, "a chunked body without a length is measured as it comes"


def _raw_http(api: ApiProcess, request_head: bytes) -> tuple[int, str, bytes]:
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(request_head)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.getheader("Content-Type", ""), response.read()


def test_the_servers_own_refusals_are_json_errors(gunicorn_api: ApiProcess) -> None:
    cases = {
        414: b"GET /v1/jobs/" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        431: b"GET /v1/jobs/abc HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
        400: b"GARBAGE\r\n\r\n",
    }
    for expected, head in cases.items():
        status, content_type, body = _raw_http(gunicorn_api, head)
        assert status == expected
        assert content_type == "application/json", body
        assert requests.compat.json.loads(body)["error"]["message"]
    assert requests.get(f"{gunicorn_api.url}/healthz", timeout=10).status_code == 200

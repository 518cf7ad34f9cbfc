"""The text limits apply after normalisation: a short body that expands, or plans into too many segments, gets a 413."""

from __future__ import annotations

import json
from typing import Any

from flask.testing import FlaskClient

from tests.support.servers import ROOT

# 2,000 × U+FDFA is a 6 KB body that normalises to 36,000 characters (18 each).
LIGATURES = "\ufdfa" * 2000


def _post_utf8(client: FlaskClient, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, data=json.dumps(body, ensure_ascii=False).encode(), content_type="application/json")


def _assert_over(response: Any, setting: str, limit: str, field: str = "text") -> str:
    assert response.status_code == 413, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "payload_too_large"
    assert error["field"] == field
    assert error["setting"] == setting
    assert setting in error["message"] and limit in error["message"]
    return str(error["message"])


def test_a_six_kilobyte_body_that_expands_past_the_limit_is_a_413_naming_the_limit(client: FlaskClient) -> None:
    body = {"text": LIGATURES, "model": "espeak-cmn"}
    assert len(json.dumps(body, ensure_ascii=False).encode()) < 7_000
    message = _assert_over(_post_utf8(client, "/v1/jobs", body), "TTS_MAX_TEXT_CHARS", "20,000")
    assert "after normalisation" in message


def test_the_openai_route_refuses_the_same_text_naming_its_input_field(client: FlaskClient) -> None:
    response = _post_utf8(client, "/v1/audio/speech", {"input": LIGATURES, "model": "espeak-en"})
    assert _assert_over(response, "TTS_MAX_TEXT_CHARS", "20,000", field="input").startswith("input:")


def test_the_openai_route_names_its_input_field_when_it_has_nothing_to_speak(client: FlaskClient) -> None:
    response = client.post("/v1/audio/speech", json={"input": "\U0001f600", "model": "espeak-en"})
    assert response.status_code == 422, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["field"] == "input"
    assert error["errors"] == [{"field": "input", "message": "has nothing a voice can speak (only symbols or emoji?)"}]


def test_every_422_lists_what_is_wrong_in_errors_even_a_check_made_after_parsing(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", json={"text": "\u200b\u200b", "model": "espeak-en"})  # zero-width only
    assert response.status_code == 422, response.get_data(as_text=True)
    assert [e["field"] for e in response.get_json()["error"]["errors"]] == ["text"]


def test_a_text_of_more_segments_than_the_limit_is_a_413_naming_the_segment_limit(client: FlaskClient) -> None:
    # 9,000 characters: well within TTS_MAX_TEXT_CHARS, but 3,000 paragraphs of one segment each.
    response = _post_utf8(client, "/v1/jobs", {"text": "字\n\n" * 3000, "model": "espeak-cmn"})
    _assert_over(response, "TTS_MAX_SEGMENTS", "2,000")


def test_a_normal_long_text_is_still_accepted(client: FlaskClient) -> None:
    story = (ROOT / "bench" / "story_zh.txt").read_text(encoding="utf-8")
    text = (story * 7)[:19_000]
    response = _post_utf8(client, "/v1/jobs", {"text": text, "model": "espeak-cmn", "cache": False})
    assert response.status_code == 202, response.get_data(as_text=True)
    job = response.get_json()
    assert 200 <= job["segments_total"] <= 2000
    client.delete(f"/v1/jobs/{job['id']}")

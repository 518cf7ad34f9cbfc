"""The sentence cache: repeats cost nothing, any change misses, edits re-make only what changed."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from api import create_app
from cache.sentences import CachedSegment, SentenceCache, segment_key
from core.audio import PackedAudio
from tests.support.servers import free_port

PARAGRAPHS = [
    "The lighthouse keeper woke before dawn. He climbed the stairs slowly.",
    "Outside, the sea was grey and calm. A single boat moved along the coast.",
    "By noon the fog had lifted. Children ran along the beach with a kite.",
    "In the evening he wrote in his logbook. Then he lit the great lamp again.",
]


def _submit(client: FlaskClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={"model": "espeak-en", **body})
    assert response.status_code == 202, response.get_data(as_text=True)
    job: dict[str, Any] = response.get_json()
    return job


def _finish(client: FlaskClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in ("done", "failed", "canceled"):
            assert job["status"] == "done", job
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def test_the_key_changes_with_everything_that_changes_the_audio() -> None:
    base = {
        "model": "m",
        "version": "v1",
        "voice": "default",
        "seed": 1,
        "mode": "balanced",
        "speed": 1.0,
        "text": "Hello.",
    }
    keys = {segment_key(**base)}  # type: ignore[arg-type]
    for field, other in [
        ("model", "n"),
        ("version", "v2"),
        ("voice", "female"),
        ("seed", 2),
        ("seed", None),
        ("mode", "quality"),
        ("speed", 1.1),
        ("text", "Hello!"),
    ]:
        keys.add(segment_key(**{**base, field: other}))  # type: ignore[arg-type]
    assert len(keys) == 9
    assert segment_key(**base) == segment_key(**base)  # type: ignore[arg-type]


def test_an_identical_request_is_done_before_the_answer_leaves(served: FlaskClient) -> None:
    text = "Repeat after me. This sentence is cached."
    first = _submit(served, text=text, seed=7)
    assert first["cached_segments"] == 0
    _finish(served, first["id"])
    whole = served.get(f"/v1/jobs/{first['id']}/audio").data
    second = _submit(served, text=text, seed=7)
    assert second["status"] == "done"
    assert second["cached_segments"] == second["segments_total"]
    assert served.get(f"/v1/jobs/{second['id']}/audio").data == whole
    assert served.get(f"/v1/jobs/{second['id']}/segments/0").status_code == 200


@pytest.mark.parametrize("change", [{"voice": "female"}, {"seed": 8}, {"speed": 1.25}, {"mode": "fast"}])
def test_any_change_to_voice_seed_speed_or_mode_misses_every_segment(
    served: FlaskClient, change: dict[str, Any]
) -> None:
    body = {"text": "Repeat after me. This sentence is new.", "seed": 7}
    original = _finish(served, _submit(served, **body)["id"])
    assert original["segments_total"] >= 2
    assert _submit(served, **body)["cached_segments"] == original["segments_total"], "the same request hits"
    changed = _submit(served, **{**body, **change})
    assert changed["segments_total"] == original["segments_total"]
    assert changed["cached_segments"] == 0


def test_a_change_to_the_text_misses_the_changed_sentence_only(served: FlaskClient) -> None:
    body = {"text": "Repeat after me. This sentence is new.", "seed": 7}
    original = _finish(served, _submit(served, **body)["id"])
    changed = _submit(served, **{**body, "text": "Repeat after me! This sentence is new."})
    assert changed["segments_total"] == original["segments_total"] >= 2
    assert changed["cached_segments"] == changed["segments_total"] - 1


def test_opting_out_skips_the_cache(served: FlaskClient) -> None:
    body = {"text": "Never cache this sentence.", "seed": 3}
    _finish(served, _submit(served, **body)["id"])
    again = _submit(served, **body, cache=False)
    assert again["cached_segments"] == 0


def test_an_edited_story_re_makes_only_the_changed_paragraph(served: FlaskClient) -> None:
    story = "\n\n".join(PARAGRAPHS)
    first = _finish(served, _submit(served, text=story, seed=1)["id"])
    edited = PARAGRAPHS.copy()
    edited[2] = "By noon the fog was gone. Two children flew a red kite on the sand."
    second = _submit(served, text="\n\n".join(edited), seed=1)
    changed_segments = second["segments_total"] - second["cached_segments"]
    assert second["segments_total"] == first["segments_total"]
    assert 1 <= changed_segments <= 2, second
    _finish(served, second["id"])


def test_a_cache_redis_that_is_down_degrades_to_misses(settings_env: dict[str, str], worker: object) -> None:
    app = create_app(
        {
            "redis_url": settings_env["REDIS_URL"],
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "espeak-en",
            "cache_redis_url": f"redis://127.0.0.1:{free_port()}/0",
        }
    )
    client = app.test_client()
    job = _submit(client, text="The cache is down but I still speak.", seed=5)
    assert job["cached_segments"] == 0
    _finish(client, job["id"])


def test_a_partly_evicted_entry_is_a_miss_not_wrong_audio(redis_client: redis.Redis) -> None:
    cache = SentenceCache(redis_client, ttl_s=60)
    key = segment_key(model="m", version="v", voice="d", seed=None, mode="balanced", speed=1.0, text="evict me")
    audio = PackedAudio.pack(b"\x01\x02" * 100, 22050)
    cache.put(key, CachedSegment(audio, 22050, {"duration_s": 0.0}))
    assert cache.get_many([key])[0] == CachedSegment(audio, 22050, {"duration_s": 0.0})
    redis_client.hdel(key, "audio")
    assert cache.get_many([key]) == [None]
    redis_client.delete(key)
    assert cache.get_many([key]) == [None]

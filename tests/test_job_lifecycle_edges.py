"""The edges of a job's life: canceled while it runs, and how long it is kept once it ended."""

from __future__ import annotations

from typing import Any

import redis
from flask import Flask
from flask.testing import FlaskClient

from cache import keys
from cache.jobstore import JobRequest, store_of
from core.settings import load_settings
from tests.support.processes import wait_for

BOOK = "\n\n".join(f"第{i}段。这一段话要说得慢一点。" for i in range(20))


def _status(client: FlaskClient, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").get_json()
    return job


def _held_anywhere(client: redis.Redis, job_id: str) -> bool:
    """Say whether any worker still holds one of the job's segments (started, not yet written or dropped)."""
    return any(
        member.decode().startswith(f"{job_id}:")
        for holder in client.smembers(keys.HOLDERS)
        for member in client.smembers(keys.held(holder.decode()))
    )


def test_deleting_a_running_job_cancels_it_and_its_unstarted_segments_are_never_made(
    served: FlaskClient, redis_client: redis.Redis
) -> None:
    body = {"text": BOOK, "model": "chattts-tiny", "priority": "batch", "cache": False}
    job = served.post("/v1/jobs", json=body).get_json()
    total = job["segments_total"]
    assert total >= 20
    assert served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30").status_code == 200
    running = _status(served, job["id"])
    assert running["status"] == "running" and running["segments_done"] < total, running
    canceled = served.delete(f"/v1/jobs/{job['id']}")
    assert canceled.status_code == 200
    assert canceled.get_json()["status"] == "canceled"
    # What a worker had started when the cancel came may still finish; nothing after it starts.
    wait_for(lambda: not _held_anywhere(redis_client, job["id"]), 60, "the worker let go of the job's segments")
    settled = _status(served, job["id"])
    assert settled["status"] == "canceled" and settled["segments_done"] < total, settled
    assert redis_client.hlen(keys.audio(job["id"])) == settled["segments_done"]
    audio = served.get(f"/v1/jobs/{job['id']}/audio")
    assert audio.status_code == 409 and audio.get_json()["error"]["code"] == "job_failed"
    events = served.get(f"/v1/jobs/{job['id']}/events").get_data(as_text=True)
    assert "event: canceled" in events
    assert served.delete(f"/v1/jobs/{job['id']}").get_json()["status"] == "canceled", "a second DELETE is harmless"


def _ttls(client: redis.Redis, job_id: str) -> dict[str, int]:
    return {key: int(client.ttl(key)) for key in keys.all_job_keys(job_id) if client.exists(key)}


def test_a_finished_jobs_record_and_audio_expire_after_the_default_ttls(app: Flask, served: FlaskClient) -> None:
    job = served.post("/v1/jobs", json={"text": "Keep me a while. Then let go.", "cache": False}).get_json()
    wait_for(lambda: _status(served, job["id"])["status"] == "done", 30, "the job done")
    client = app.extensions["tts"].redis
    ttls = _ttls(client, job["id"])
    settings = load_settings()  # the worker's defaults: TTS_JOB_TTL_S 86400, TTS_AUDIO_TTL_S 3600
    assert settings.job_ttl_s - 60 < ttls.pop(keys.job(job["id"])) <= settings.job_ttl_s
    assert settings.audio_ttl_s - 60 < ttls.pop(keys.audio(job["id"])) <= settings.audio_ttl_s
    assert all(0 < ttl <= settings.job_ttl_s for ttl in ttls.values()), f"no key of a finished job lives on: {ttls}"


def test_the_ttls_follow_tts_job_ttl_s_and_tts_audio_ttl_s(redis_client: redis.Redis) -> None:
    settings = load_settings(job_ttl_s=900, audio_ttl_s=120)
    store = store_of(redis_client, settings)
    request = JobRequest(model="m", voice="v", speed=1.0, mode="balanced", format="pcm", priority="realtime",
                         seed=None, cache=False)  # fmt: skip
    done = store.create(request, ["only"])
    assert redis_client.ttl(keys.job(done)) == -1, "a live job does not expire"
    store.write_segment(done, 0, b"\x01\x00" * 800, sample_rate=8000, meta={"duration_s": 0.1})
    assert 840 < redis_client.ttl(keys.job(done)) <= 900
    assert 60 < redis_client.ttl(keys.audio(done)) <= 120
    canceled = store.create(request, ["never made"])
    store.cancel(canceled)
    assert redis_client.hget(keys.job(canceled), "status") == b"canceled"
    ttls = _ttls(redis_client, canceled)
    assert ttls and all(0 < ttl <= 900 for ttl in ttls.values()), ttls
    assert 840 < ttls[keys.job(canceled)] <= 900, "a canceled job's record is kept as long as a finished one's"

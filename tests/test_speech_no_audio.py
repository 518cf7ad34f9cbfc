"""/v1/audio/speech is one call returning audio: when none comes, it leaves no job running for nobody."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from flask import Flask

from cache import keys
from cache.jobstore import JobStatus, JobStore
from cache.workers import WorkerRegistry
from tests.support.apps import api_app
from tests.support.databases import spare_database

SPEECH_DB = 13


@pytest.fixture
def unserved_app(settings_env: dict[str, str]) -> Iterator[tuple[Flask, redis.Redis]]:
    """The API on a database of its own where a worker is announced by hand and none takes work: nothing is made.

    TTS_MAX_WAIT_S is 1 s instead of 30 s: these tests check what is answered when the wait runs out, not how long
    the default wait is."""
    with spare_database(settings_env["REDIS_URL"], SPEECH_DB) as url:
        client = redis.Redis.from_url(url)
        WorkerRegistry(client, ttl_s=60).beat("w-absent", {})
        app = api_app(settings_env, redis_url=url, max_wait_s=1.0)
        try:
            yield app, client
        finally:
            app.extensions["tts"].close()
            client.close()


def _only_job(client: redis.Redis) -> str:
    (job_id,) = client.zrange(keys.LIVE_JOBS, 0, -1) or [b""]
    return job_id.decode()


def test_speech_whose_first_audio_does_not_come_in_time_cancels_its_job_and_answers_503_with_retry_after(
    unserved_app: tuple[Flask, redis.Redis],
) -> None:
    app, client = unserved_app
    response = app.test_client().post("/v1/audio/speech", json={"input": "Is anyone making this?"})
    assert response.status_code == 503, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "unavailable" and "TTS_MAX_WAIT_S" in error["message"]
    assert int(response.headers["Retry-After"]) >= 1
    record = JobStore(client, ttl=600).get(error["job_id"])
    assert record is not None and record.status is JobStatus.CANCELED, "nothing is left to be made for nobody"


def test_speech_whose_job_fails_answers_the_failure_and_its_reason(unserved_app: tuple[Flask, redis.Redis]) -> None:
    app, client = unserved_app
    store = JobStore(client, ttl=600)

    def fail_the_job() -> None:  # as a worker giving up on its segment would
        deadline = time.monotonic() + 10
        while not (job_id := _only_job(client)) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the job to exist
        if job_id:
            store.fail(job_id, "segment 0 failed 2 times: engine exploded")

    failer = threading.Thread(target=fail_the_job)
    failer.start()
    response = app.test_client().post("/v1/audio/speech", json={"input": "Will this fail?", "response_format": "flac"})
    failer.join()
    assert response.status_code == 409, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "job_failed" and "engine exploded" in error["message"]

"""Job records cross the Redis boundary typed: parsed once, and a stray partial hash is no job rather than a crash."""

from __future__ import annotations

from flask import Flask

from cache import keys
from cache.jobstore import JobStore, StartState
from cache.records import JobRecord, JobRequest, JobStatus

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip


def test_a_record_parses_into_typed_fields_and_its_status_is_the_enum(app: Flask) -> None:
    store = JobStore(app.extensions["tts"].redis, ttl=600)
    job_id = store.create(REQUEST, ["First part.", "Second part."], fields={"owner": "caller-1"})
    record = store.get(job_id)
    assert record is not None
    assert record.status is JobStatus.QUEUED and not record.status.terminal
    assert record.request == REQUEST and record.owner == "caller-1"
    assert record.segments_total == 2 and record.segment_chars == (11, 12) and record.sample_rate is None
    store.cancel(job_id)
    ended = store.get(job_id)
    assert ended is not None and ended.status is JobStatus.CANCELED and ended.status.terminal
    assert ended.error == "canceled by the client" and ended.finished_at is not None


def test_a_stray_partial_record_is_no_job_to_the_api_and_to_a_worker(app: Flask) -> None:
    services = app.extensions["tts"]
    job_id = "stray0123456789"
    # What a late write to a record that expired meanwhile leaves: a hash of one or two fields.
    services.redis.hset(keys.job(job_id), mapping={"audio_removed_at": "1.0", "audio_removed_for": "memory"})
    try:
        assert JobRecord.parse({"audio_removed_at": "1.0"}) is None
        assert services.store.get(job_id) is None
        response = app.test_client().get(f"/v1/jobs/{job_id}")
        assert response.status_code == 404 and response.get_json()["error"]["code"] == "not_found"
        start = services.store.start_segment(job_id, 0, worker="w-test")
        assert start.state is StartState.GO and start.record is None, "held, then skipped by the worker"
    finally:
        services.redis.delete(*keys.all_job_keys(job_id), keys.held("w-test"))
        services.redis.srem(keys.HOLDERS, "w-test")

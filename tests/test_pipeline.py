"""Submit → long-poll segment 0 → all segments → done, through a real Celery worker and a real Redis."""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from flask import Flask
from flask.testing import FlaskClient

from cache.jobstore import JobRequest
from cache.stats import Stats
from tests.support.jobs import submit, wait_done
from tests.support.processes import wait_for

STORY_EN = (
    "The quick brown fox jumps over the lazy dog. It was a sunny morning in the valley. "
    "Birds were singing in the old oak tree. A farmer walked slowly to his field. "
    "By noon the work was done."
)
STORY_ZH = "今天天气很好。我们去公园散步吧！公园里有很多花，红的、黄的、紫的都有。孩子们在草地上玩耍。"


def decode(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    return samples, rate


@pytest.mark.parametrize(
    ("model", "text", "rate"),
    [("espeak-en", STORY_EN, 22050), ("espeak-cmn", STORY_ZH, 22050), ("chattts-tiny", STORY_ZH, 24000)],
)
def test_a_job_goes_from_submit_to_done_and_its_segments_make_the_whole_file(
    served: FlaskClient, model: str, text: str, rate: int
) -> None:
    job = submit(served, text=text, model=model)
    assert job["segments_total"] >= 2
    first = served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30")
    assert first.status_code == 200, first.get_data(as_text=True)
    assert first.mimetype == "audio/wav"
    done = wait_done(served, job["id"])
    assert done["status"] == "done", done
    assert done["segments_done"] == done["segments_total"]
    assert done["sample_rate"] == rate
    parts = []
    for index in range(done["segments_total"]):
        response = served.get(f"/v1/jobs/{job['id']}/segments/{index}")
        assert response.status_code == 200
        samples, seg_rate = decode(response.data)
        assert seg_rate == rate
        assert len(samples) / rate == pytest.approx(float(response.headers["X-Segment-Duration"]), abs=1e-3)
        assert 0.05 < len(samples) / rate < 60
        assert np.abs(samples).max() > 100, "segment is silent"
        parts.append(samples)
    whole = served.get(f"/v1/jobs/{job['id']}/audio")
    assert whole.status_code == 200
    samples, whole_rate = decode(whole.data)
    assert whole_rate == rate
    np.testing.assert_array_equal(samples, np.concatenate(parts))


@pytest.mark.parametrize(("fmt", "mimetype"), [("flac", "audio/flac"), ("ogg", "audio/ogg"), ("mp3", "audio/mpeg")])
def test_segments_are_encoded_in_the_requested_format(served: FlaskClient, fmt: str, mimetype: str) -> None:
    job = submit(served, text="Hello there. How are you today?", model="espeak-en", format=fmt)
    response = served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30")
    assert response.status_code == 200
    assert response.mimetype == mimetype
    samples, rate = decode(response.data)
    assert rate == 22050
    assert len(samples) > 2205


def test_pcm_segments_are_raw_16_bit_mono_with_the_rate_in_the_content_type(served: FlaskClient) -> None:
    job = submit(served, text="Raw audio please.", model="espeak-en", format="pcm")
    response = served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "audio/L16; rate=22050; channels=1"
    assert len(response.data) % 2 == 0
    assert len(response.data) / 2 / 22050 == pytest.approx(float(response.headers["X-Segment-Duration"]), abs=1e-3)


def _unqueued_job(app: Flask) -> dict[str, Any]:
    """Write a job straight into the store without enqueueing it, so it stays pending.

    It leaves the live-job index too: else a worker's janitor, accounting for live jobs after any worker death
    (an earlier test's), would find its segments nowhere and enqueue them, and the job would be made after all.
    """
    store = app.extensions["tts"].store
    request = JobRequest(
        model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav", priority="realtime", seed=None
    )
    job_id = store.create(request, ["Nobody will make this.", "Not yet anyway."])
    store.forget_live(job_id)
    return {"id": job_id}


def test_a_segment_that_is_not_ready_says_so(app: Flask, client: FlaskClient) -> None:
    job = _unqueued_job(app)
    response = client.get(f"/v1/jobs/{job['id']}/segments/0")
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "not_ready"
    assert response.headers["Retry-After"] == "1"
    started = time.monotonic()
    waited = client.get(f"/v1/jobs/{job['id']}/segments/0?wait=0.5")
    assert waited.status_code == 409
    assert time.monotonic() - started >= 0.45
    assert client.get(f"/v1/jobs/{job['id']}/segments/99").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}/segments/0?wait=31").status_code == 422
    assert client.get(f"/v1/jobs/{job['id']}/audio?wait=0.2").status_code == 409
    client.delete(f"/v1/jobs/{job['id']}")


def test_a_canceled_job_reports_canceled_and_its_audio_is_refused(app: Flask, client: FlaskClient) -> None:
    job = _unqueued_job(app)
    response = client.delete(f"/v1/jobs/{job['id']}")
    assert response.status_code == 200
    assert response.get_json()["status"] == "canceled"
    refused = client.get(f"/v1/jobs/{job['id']}/audio")
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "job_failed"


def test_a_job_whose_model_cannot_load_fails_with_a_reason_and_opens_no_breaker_for_other_models(
    app: Flask, served: FlaskClient
) -> None:
    stats = Stats(app.extensions["tts"].redis)
    failed_before = stats.window().failed
    job = submit(served, text="This model is broken.", model="broken-chattts")
    done = wait_done(served, job["id"], timeout=60)
    assert done["status"] == "failed"
    assert "segment 0" in done["error"] and "EngineLoadError" in done["error"]
    assert served.get("/healthz").status_code == 200
    assert stats.window().failed == failed_before, "one model that cannot load is not the engines' failure"


def test_readyz_sees_the_worker_and_says_how_each_models_decode_step_runs(served: FlaskClient) -> None:
    response = served.get("/readyz")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["workers"]
    assert wait_done(served, submit(served, text="你好。", model="chattts-tiny")["id"])["status"] == "done"

    def decode() -> str | None:
        workers = served.get("/readyz").get_json()["workers"]
        return next((w["decode"]["chattts-tiny"] for w in workers if "chattts-tiny" in w["decode"]), None)

    # At make run's default (TTS_CUDA_GRAPHS=auto) a CPU runs the eager loop; the next heartbeat says so.
    assert (
        wait_for(decode, 30, "/readyz saying how chattts-tiny decodes")
        == "growing cache, eager step (graphs auto, no GPU)"
    )


def test_chinese_numbers_are_spoken_not_dropped(served: FlaskClient) -> None:
    job = submit(served, text="今天是2024年5月1日，气温25度。", model="chattts-tiny")
    done = wait_done(served, job["id"])
    assert done["status"] == "done"
    assert done["chars_total"] > len("今天是年月日，气温度。")

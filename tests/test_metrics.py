"""After a job, the API's and the worker's /metrics carry the metrics dashboards rely on."""

from __future__ import annotations

import json
import time
import urllib.request

from flask.testing import FlaskClient

API_METRICS = [
    "tts_http_requests_total",
    "tts_http_request_seconds",
    "tts_jobs_submitted_total",
    "tts_cache_lookups_total",
    "tts_queue_depth",
    "tts_segments_outstanding",
]
WORKER_METRICS = [
    "tts_batch_size",
    "tts_synthesis_seconds",
    "tts_audio_seconds_total",
    "tts_real_time_factor",
    "tts_queue_wait_seconds",
    "tts_time_to_first_segment_seconds",
    "tts_segments_total",
    "tts_model_loads_total",
    "tts_model_load_seconds",
    "tts_models_resident",
    "tts_model_memory_mb",
]


def test_metrics_appear_after_a_job(served: FlaskClient, settings_env: dict[str, str]) -> None:
    job = served.post(
        "/v1/jobs", json={"text": "Metrics please. Two segments.", "model": "espeak-en", "seed": time.time_ns() % 10**9}
    ).get_json()
    deadline = time.monotonic() + 30
    while served.get(f"/v1/jobs/{job['id']}").get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    api = served.get("/metrics").get_data(as_text=True)
    for name in API_METRICS:
        assert f"\n{name}" in api, name
    assert 'tts_http_requests_total{method="POST",route="/v1/jobs",status="202"}' in api
    time.sleep(1.2)  # one heartbeat refreshes the model-pool gauges
    url = f"http://127.0.0.1:{settings_env['TTS_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        worker = response.read().decode()
    for name in WORKER_METRICS:
        assert f"\n{name}" in worker, name
    assert "tts_models_resident 1.0" in worker or "tts_models_resident 2.0" in worker


def test_worker_logs_are_json_with_job_ids(served: FlaskClient, worker: object) -> None:
    job = served.post("/v1/jobs", json={"text": "Log me.", "model": "espeak-en", "cache": False}).get_json()
    deadline = time.monotonic() + 30
    while served.get(f"/v1/jobs/{job['id']}").get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    lines = [
        json.loads(line)
        for line in worker.log_path.read_text().splitlines()  # type: ignore[attr-defined]
        if line.startswith("{")
    ]
    mine = [entry for entry in lines if entry.get("job_id") == job["id"]]
    assert any(entry.get("segment") == 0 and entry["outcome"] == "written" for entry in mine)
    assert any("total_s" in entry and entry["segments"] == 1 for entry in mine), "one summary line per job"

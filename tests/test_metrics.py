"""After a job, the API's and the worker's /metrics carry the metrics dashboards rely on."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from typing import Any

from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apps import api_app
from tests.support.processes import wait_for

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


def _sample(text: str, name: str, **labels: str) -> float:
    """Return the value of one sample in a Prometheus exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _worker_metrics(settings_env: dict[str, str]) -> str:
    url = f"http://127.0.0.1:{settings_env['TTS_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _finish(client: FlaskClient, body: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = client.post("/v1/jobs", json=body).get_json()
    done: dict[str, Any] = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job['id']}").get_json())["status"] == "done" and j, 30, "the job done"
    )
    return done


def test_metrics_appear_after_a_job(served: FlaskClient, settings_env: dict[str, str]) -> None:
    _finish(served, {"text": "Metrics please. Two segments.", "model": "espeak-en", "seed": time.time_ns() % 10**9})
    api = served.get("/metrics").get_data(as_text=True)
    for name in API_METRICS:
        assert f"\n{name}" in api, name
    assert 'tts_http_requests_total{method="POST",route="/v1/jobs",status="202"}' in api

    def refreshed() -> str | None:  # a heartbeat refreshes the model-pool gauges
        worker = _worker_metrics(settings_env)
        resident = _sample(worker, "tts_models_resident")
        # At least this job's model; earlier tests on the session's worker may have loaded others.
        return worker if all(f"\n{n}" in worker for n in WORKER_METRICS) and resident >= 1.0 else None

    wait_for(refreshed, 10, "the worker's metrics after a job")


def test_each_written_segment_records_its_lateness_and_each_finished_job_its_stalls(
    served: FlaskClient, settings_env: dict[str, str]
) -> None:
    before = _worker_metrics(settings_env)
    lane = {"lane": "realtime"}
    counts = {
        name: _sample(before, name, **lane)
        for name in ("tts_segment_lateness_seconds_count", "tts_job_stalls_count", "tts_job_stall_seconds_count")
    }
    job = _finish(served, {"text": "Late or early? We measure. Every segment.", "model": "espeak-en", "cache": False})
    assert job["priority"] == "realtime" and job["segments_total"] >= 2

    def counted() -> str | None:  # the summary line (and its stall figures) follows the last write
        after = _worker_metrics(settings_env)
        return after if _sample(after, "tts_job_stalls_count", **lane) >= counts["tts_job_stalls_count"] + 1 else None

    after = wait_for(counted, 10, "the job's stalls observed")
    lateness = (
        _sample(after, "tts_segment_lateness_seconds_count", **lane) - counts["tts_segment_lateness_seconds_count"]
    )
    assert lateness >= job["segments_total"], "one lateness observation per segment written"
    assert _sample(after, "tts_job_stall_seconds_count", **lane) >= counts["tts_job_stall_seconds_count"] + 1
    assert 'tts_segment_lateness_seconds_bucket{lane="realtime",le="0.0"}' in after, "early and late are told apart"


def test_a_refused_submission_is_counted_by_its_reason(settings_env: dict[str, str], worker: object) -> None:
    app = api_app(settings_env, anonymous_per_minute=1)
    try:
        client = app.test_client()
        # An address of its own: quotas live in Redis, shared with every other test's callers.
        environ = {"REMOTE_ADDR": f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.9"}
        before = _sample(
            client.get("/metrics").get_data(as_text=True), "tts_admission_rejections_total", reason="quota"
        )
        assert client.post("/v1/jobs", json={"text": "First."}, environ_base=environ).status_code == 202
        assert client.post("/v1/jobs", json={"text": "Second."}, environ_base=environ).status_code == 429
        after = _sample(client.get("/metrics").get_data(as_text=True), "tts_admission_rejections_total", reason="quota")
        assert after == before + 1
    finally:
        app.extensions["tts"].close()


def test_worker_logs_are_json_with_job_ids(served: FlaskClient, worker: object) -> None:
    job = _finish(served, {"text": "Log me.", "model": "espeak-en", "cache": False})
    log_path = worker.log_path  # type: ignore[attr-defined]

    def mine() -> list[dict[str, Any]] | None:
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        found = [entry for entry in lines if entry.get("job_id") == job["id"]]
        return found if any("total_s" in entry for entry in found) else None

    entries = wait_for(mine, 10, "the job's summary line in the worker's log")
    assert any(entry.get("segment") == 0 and entry["outcome"] == "written" for entry in entries)
    assert any("total_s" in entry and entry["segments"] == 1 for entry in entries), "one summary line per job"

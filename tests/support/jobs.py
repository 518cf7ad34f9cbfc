"""Jobs as the tests make and follow them: a plain espeak request, and submit / wait-until-ended on the test client."""

from __future__ import annotations

import time
from typing import Any

from flask.testing import FlaskClient

from cache.jobstore import JobRequest

#: A realtime espeak request, uncached: what the job-store tests store their jobs with.
REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip
#: Three short segments' texts.
TEXTS = ["First part.", "Second part.", "Third part."]


def submit(client: FlaskClient, **body: Any) -> dict[str, Any]:
    """POST ``body`` as a job; assert it was accepted (202, its Location); return the job."""
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.get_data(as_text=True)
    job: dict[str, Any] = response.get_json()
    assert job["status"] in ("queued", "running", "done")
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    return job


def wait_done(client: FlaskClient, job_id: str, timeout: float = 90) -> dict[str, Any]:
    """Poll the job until it has ended (done, failed or canceled); return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in ("done", "failed", "canceled"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished after {timeout}s: {job}")

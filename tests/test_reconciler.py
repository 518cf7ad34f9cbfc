"""Nothing is lost: stalled jobs are re-enqueued, late jobs fail, and long jobs enter the queue through a window."""

from __future__ import annotations

import time
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from cache.jobstore import JobRequest
from workers.reconciler import Reconciler


def _wait(
    client: FlaskClient, job_id: str, statuses: tuple[str, ...] = ("done",), timeout: float = 60
) -> dict[str, Any]:
    """Poll the job until it reaches one of ``statuses``; fail at once if it ends in another."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in statuses:
            return job
        assert job["status"] not in ("done", "failed", "canceled"), f"ended {job['status']}, not {statuses}: {job}"
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def _request(priority: str = "realtime") -> JobRequest:
    return JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                      priority=priority, seed=None, cache=False)  # fmt: skip


def test_a_job_written_but_never_enqueued_is_finished_by_the_reconciler(app: Flask, served: FlaskClient) -> None:
    services = app.extensions["tts"]
    # What an API killed between writing a job and enqueueing it leaves behind.
    job_id = services.store.create(_request(), ["Left behind.", "Found again."])
    reconciler = Reconciler(store=services.store, enqueue=services.enqueue, stall_s=0, deadline_s=3600)
    counts = reconciler.reconcile()
    assert counts["requeued_segments"] >= 2
    assert _wait(served, job_id)["status"] == "done"
    assert job_id not in services.store.live_jobs()


def test_a_job_past_its_deadline_fails_with_a_reason(app: Flask, client: FlaskClient) -> None:
    services = app.extensions["tts"]
    job_id = services.store.create(_request(), ["Too late."])
    reconciler = Reconciler(store=services.store, enqueue=services.enqueue, stall_s=3600, deadline_s=60)
    assert reconciler.reconcile(now=time.time() + 61)["expired"] == 1
    job = client.get(f"/v1/jobs/{job_id}").get_json()
    assert job["status"] == "failed" and "deadline" in job["error"]


def test_only_one_worker_reconciles_per_interval(app: Flask, client: FlaskClient) -> None:
    services = app.extensions["tts"]
    services.redis.delete("tts:reconciler:lock")
    reconciler = Reconciler(store=services.store, enqueue=services.enqueue, stall_s=3600, deadline_s=3600)
    assert reconciler.run_once(holder="a", interval_s=5) is not None
    assert reconciler.run_once(holder="b", interval_s=5) is None
    services.redis.delete("tts:reconciler:lock")


def test_a_long_batch_job_enters_the_queue_through_a_window_and_still_finishes(app: Flask, served: FlaskClient) -> None:
    text = "\n\n".join(f"Paragraph number {i} is short." for i in range(12))
    job = served.post("/v1/jobs", json={"text": text, "model": "espeak-en", "priority": "batch",
                                        "cache": False}).get_json()  # fmt: skip
    assert job["segments_total"] >= 12  # one per paragraph (the first may be cut short)
    assert _wait(served, job["id"])["segments_done"] == job["segments_total"]


def test_a_second_book_gets_its_first_segment_before_the_first_book_ends(served: FlaskClient) -> None:
    first_book = "\n\n".join(f"第{i}段。这是第一本书的一段文字。" for i in range(16))
    second_book = "\n\n".join(f"第{i}段。第二本书。" for i in range(4))
    body = {"model": "chattts-tiny", "priority": "batch", "cache": False}
    first = served.post("/v1/jobs", json={"text": first_book, **body}).get_json()
    second = served.post("/v1/jobs", json={"text": second_book, **body}).get_json()
    assert served.get(f"/v1/jobs/{second['id']}/segments/0?wait=30").status_code == 200
    assert served.get(f"/v1/jobs/{first['id']}").get_json()["status"] != "done", "the second book waited for all"
    assert _wait(served, first["id"], timeout=120)["segments_done"] == first["segments_total"]
    assert _wait(served, second["id"], timeout=120)["segments_done"] == second["segments_total"]


def test_the_reconciler_prunes_deadline_entries_of_jobs_that_ended(app: Flask, served: FlaskClient) -> None:
    services = app.extensions["tts"]
    job_id = services.store.create(_request(), ["Never made."])
    services.book.add(job_id, {0: time.time() - 600})  # long overdue
    services.store.fail(job_id, "failed for the test")
    reconciler = Reconciler(store=services.store, enqueue=services.enqueue, stall_s=60, deadline_s=3600,
                            book=services.book)  # fmt: skip
    assert reconciler.reconcile()["unscheduled"] >= 1
    assert services.book.due_by(time.time() - 500) == 0

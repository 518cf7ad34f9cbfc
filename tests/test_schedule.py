"""Playback deadlines: when a listener needs each segment, and the books the scheduler keeps in Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from cache import keys
from cache.jobstore import JobRequest, JobStore, SegmentStart, StartState
from cache.stats import Stats
from core.policy import SchedulingPolicy
from core.schedule import DeadlinePolicy, admission_excess, playback_stalls, priority_step, timeline
from devstack.processes import wait_for
from devstack.redis_server import RedisServer
from tests.support.databases import spare_database
from workers.arrivals import FirstArrivals
from workers.segment import Outcome, SegmentSynthesizer

POLICY = DeadlinePolicy(first_audio_s=1.0, batch_delay_s=60.0, batch_stretch=2.0)


def test_segment_zero_is_due_at_acceptance_and_the_rest_when_the_listener_reaches_them() -> None:
    plan = timeline(lane="realtime", accepted_at=100.0, chars=[10, 20, 30], seconds_per_char=0.2, policy=POLICY)
    # The listener starts at the first-audio estimate (101) and plays 2 s, then 4 s.
    assert plan.deadlines(now=100.0) == [100.0, 103.0, 107.0]


def test_real_arrivals_and_durations_replace_the_estimates() -> None:
    plan = timeline(lane="realtime", accepted_at=100.0, chars=[10, 20, 30], seconds_per_char=0.2, policy=POLICY)
    plan.arrived(0, 100.5, 3.0)  # segment 0 came early and runs 3 s, not 2
    assert plan.deadline(1) == pytest.approx(103.5)
    assert plan.deadline(2) == pytest.approx(107.5)


def test_a_late_segment_moves_the_later_deadlines_back_with_the_paused_listener() -> None:
    plan = timeline(lane="realtime", accepted_at=100.0, chars=[10, 10, 10], seconds_per_char=0.2, policy=POLICY)
    plan.arrived(0, 101.0, 2.0)
    plan.arrived(1, 110.0, 2.0)  # due at 103: the listener waited until 110
    assert plan.deadline(2) == pytest.approx(112.0)


def test_batch_lane_deadlines_are_looser() -> None:
    realtime = timeline(lane="realtime", accepted_at=0.0, chars=[10, 10], seconds_per_char=0.2, policy=POLICY)
    batch = timeline(lane="batch", accepted_at=0.0, chars=[10, 10], seconds_per_char=0.2, policy=POLICY)
    assert batch.deadlines(now=0.0) == [60.0, 61.0 + 2 * 2.0]
    assert all(b > r for b, r in zip(batch.deadlines(now=0.0), realtime.deadlines(now=0.0), strict=True))


def test_before_its_first_audio_a_jobs_later_deadlines_follow_the_clock_but_only_for_a_while() -> None:
    plan = timeline(lane="realtime", accepted_at=100.0, chars=[10, 10], seconds_per_char=0.2, policy=POLICY)
    assert plan.deadline(1, now=110.0) == pytest.approx(112.0), "not started at 110: needed no earlier than 112"
    assert plan.deadline(1, now=10_000.0) == pytest.approx(101.0 + 30.0 + 2.0), "then fixed, so it cannot starve"


def test_the_listener_model_counts_stalls_and_their_length() -> None:
    assert playback_stalls([10.0, 11.0, 13.0], [2.0, 1.0, 1.0]) == (0, 0.0)
    assert playback_stalls([10.0, 14.0, 15.0], [2.0, 1.0, 1.0]) == (1, 2.0)


def test_the_broker_step_follows_the_slack() -> None:
    assert priority_step(100.0, now=100.0) == 0
    assert priority_step(130.0, now=100.0) == 6
    assert priority_step(1000.0, now=100.0) == 9


def _wait(client: FlaskClient, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in ("done", "failed", "canceled"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def test_an_accepted_job_states_its_deadline_and_start_estimate_and_leaves_the_books_when_done(
    app: Flask, served: FlaskClient
) -> None:
    services = app.extensions["tts"]
    answer = served.post("/v1/jobs", json={"text": "One sentence. And another one after it.", "model": "espeak-en",
                                           "cache": False})  # fmt: skip
    assert answer.status_code == 202
    job = answer.get_json()
    assert job["first_due_at"] == pytest.approx(job["created_at"], abs=0.01), "realtime: due at acceptance"
    assert job["start_estimate_s"] >= 0
    assert _wait(served, job["id"])["status"] == "done"
    members = [m.decode() for m in services.redis.zrange(keys.DUE, 0, -1)]
    assert not [m for m in members if m.startswith(job["id"])], "written segments leave the deadline books"
    meta = services.store.segment_meta(job["id"])
    assert all("lateness_s" in m and "finished_at" in m for m in meta.values())


def test_a_batch_lane_job_is_due_later_and_accepted_with_a_start_estimate(app: Flask, served: FlaskClient) -> None:
    answer = served.post("/v1/jobs", json={"text": "A chapter of a book.", "model": "espeak-en", "priority": "batch",
                                           "cache": False})  # fmt: skip
    assert answer.status_code == 202
    job = answer.get_json()
    assert job["first_due_at"] == pytest.approx(job["created_at"] + 60.0, abs=0.01)
    assert isinstance(job["start_estimate_s"], float)
    assert _wait(served, job["id"])["status"] == "done"


class _VanishingStore(JobStore):
    """A real job store whose job is deleted just before a worker reads it, as an expiry or a cleanup can do."""

    def start_segment(
        self, job_id: str, index: int, *, worker: str = "", token: str | None = None, known: bool = False
    ) -> SegmentStart:
        self.redis.delete(*keys.all_job_keys(job_id))
        return super().start_segment(job_id, index, worker=worker, token=token, known=known)


class _UnusedBackend:
    def synthesize(self, *_: object, **__: object) -> tuple[Any, int]:
        raise AssertionError("a segment of a vanished job must not reach the engine")


#: A two-segment realtime job on the offline model.
REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip


def _synthesizer(
    services: Any, store: JobStore, backend: object, *, worker: str = "test", arrivals: FirstArrivals | None = None
) -> SegmentSynthesizer:
    """Return a worker's segment synthesizer on the app's services, with ``store`` and ``backend``; the tests run
    each segment themselves, so nothing is enqueued."""
    return SegmentSynthesizer(
        store=store,
        cache=services.cache,
        stats=Stats(services.redis),
        enqueue=lambda *_args, **_kwargs: None,
        registry=services.registry,
        backend=backend,  # type: ignore[arg-type]
        max_attempts=2,
        worker=worker,
        book=services.book,
        policy=SchedulingPolicy(deadlines=POLICY),
        arrivals=arrivals,
    )


def test_a_segment_whose_job_vanishes_as_it_is_read_is_skipped_and_leaves_no_key(app: Flask) -> None:
    services = app.extensions["tts"]
    store = _VanishingStore(services.redis, ttl=600)
    job_id = store.create(REQUEST, ["First part.", "Second part."])
    synthesizer = _synthesizer(services, store, _UnusedBackend())
    assert synthesizer.run(job_id, 1) is Outcome.SKIPPED
    assert not services.redis.exists(*keys.all_job_keys(job_id)), "no attempt counter without a job"


def test_a_later_segment_is_ordered_early_only_once_its_jobs_first_segment_has_arrived(app: Flask) -> None:
    services = app.extensions["tts"]
    store = JobStore(services.redis, ttl=600)
    job_id = store.create(REQUEST, ["First part.", "Second part."])
    backend = _EarlyRecordingBackend()
    synthesizer = _synthesizer(services, store, backend)
    assert synthesizer.run(job_id, 1) is Outcome.WRITTEN  # the second first: its listener has nothing yet
    (second_early,) = backend.early
    assert callable(second_early) and not second_early(), "no listener plays yet: nothing to stall"
    assert synthesizer.run(job_id, 0) is Outcome.WRITTEN
    assert backend.early[1] is False, "a first segment is never early: it gets the first segment's priority"
    assert second_early(), "the job's timeline is shared: its first segment arrived, so its listener plays"


class _EarlyRecordingBackend:
    """Answers with a short waveform and records the ``early`` each segment was submitted with."""

    def __init__(self) -> None:
        self.early: list[object] = []

    def synthesize(self, *_: object, early: object = False, **__: object) -> tuple[Any, int]:
        self.early.append(early)
        return np.zeros(2400, dtype=np.float32), 24000


@pytest.fixture
def unserved(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """Return a client of a database of the test Redis that no running worker serves: its jobs stay as a test
    leaves them (a worker's janitor would hand their unpublished segments to the broker)."""
    with spare_database(redis_server.url, 9) as url:
        client = redis.Redis.from_url(url)
        yield client
    client.close()


def test_a_later_segment_waiting_on_one_worker_learns_at_once_that_another_worker_wrote_its_first(
    app: Flask, unserved: redis.Redis
) -> None:
    services = app.extensions["tts"]
    store = JobStore(unserved, ttl=600)
    job_id = store.create(REQUEST, ["First part.", "Second part."])
    arrivals = FirstArrivals(unserved, store.segment_meta_one)
    waiting = _HeldBackend()
    here = _synthesizer(services, store, waiting, worker="here", arrivals=arrivals)
    elsewhere = _synthesizer(services, store, _EarlyRecordingBackend(), worker="elsewhere")
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(here.run, job_id, 1)  # read before its first segment is written: nothing to count from
        early, due = wait_for(lambda: waiting.submitted, 5, "the second segment waits for its engine call")[0]
        assert not early() and arrivals.following() == 1

        assert elsewhere.run(job_id, 0) is Outcome.WRITTEN  # another worker writes the first
        wait_for(early, 5, "the waiting segment learns that its listener plays")
        first = store.segment_meta_one(job_id, 0)
        assert due() == pytest.approx(first["finished_at"] + first["duration_s"]), (
            "it is due when the listener ends the first segment, as that worker wrote it"
        )
        waiting.release.set()
        assert second.result(10) is Outcome.WRITTEN
    wait_for(lambda: arrivals.following() == 0, 5, "the follow ended with the arrival")


def test_a_follow_of_a_first_segment_ends_with_its_job_or_after_its_limit(unserved: redis.Redis) -> None:
    store = JobStore(unserved, ttl=600)
    arrivals = FirstArrivals(unserved, store.segment_meta_one, limit_s=1.0, idle_s=0.2)
    canceled, forgotten = (store.create(REQUEST, ["First part.", "Second part."]) for _ in range(2))
    plans = [timeline(lane="realtime", accepted_at=time.time(), chars=[11, 12], seconds_per_char=0.1, policy=POLICY)
             for _ in range(2)]  # fmt: skip
    arrivals.follow(canceled, plans[0], stretch=1.0)
    arrivals.follow(forgotten, plans[1], stretch=1.0)
    assert arrivals.following() == 2
    store.cancel(canceled)
    wait_for(lambda: arrivals.following() == 1, 5, "the canceled job's follow ended with its status event")
    wait_for(lambda: arrivals.following() == 0, 5, "the other's ended after its limit, with nothing written")
    assert not plans[0].started() and not plans[1].started()
    wait_for(lambda: not any(t.name == "first-arrivals" for t in threading.enumerate()), 5, "its thread ends idle")


class _HeldBackend:
    """Holds each segment (as a busy engine would) until ``release`` is set; records its ``early`` and deadline."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Any, Any]] = []
        self.release = threading.Event()

    def synthesize(self, *_: object, deadline: Any = None, early: Any = False, **__: object) -> tuple[Any, int]:
        self.submitted.append((early, deadline))
        self.release.wait(10)
        return np.zeros(2400, dtype=np.float32), 24000


def test_starting_a_segment_reads_its_job_counts_the_attempt_and_marks_the_job_running(app: Flask) -> None:
    store = JobStore(app.extensions["tts"].redis, ttl=600)
    request = REQUEST
    job_id = store.create(request, ["First part.", "Second part."])
    first = store.start_segment(job_id, 1)
    assert first.state is StartState.GO
    assert first.request == request
    assert first.text == "Second part.", "its own text, never the job's whole list"
    assert first.chars == [11, 12], "and, read whole once, every segment's length"
    assert first.attempt == 1 and first.meta == {}
    assert first.record is not None and first.record.status == "queued"  # as read; the job is running from now on
    record = store.get(job_id)
    assert record is not None and record.status == "running"
    assert store.start_segment(job_id, 1).attempt == 2

    store.write_segment(job_id, 0, b"\0\0", sample_rate=24000, meta={"duration_s": 0.5, "finished_at": 1.0})
    assert store.start_segment(job_id, 0).state is StartState.WRITTEN
    assert store.start_segment(job_id, 1).meta == {0: {"duration_s": 0.5, "finished_at": 1.0}}
    known = store.start_segment(job_id, 1, known=True)
    assert known.text == "Second part." and known.meta == {0: {"duration_s": 0.5, "finished_at": 1.0}}
    assert known.chars is None and known.request == request, "a worker that knows the job gets a few fields"
    store.cancel(job_id)
    assert store.start_segment(job_id, 1).state is StartState.OVER
    assert store.attempts(job_id, 1) == 4, "an ended job's segments count no more attempts"
    assert store.start_segment("no-such-job", 0).state is StartState.GONE


def test_admitting_a_job_costs_nothing_when_the_engines_can_make_every_segment_by_its_deadline() -> None:
    assert admission_excess(100.0, [101.0, 102.0], [103.0], segment_s=1.0, allowance_s=0.0, by_deadline=True) == 0
    assert admission_excess(100.0, [], [], segment_s=1.0, allowance_s=0.0, by_deadline=True) == 0


def test_a_new_job_runs_in_deadline_order_and_may_not_make_an_admitted_segment_late_whatever_the_allowance() -> None:
    # The new segment (due now) runs first, so the admitted ones due at 101 and 102 are made 1 s late.
    assert admission_excess(100.0, [101.0, 102.0], [100.0], segment_s=1.0, allowance_s=0.0, by_deadline=True) == 1
    assert admission_excess(100.0, [101.0, 102.0], [100.0], segment_s=1.0, allowance_s=0.75, by_deadline=True) == 1
    # Admitted work due later keeps its slack: the newcomer waits for nothing and delays nobody past a deadline.
    assert admission_excess(100.0, [103.0, 104.0], [100.0], segment_s=1.0, allowance_s=0.0, by_deadline=True) == 0


def test_the_allowance_is_how_much_later_than_alone_a_new_job_may_be_made() -> None:
    ahead = [99.0, 99.5]  # two segments due already run first: the new one is made 2 s later than alone
    assert admission_excess(100.0, ahead, [100.0], segment_s=1.0, allowance_s=0.5, by_deadline=True) == 1.5
    assert admission_excess(100.0, ahead, [100.0], segment_s=1.0, allowance_s=2.0, by_deadline=True) == 0


def test_under_fifo_a_new_job_waits_behind_every_admitted_segment_whatever_their_deadlines() -> None:
    # Admitted work due late runs first: the new segment due now waits 2 s for it.
    assert admission_excess(100.0, [150.0, 160.0], [100.0], segment_s=1.0, allowance_s=0.0, by_deadline=False) == 2
    assert admission_excess(100.0, [150.0, 160.0], [100.0], segment_s=1.0, allowance_s=0.0, by_deadline=True) == 0


def test_a_margin_asks_for_room_to_spare_on_the_new_job_and_every_segment_it_delays_but_not_on_the_others() -> None:
    ahead = [99.0, 99.5]  # the new segment is made 2 s later than alone: 0.5 s within a 2.5 s allowance
    assert admission_excess(100.0, ahead, [100.0], segment_s=1.0, allowance_s=2.5, by_deadline=True) == 0
    assert admission_excess(100.0, ahead, [100.0], segment_s=1.0, allowance_s=2.5, by_deadline=True, margin_s=1) == 0.5
    # An admitted segment due in 1.5 s is made 0.5 s early behind the newcomer: a 1 s margin is 0.5 s short.
    assert admission_excess(100.0, [101.5], [100.0], segment_s=0.5, allowance_s=9, by_deadline=True, margin_s=1) == 0.5
    # The same segment due first is not delayed by the newcomer: it is not weighed, however close it runs.
    assert admission_excess(100.0, [100.5], [101.0], segment_s=0.5, allowance_s=9, by_deadline=True, margin_s=1) == 0
    # A stream already late is only never delayed further; the margin is room on deadlines, not on that.
    assert admission_excess(100.0, [97.0], [130.0], segment_s=1.0, allowance_s=1, by_deadline=True, margin_s=1) == 0


def test_a_job_late_on_an_idle_service_is_still_let_in_alone() -> None:
    # A model slower than its listener: 2 s a segment, both due within a second. Alone, that is nobody's doing.
    assert admission_excess(100.0, [], [100.0, 100.5], segment_s=2.0, allowance_s=0.5, by_deadline=True) == 0


def test_a_stream_already_late_closes_the_door_only_to_jobs_that_would_wait_behind_it_too_long() -> None:
    behind = [97.0, 97.0, 97.0]  # three segments its listener has waited 3 s for: they run first
    assert admission_excess(100.0, behind, [130.0], segment_s=1.0, allowance_s=1.0, by_deadline=True) == 0
    assert admission_excess(100.0, behind, [100.0], segment_s=1.0, allowance_s=1.0, by_deadline=True) == 2
    # Segments outside the weighed window that run before everything count as work ahead.
    assert admission_excess(100.0, [], [100.0], segment_s=1.0, allowance_s=0.5, by_deadline=True, before=3) == 2.5


def test_a_segment_is_ready_one_engine_call_after_its_turn_comes() -> None:
    # An admitted segment due in 0.3 s is made at 0.1 + 0.5 s alone, and 0.1 s later behind the newcomer.
    with_call = admission_excess(100.0, [100.3], [100.0], segment_s=0.1, allowance_s=1, by_deadline=True, call_s=0.5)
    assert with_call == pytest.approx(0.1)
    assert admission_excess(100.0, [100.3], [100.0], segment_s=0.1, allowance_s=1, by_deadline=True) == 0

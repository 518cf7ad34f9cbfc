"""Nothing accepted is lost: kill workers, model hosts and Redis mid-work, and feed the engine poison.

Each scenario builds its own stack (Redis with AOF, real workers, the API app),
submits a known set of jobs, injects one fault, then audits every accepted job:
done with each segment exactly once and a gap-free resumed event stream, or
failed with a reason where the input itself was poison. Each writes one row to
bench/results/chaos.jsonl (`make chaos` prints the table).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from cache import keys
from cache.jobstore import OUTBOX_GRACE_S, JobRequest
from celery_config import SYNTHESIZE_TASK
from core.settings import load_settings
from devstack.worker import WorkerProcess
from tests.chaos.audit import Audit, audit_jobs
from tests.chaos.conftest import MakeStack
from tests.chaos.stack import Stack
from tests.support.servers import free_port
from workers.celery_app import create_celery

pytestmark = pytest.mark.chaos

MAX_ATTEMPTS = 3  # TTS_SEGMENT_MAX_ATTEMPTS's default
#: The hang scenario's one shortened timer: a hung model host is killed after this long (default 300 s).
TIME_LIMIT_S = 12
#: Long enough for a dead worker's heartbeat to expire (6 s) and a fresh worker to start, several times over.
RECOVERY_S = 60
JOB_REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                         priority="realtime", seed=7, cache=False)  # fmt: skip
LONG = "The quick brown fox jumps over the lazy dog near the river bank while the farmer watches from his porch"


def workload(*, jobs: int = 10, model: str = "espeak-en", first_seed: int = 0) -> list[dict[str, Any]]:
    """Return job bodies of 3 to 6 segments each, with distinct seeds, uncached."""
    bodies = []
    for i in range(jobs):
        segments = 3 + i % 4
        text = f"Job {first_seed + i} begins now. " + " ".join(f"{LONG} number {j}." for j in range(1, segments))
        bodies.append({"text": text, "model": model, "cache": False, "seed": first_seed + i})
    return bodies


def submit(stack: Stack, bodies: list[dict[str, Any]]) -> list[str]:
    """Submit jobs that must all be accepted; return their ids."""
    return [view["id"] for view in stack.submit_all(bodies)]


def conclude(audit: Audit, stack: Stack, *, poisoned: frozenset[str] = frozenset()) -> None:
    """Record the scenario's row, then insist on nothing lost, nothing repeated, and only poison failing."""
    audit.record()
    logs = f"\n(stack and worker logs in {stack.workdir})"
    assert not audit.problems, "\n".join(audit.problems) + logs
    assert set(audit.failures) == poisoned, f"failed: {audit.failures}, poisoned: {set(poisoned)}{logs}"
    assert audit.done + audit.failed == audit.accepted


def run_to_end(
    stack: Stack,
    scenario: str,
    job_ids: list[str],
    started: float,
    *,
    timeout: float = RECOVERY_S,
    headers: Mapping[str, str] | Mapping[str, Mapping[str, str]] | None = None,
    fault_at: float | None = None,
) -> Audit:
    """Wait for every job to end, then audit them all.

    The row's seconds run from ``started`` (monotonic) until then; its recovery times from ``fault_at``
    (epoch seconds) until each job that was still unfinished then ended.
    """
    stack.wait_terminal(job_ids, timeout)
    seconds = time.monotonic() - started
    audit = audit_jobs(scenario, stack.client(), stack.redis, job_ids, headers=headers)
    audit.seconds = seconds
    if fault_at is not None:
        audit.recovered_from(fault_at)
    return audit


def _in_flight(stack: Stack, worker: WorkerProcess) -> tuple[list[str], float, int, int]:
    """Submit the standard workload with the worker's models paused, then wait until part of it is in flight;
    return the job ids, when they were submitted (monotonic), and the segments written and attempted by then."""
    started = time.monotonic()
    with stack.models_paused(worker):
        job_ids = submit(stack, workload())
    written, attempted = stack.wait_in_flight(job_ids)
    return job_ids, started, written, attempted


def test_a_worker_killed_mid_batch_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    first = stack.start_worker()
    job_ids, started, written, attempted = _in_flight(stack, first)
    fault_at = time.time()
    stack.kill_worker(first, signal.SIGKILL)
    stack.start_worker()  # what the worker's supervisor does
    audit = run_to_end(stack, "a. worker SIGKILL mid-batch", job_ids, started, fault_at=fault_at)
    audit.notes = f"killed at {written} written, {attempted - written} in flight; a replacement started at once"
    conclude(audit, stack)


def test_a_model_host_killed_mid_batch_is_restarted_and_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    worker = stack.start_worker()
    host = stack.host_pid(worker, "espeak-en")
    job_ids, started, written, attempted = _in_flight(stack, worker)
    fault_at = time.time()
    stack.kill_host(host)
    audit = run_to_end(stack, "b. model host SIGKILL (GPU OOM)", job_ids, started, fault_at=fault_at)
    restarted = stack.host_pid(worker, "espeak-en")
    assert restarted != host
    audit.notes = f"killed at {written} written, {attempted - written} in flight; worker survived"
    assert worker.process is not None and worker.process.poll() is None, "the worker died with its model host"
    conclude(audit, stack)


def test_a_worker_stopped_during_work_hands_its_segments_over(make_stack: MakeStack) -> None:
    stack = make_stack()
    old = stack.start_worker()
    job_ids, started, written, attempted = _in_flight(stack, old)
    stack.start_worker(wait=False)  # the replacement starts while the old one drains
    stopping, fault_at = time.monotonic(), time.time()
    stack.kill_worker(old, signal.SIGTERM)
    drained_s = time.monotonic() - stopping
    audit = run_to_end(stack, "c. worker SIGTERM (rolling restart)", job_ids, started, fault_at=fault_at)
    assert old.process is not None and old.process.returncode == 0, old.log_tail()
    audit.notes = f"stopped at {written} written, {attempted - written} in flight; drained in {drained_s:.1f} s"
    conclude(audit, stack)


def test_redis_killed_and_restarted_from_its_aof_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    worker = stack.start_worker()
    job_ids, started, written, attempted = _in_flight(stack, worker)
    fault_at = time.time()
    stack.redis_server.kill()
    status, _, headers = stack.submit(stack.client(), workload(jobs=1, first_seed=100)[0])
    assert status == 503 and "Retry-After" in headers, "a job was accepted while Redis was down"
    time.sleep(2)  # an outage, not a blip
    stack.redis_server.restart()
    audit = run_to_end(stack, "d. Redis SIGKILL + restart (AOF)", job_ids, started, fault_at=fault_at)
    # Celery can stop a worker for good on the reconnect ("Unrecoverable error", kombu's redis transport);
    # it must then exit non-zero, so that its supervisor (stack.supervise here) starts another.
    exits = ", ".join(f"worker exited {code}" + (", restarted" if code else "") for _, code in stack.exits)
    audit.notes = f"killed at {written} written, {attempted - written} in flight; down 2 s; {exits or 'worker lived'}"
    conclude(audit, stack)
    assert all(code != 0 for _, code in stack.exits), f"a worker stopped with status 0: {worker.log_tail()}"


def test_jobs_written_but_never_enqueued_are_published_from_the_outbox(make_stack: MakeStack) -> None:
    stack = make_stack()
    stack.start_worker()
    started, fault_at = time.monotonic(), time.time()
    job_ids = [
        stack.write_unqueued([f"Orphan {i} speaks.", *(f"{LONG} part {j}." for j in range(1, 3 + i % 4))], seed=i)
        for i in range(10)
    ]
    audit = run_to_end(stack, "e. API died between write and enqueue", job_ids, started, fault_at=fault_at)
    audit.notes = f"published from the outbox after its {OUTBOX_GRACE_S:g} s grace"
    conclude(audit, stack)


def test_a_burst_of_ten_times_capacity_gets_only_202_429_or_503_and_every_accepted_job_ends(
    make_stack: MakeStack,
) -> None:
    api_keys = [f"burst-{i}-0123456789abcdef" for i in range(3)]
    stack = make_stack(admission_realtime_wait_s=2, api_keys=",".join(f"{key}=60" for key in api_keys))
    stack.start_worker()
    bodies = workload(jobs=300, first_seed=1000)
    answers: list[tuple[int, str, bool]] = []
    key_of: dict[str, dict[str, str]] = {}  # job id → the key that submitted it: only that key may read the job
    lock = threading.Lock()

    def post(offset: int) -> None:
        client = stack.client()
        for i in range(offset, len(bodies), 10):
            key = api_keys[i % len(api_keys)]
            response = client.post("/v1/jobs", json=bodies[i], headers={"X-API-Key": key})
            job = response.get_json(silent=True) or {}
            with lock:
                answers.append((response.status_code, job.get("id", ""), "Retry-After" in response.headers))
                key_of[job.get("id", "")] = {"X-API-Key": key}

    started = time.monotonic()
    threads = [threading.Thread(target=post, args=(offset,)) for offset in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    submit_s = time.monotonic() - started
    codes = Counter(code for code, _, _ in answers)
    job_ids = [job_id for code, job_id, _ in answers if code == 202]
    audit = run_to_end(stack, "f. burst of 300 jobs (10x capacity)", job_ids, started, timeout=120,
                       headers=key_of)  # fmt: skip
    audit.notes = f"answers {dict(sorted(codes.items()))} in {submit_s:.1f} s"
    assert set(codes) <= {202, 429, 503}, codes
    assert codes[429] > 0, "the quota never refused anything"
    assert all(retry for code, _, retry in answers if code != 202), "a refusal without Retry-After"
    conclude(audit, stack)


def _poison_scenario(make_stack: MakeStack, scenario: str, marker: str, *, bound_s: float) -> None:
    """Submit one poisoned job among normal ones on the faulty model; it alone fails, in bounded time."""
    # The reconciler must not take a segment queued behind a hung call for a stalled one: its copies
    # would count as attempts and fail healthy jobs. So here the stall exceeds the longest legitimate
    # wait (one hung call ahead, then its own: twice the time limit).
    stack = make_stack(worker_env={"TTS_TASK_TIME_LIMIT_S": str(TIME_LIMIT_S)})
    stack.start_worker()
    bodies = workload(model="faulty", first_seed=2000)
    bodies[0] = {**bodies[0], "text": f"Poison begins now. {LONG} says {marker} here. {LONG} ends it."}
    started = time.monotonic()
    job_ids = submit(stack, bodies)
    poison = job_ids[0]
    audit = run_to_end(stack, scenario, job_ids, started, timeout=bound_s + 30)
    record = stack.record(poison)
    failed_at = float(record.get("finished_at", "inf")) - float(record["created_at"])
    attempts = stack.attempts(poison)
    time.sleep(3)  # long enough for one more lap of a retry loop, had there been one
    later = stack.attempts(poison)
    audit.notes = (
        f"poison failed after {failed_at:.0f} s (bound {bound_s:.0f}), attempts {attempts}: "
        f"{record.get('error', '')[:60]}; shortened: task time limit {TIME_LIMIT_S} s (default 300 s)"
    )
    conclude(audit, stack, poisoned=frozenset({poison}))
    assert later == attempts, f"the poison job is still being retried after it failed: {attempts} → {later}"
    assert failed_at <= bound_s, f"the poison job took {failed_at:.0f} s to fail (bound {bound_s:.0f} s)"
    assert max(attempts.values()) <= MAX_ATTEMPTS + 1, attempts


def test_an_engine_that_hangs_on_one_input_fails_that_job_in_bounded_time_and_no_other(make_stack: MakeStack) -> None:
    _poison_scenario(make_stack, "g. engine hangs on poison input", "HANG-ME", bound_s=MAX_ATTEMPTS * TIME_LIMIT_S + 24)


def test_an_engine_that_dies_on_one_input_fails_that_job_and_no_other(make_stack: MakeStack) -> None:
    _poison_scenario(make_stack, "h. engine dies on poison input", "CRASH-ME", bound_s=30)


def test_the_audit_counts_a_missing_segment_as_lost(make_stack: MakeStack) -> None:
    stack = make_stack()
    stack.start_worker()
    (job_id,) = submit(stack, workload(jobs=1))
    stack.wait_terminal([job_id], 30)
    stack.redis.hdel(keys.audio(job_id), "1")
    audit = audit_jobs("self-check", stack.client(), stack.redis, [job_id])
    assert (audit.done, audit.lost) == (0, 1)


def _metric(port: int, name: str) -> float:
    """Return one sample of a worker's Prometheus metrics (0 when it has none yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return found[0] if found else 0.0


def test_a_message_delivered_twice_is_one_attempt_and_one_segment(make_stack: MakeStack) -> None:
    port = free_port()
    stack = make_stack(worker_env={"TTS_METRICS_PORT": str(port)})
    worker = stack.start_worker()
    celery = create_celery(load_settings(redis_url=stack.redis_server.url))
    texts = [f"Twice told {i}. {LONG}." for i in range(4)]
    duplicates = 'tts_segments_total{outcome="duplicate"}'
    before = _metric(port, duplicates), _metric(port, "tts_segment_redeliveries_total")
    started, fault_at = time.monotonic(), time.time()
    with stack.models_paused(worker):
        job_id = stack.store.create(JOB_REQUEST, texts)
        for index in range(len(texts)):
            for _ in range(2):  # the same message twice, as kombu's restore or a double publish sends it
                celery.send_task(
                    SYNTHESIZE_TASK, args=[job_id, index], queue="realtime", task_id=f"dup-{job_id}-{index}"
                )
        deadline = time.monotonic() + 30
        while _metric(port, "tts_segment_redeliveries_total") - before[1] < len(texts):
            assert time.monotonic() < deadline, "the second copies never reached the worker"
            time.sleep(0.05)
    audit = run_to_end(stack, "i. the same task delivered twice", [job_id], started, fault_at=fault_at)
    duplicate_outcomes = _metric(port, duplicates) - before[0]
    redelivered = _metric(port, "tts_segment_redeliveries_total") - before[1]
    attempts = stack.attempts(job_id)
    audit.notes = (
        f"{len(texts)} segments sent twice each: {redelivered:.0f} redeliveries seen, {duplicate_outcomes:.0f} "
        f"duplicates skipped or refused, attempts {attempts}"
    )
    conclude(audit, stack)
    assert redelivered == len(texts)
    assert duplicate_outcomes == len(texts), "the second copy of each segment was not taken for a duplicate"
    assert attempts == dict.fromkeys(range(len(texts)), 1), "a redelivery of the same attempt was counted again"


def _read_events(stream: Any, wanted: int) -> list[tuple[str, str]]:
    """Read (event, id) pairs from an open SSE response until ``wanted`` segment events (or the end) arrive."""
    seen: list[tuple[str, str]] = []
    buffer = ""
    for chunk in stream.response:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "event" in lines:
                seen.append((lines["event"], lines.get("id", "")))
        if sum(1 for event, _ in seen if event == "segment") >= wanted or any(e != "segment" for e, _ in seen):
            break
    return seen


def test_a_listener_that_drops_its_stream_mid_job_resumes_with_last_event_id_and_misses_nothing(
    make_stack: MakeStack,
) -> None:
    stack = make_stack()
    worker = stack.start_worker()
    (job_id,) = submit(stack, [workload(jobs=4)[3]])  # 6 segments
    total = int(stack.record(job_id)["segments_total"])
    client = stack.client()
    first = client.get(f"/v1/jobs/{job_id}/events", buffered=False)
    heard = _read_events(first, 2)
    host = stack.host_pid(worker, "espeak-en")
    started, fault_at = time.monotonic(), time.time()
    os.kill(host, signal.SIGSTOP)  # the job is still running while the listener is away
    try:
        first.close()  # the listener drops its connection
        last_id = [i for event, i in heard if event == "segment"][-1]
        assert stack.record(job_id)["status"] != "done"
        resumed = client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": last_id}, buffered=False)
    finally:
        os.kill(host, signal.SIGCONT)
    rest = _read_events(resumed, total)
    resumed.close()
    audit = run_to_end(stack, "j. SSE listener drops mid-job, resumes with Last-Event-ID", [job_id], started,
                       fault_at=fault_at)  # fmt: skip
    ids = [int(i) for event, i in heard + rest if event == "segment"]
    audit.notes = f"heard {ids[: len(heard)]} before dropping, then {ids[len(heard) :]} and {rest[-1][0]!r}"
    conclude(audit, stack)
    assert ids == list(range(total)), f"the listener heard {ids}"
    assert rest[-1][0] == "done", rest[-1]

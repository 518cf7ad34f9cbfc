"""Nothing accepted is lost: kill workers, model hosts and Redis mid-work, and feed the engine poison.

Each scenario builds its own stack (Redis with AOF, real workers, the API app),
submits a known set of jobs, injects one fault, then audits every accepted job:
done with each segment exactly once and a gap-free resumed event stream, or
failed with a reason where the input itself was poison. Each writes one row to
bench/results/chaos.jsonl (`make chaos` prints the table).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest

from cache import keys
from tests.chaos.audit import Audit, audit_jobs
from tests.chaos.conftest import MakeStack
from tests.chaos.stack import Stack

pytestmark = pytest.mark.chaos

MAX_ATTEMPTS = 3  # TTS_SEGMENT_MAX_ATTEMPTS in the stack's worker settings
TIME_LIMIT_S = 12  # TTS_TASK_TIME_LIMIT_S: a hung model host is killed after this long
#: Long enough for the reconciler (4 s stall, 1 s interval) and a fresh worker (about 2 s) twice over.
RECOVERY_S = 60
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
    headers: dict[str, str] | None = None,
) -> Audit:
    """Wait for every job to end (the row's seconds run from ``started`` until then), then audit them all."""
    stack.wait_terminal(job_ids, timeout)
    seconds = time.monotonic() - started
    audit = audit_jobs(scenario, stack.client(), stack.redis, job_ids, headers=headers)
    audit.seconds = seconds
    return audit


def test_a_worker_killed_mid_batch_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    first = stack.start_worker()
    started = time.monotonic()
    with stack.models_paused(first):
        job_ids = submit(stack, workload())
    written, attempted = stack.wait_in_flight(job_ids)
    stack.kill_worker(first, signal.SIGKILL)
    stack.start_worker()
    audit = run_to_end(stack, "a. worker SIGKILL mid-batch", job_ids, started)
    audit.notes = f"killed at {written} written, {attempted - written} in flight"
    conclude(audit, stack)


def test_a_model_host_killed_mid_batch_is_restarted_and_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    worker = stack.start_worker()
    host = stack.host_pid(worker, "espeak-en")
    started = time.monotonic()
    with stack.models_paused(worker):
        job_ids = submit(stack, workload())
    written, attempted = stack.wait_in_flight(job_ids)
    stack.kill_host(host)
    audit = run_to_end(stack, "b. model host SIGKILL (GPU OOM)", job_ids, started)
    restarted = stack.host_pid(worker, "espeak-en")
    assert restarted != host
    audit.notes = f"killed at {written} written, {attempted - written} in flight; worker survived"
    assert worker.process is not None and worker.process.poll() is None, "the worker died with its model host"
    conclude(audit, stack)


def test_a_worker_stopped_during_work_hands_its_segments_over(make_stack: MakeStack) -> None:
    stack = make_stack()
    old = stack.start_worker()
    started = time.monotonic()
    with stack.models_paused(old):
        job_ids = submit(stack, workload())
    written, attempted = stack.wait_in_flight(job_ids)
    stack.start_worker(wait=False)  # the replacement starts while the old one drains
    stopping = time.monotonic()
    stack.kill_worker(old, signal.SIGTERM)
    drained_s = time.monotonic() - stopping
    audit = run_to_end(stack, "c. worker SIGTERM (rolling restart)", job_ids, started)
    assert old.process is not None and old.process.returncode == 0, old.log_tail()
    audit.notes = f"stopped at {written} written, {attempted - written} in flight; drained in {drained_s:.1f} s"
    conclude(audit, stack)


def test_redis_killed_and_restarted_from_its_aof_loses_nothing(make_stack: MakeStack) -> None:
    stack = make_stack()
    worker = stack.start_worker()
    started = time.monotonic()
    with stack.models_paused(worker):
        job_ids = submit(stack, workload())
    written, attempted = stack.wait_in_flight(job_ids)
    stack.redis_server.kill()
    status, _, headers = stack.submit(stack.client(), workload(jobs=1, first_seed=100)[0])
    assert status == 503 and "Retry-After" in headers, "a job was accepted while Redis was down"
    time.sleep(2)  # an outage, not a blip
    stack.redis_server.restart()
    audit = run_to_end(stack, "d. Redis SIGKILL + restart (AOF)", job_ids, started)
    # Celery can stop a worker for good on the reconnect ("Unrecoverable error", kombu's redis transport);
    # it must then exit non-zero, so that its supervisor (stack.supervise here) starts another.
    exits = ", ".join(f"worker exited {code}" + (", restarted" if code else "") for _, code in stack.exits)
    audit.notes = f"killed at {written} written, {attempted - written} in flight; down 2 s; {exits or 'worker lived'}"
    conclude(audit, stack)
    assert all(code != 0 for _, code in stack.exits), f"a worker stopped with status 0: {worker.log_tail()}"


def test_jobs_written_but_never_enqueued_are_finished_by_the_reconciler(make_stack: MakeStack) -> None:
    stack = make_stack()
    stack.start_worker()
    started = time.monotonic()
    job_ids = [
        stack.write_unqueued([f"Orphan {i} speaks.", *(f"{LONG} part {j}." for j in range(1, 3 + i % 4))], seed=i)
        for i in range(10)
    ]
    audit = run_to_end(stack, "e. API died between write and enqueue", job_ids, started)
    audit.notes = "found by the reconciler (stall 4 s)"
    conclude(audit, stack)


def test_a_burst_of_ten_times_capacity_gets_only_202_429_or_503_and_every_accepted_job_ends(
    make_stack: MakeStack,
) -> None:
    api_keys = [f"burst-{i}" for i in range(3)]
    stack = make_stack(admission_realtime_wait_s=2, api_keys=",".join(f"{key}=60" for key in api_keys))
    stack.start_worker()
    bodies = workload(jobs=300, first_seed=1000)
    answers: list[tuple[int, str, bool]] = []
    lock = threading.Lock()

    def post(offset: int) -> None:
        client = stack.client()
        for i in range(offset, len(bodies), 10):
            key = api_keys[i % len(api_keys)]
            response = client.post("/v1/jobs", json=bodies[i], headers={"X-API-Key": key})
            job = response.get_json(silent=True) or {}
            with lock:
                answers.append((response.status_code, job.get("id", ""), "Retry-After" in response.headers))

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
                       headers={"X-API-Key": api_keys[0]})  # fmt: skip
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
    stack = make_stack(worker_env={"TTS_RECONCILE_STALL_S": str(2 * TIME_LIMIT_S + 1)})
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
        f"{record.get('error', '')[:60]}"
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

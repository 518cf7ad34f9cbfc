"""Admission by estimated wait, and a circuit breaker shared through Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from api import create_app
from api.admission import Admission
from cache.breaker import CircuitBreaker
from cache.stats import Stats
from cache.workers import WorkerRegistry
from core.errors import ServiceUnavailable
from core.settings import load_settings

QUEUES = ("test-realtime", "test-batch")


@pytest.fixture
def queues(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """Return the client, with the stand-in lane lists emptied before and after."""
    redis_client.delete(*QUEUES)
    yield redis_client
    redis_client.delete(*QUEUES)


def _breaker(client: redis.Redis, cooldown_s: float = 1.1) -> CircuitBreaker:
    return CircuitBreaker(client, Stats(client), failure_rate=0.5, min_failures=3, cooldown_s=cooldown_s)


def test_the_breaker_opens_when_no_worker_is_alive_and_half_opens_after_cooling_down(
    redis_client: redis.Redis,
) -> None:
    breaker = _breaker(redis_client)
    verdict = breaker.check(workers_alive=0)
    assert not verdict.allowed and verdict.reason == "no worker is alive" and verdict.retry_after >= 1
    assert not breaker.check(workers_alive=1).allowed, "still cooling down"
    time.sleep(1.2)
    assert breaker.check(workers_alive=1).allowed, "one trial passes"
    assert not breaker.check(workers_alive=1).allowed, "others wait for the trial"
    Stats(redis_client).record(ok=1)  # the trial's segment succeeded
    assert breaker.check(workers_alive=1).allowed
    assert breaker.state()[0] == "closed"


def test_the_breaker_opens_on_a_high_failure_rate_and_a_failed_trial_reopens_it(redis_client: redis.Redis) -> None:
    breaker, stats = _breaker(redis_client), Stats(redis_client)
    stats.record(ok=2)
    stats.record(failed=2)
    assert breaker.check(workers_alive=1).allowed, "below the minimum number of failures"
    stats.record(failed=2)
    verdict = breaker.check(workers_alive=1)
    assert not verdict.allowed and "failed" in verdict.reason
    time.sleep(1.2)
    assert breaker.check(workers_alive=1).allowed  # the trial
    stats.record(failed=1)
    assert not breaker.check(workers_alive=1).allowed
    assert breaker.state()[0] == "open"


def test_the_breaker_state_is_shared_by_every_replica(redis_client: redis.Redis) -> None:
    _breaker(redis_client, cooldown_s=30).check(workers_alive=0)
    assert not _breaker(redis_client, cooldown_s=30).check(workers_alive=1).allowed


def test_admission_refuses_a_lane_whose_estimated_wait_is_over_its_limit(queues: redis.Redis) -> None:
    workers = WorkerRegistry(queues, ttl_s=5)
    workers.beat("w1", {})
    alive = len(workers.alive())  # the session's real worker may be alive too: capacity scales with workers
    settings = load_settings(admission_realtime_wait_s=10 / alive, admission_batch_wait_s=200 / alive)
    stats = Stats(queues)
    admission = Admission(queues, stats=stats, breaker=_breaker(queues), workers=workers, settings=settings,
                          queues=QUEUES)  # fmt: skip
    admission.admit("realtime")  # nothing known yet: admit
    stats.record(chars=200, busy_s=2.0, segments=10)  # 100 chars/s, 20 chars per segment
    queues.rpush(QUEUES[0], *["x"] * 40)  # 40 segments = 800 chars = 8 s
    assert admission.estimated_wait_s("realtime", workers_alive=alive) == pytest.approx(8.0 / alive)
    admission.admit("realtime")
    queues.rpush(QUEUES[1], *["x"] * 500)
    admission.admit("batch")  # 540 segments → 108 s: under 200
    queues.rpush(QUEUES[0], *["x"] * 20)
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime")
    assert refused.value.retry_after >= 1
    assert "realtime" in refused.value.message
    workers.remove("w1")


def test_with_no_worker_alive_the_api_answers_503_with_retry_after(settings_env: dict[str, str]) -> None:
    isolated = settings_env["REDIS_URL"].rsplit("/", 1)[0] + "/3"  # a database no worker announces itself in
    redis.Redis.from_url(isolated).flushdb()
    app = create_app(
        {
            "redis_url": isolated,
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "espeak-en",
        }
    )
    response = app.test_client().post("/v1/jobs", json={"text": "Is anyone there?"})
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    assert app.test_client().get("/readyz").status_code == 503
    redis.Redis.from_url(isolated).flushdb()

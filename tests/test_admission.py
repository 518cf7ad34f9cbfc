"""Admission by the listeners' deadlines and by estimated wait, and a circuit breaker shared through Redis."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask

from api.admission import FIRST_AUDIO_WINDOW_S, KEPT_FOR_RETRIES, Admission
from cache import keys
from cache.breaker import CircuitBreaker
from cache.refusals import EARLY_S, Refusals
from cache.schedule import ScheduleBook
from cache.stats import API_MAX_AGE_S, Stats, Window
from cache.workers import WorkerRegistry
from core.errors import ServiceUnavailable
from core.policy import scheduling_policy
from core.settings import Settings, load_settings
from tests.support.apps import api_app
from tests.support.databases import spare_database
from tests.support.processes import wait_for

QUEUES = ("test-realtime", "test-batch")


@pytest.fixture
def queues(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """Return the client, with the stand-in lane lists emptied before and after."""
    redis_client.delete(*QUEUES)
    yield redis_client
    redis_client.delete(*QUEUES)


@pytest.fixture
def quiet(settings_env: dict[str, str]) -> Iterator[redis.Redis]:
    """Return a client of a Redis database of its own, emptied before and after: no live worker records segment
    outcomes in its statistics, which a breaker's trial reads (a segment of an earlier test, made as this one runs,
    would close a half-open breaker early)."""
    with spare_database(settings_env["REDIS_URL"], 4) as url:
        client = redis.Redis.from_url(url)
        yield client
        client.close()


def _breaker(client: redis.Redis, cooldown_s: float = 1.1) -> CircuitBreaker:
    return CircuitBreaker(client, Stats(client), failure_rate=0.5, min_failures=3, cooldown_s=cooldown_s)


def test_while_no_worker_is_alive_jobs_are_refused_and_the_first_after_one_is_back_passes(quiet: redis.Redis) -> None:
    breaker = _breaker(quiet, cooldown_s=30)
    verdict = breaker.check(workers_alive=0)
    assert not verdict.allowed and verdict.reason == "no worker is alive" and verdict.retry_after == 5
    assert breaker.check(workers_alive=1).allowed, "no cool-down: a restarted worker serves at once"
    assert breaker.state()[0] == "closed"
    breaker._set("open", "no worker is alive")  # as an earlier version left it
    assert breaker.check(workers_alive=1).allowed and breaker.state()[0] == "closed"


def test_an_open_breaker_lets_one_trial_through_after_cooling_down_and_closes_when_it_succeeds(
    quiet: redis.Redis,
) -> None:
    breaker, stats = _breaker(quiet), Stats(quiet)
    stats.record(failed=4)
    assert not breaker.check(workers_alive=1).allowed
    opened = time.monotonic()
    assert not breaker.check(workers_alive=1).allowed, "still cooling down"
    wait_for(lambda: breaker.check(workers_alive=1).allowed, 5, "one trial passes once cooled down")
    assert time.monotonic() - opened >= 1.0, "not before the cooldown"
    assert not breaker.check(workers_alive=1).allowed, "others wait for the trial"
    Stats(quiet).record(ok=1)  # the trial's segment succeeded
    assert breaker.check(workers_alive=1).allowed
    assert breaker.state()[0] == "closed"


def test_the_breaker_opens_on_a_high_failure_rate_and_a_failed_trial_reopens_it(quiet: redis.Redis) -> None:
    breaker, stats = _breaker(quiet), Stats(quiet)
    stats.record(ok=2)
    stats.record(failed=2)
    assert breaker.check(workers_alive=1).allowed, "below the minimum number of failures"
    stats.record(failed=2)
    verdict = breaker.check(workers_alive=1)
    assert not verdict.allowed and "failed" in verdict.reason
    opened = time.monotonic()
    wait_for(lambda: breaker.check(workers_alive=1).allowed, 5, "the trial once cooled down")
    assert time.monotonic() - opened >= 1.0, "not before the cooldown"
    stats.record(failed=1)
    assert not breaker.check(workers_alive=1).allowed
    assert breaker.state()[0] == "open"


def test_the_breaker_state_is_shared_by_every_replica(quiet: redis.Redis) -> None:
    Stats(quiet).record(failed=4)
    assert not _breaker(quiet, cooldown_s=30).check(workers_alive=1).allowed
    quiet.delete(*quiet.keys(keys.STATS + "*"))  # the failures are gone; the open state is not
    assert not _breaker(quiet, cooldown_s=30).check(workers_alive=1).allowed


@pytest.fixture
def book(redis_client: redis.Redis) -> Iterator[ScheduleBook]:
    """Return a schedule book on keys of its own, emptied before and after."""
    found = ScheduleBook(redis_client, default_seconds_per_char=0.2, due_key="test:due", pace_key="test:pace")
    redis_client.delete("test:due", "test:pace")
    yield found
    redis_client.delete("test:due", "test:pace")


def _admission(client: redis.Redis, book: ScheduleBook, **settings: object) -> tuple[Admission, Stats, int]:
    workers = WorkerRegistry(client, ttl_s=5)
    workers.beat("w1", {})
    alive = len(workers.alive())  # the session's real worker may be alive too: capacity scales with workers
    stats = Stats(client)
    loaded = load_settings(**{"admission_retry_margin_s": 0.0, **settings})  # the checks alone, unless asked
    admission = Admission(stats=stats, breaker=_breaker(client), workers=workers, book=book, settings=loaded,
                          policy=scheduling_policy(loaded), refusals=Refusals(client))  # fmt: skip
    return admission, stats, alive


def test_admission_counts_only_the_work_due_before_the_new_job_and_refuses_past_the_limit(
    queues: redis.Redis, book: ScheduleBook
) -> None:
    admission, stats, alive = _admission(
        queues, book, admission_realtime_wait_s=10.0, admission_batch_wait_s=10_000, admission_lateness_s=0
    )
    now = time.time()
    assert admission.admit("realtime", [now]) == 0.0, "nothing known yet: admit"
    stats.record(chars=200, busy_s=2.0, segments=10)  # 100 chars/s, 20 chars per segment
    book.add("old", {i: now - 1 for i in range(40 * alive)})  # 40 segments per worker due already: 8 s
    book.add("book", {i: now + 600 + i for i in range(500)})  # a book's later segments: not ahead of a due one
    assert admission.estimated_wait_s(now, hosts=alive) == pytest.approx(8.0)
    admission.admit("realtime", [now])
    book.add("newer", {i: now - 0.5 for i in range(20 * alive)})  # 20 more per worker: 12 s
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now])
    assert refused.value.retry_after >= 1
    assert "realtime" in refused.value.message
    estimate = admission.admit("batch", [now + 3600])  # a batch job is accepted with its start estimate
    assert estimate == pytest.approx((60 * alive + 500) * 20 / (100 * alive))
    WorkerRegistry(queues, ttl_s=5).remove("w1")


def test_a_realtime_job_that_would_make_an_admitted_stream_late_is_refused_with_an_honest_retry_after(
    queues: redis.Redis, book: ScheduleBook
) -> None:
    admission, stats, alive = _admission(queues, book, admission_lateness_s=0.5)
    stats.record(chars=200, busy_s=2.0, segments=10, calls=10)
    step, call = admission.pace(hosts=alive)
    now = time.time()
    # A playing stream whose 20 segments the engines can just make in time, one after another.
    book.add("playing", {i: now + (i + 1) * step + 1.0 for i in range(20)})
    admission.admit("realtime", [now])  # one more segment due now: the stream slips by one step, within 0.5 s
    crowd = [now + i * step for i in range(int(2.0 / step))]  # 2 s of work due at once: it slips by 2 s
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", crowd)
    excess = refused.value.details["estimated_excess_s"]
    # The playing stream's last segment: 2 s of work go before it, it had 1 s of slack, and gets no allowance.
    assert excess == pytest.approx(2.0 - 1.0 + call, abs=2 * step)
    assert refused.value.retry_after == max(1, math.ceil(excess)), "the time the engines need to catch up"
    assert "TTS_ADMISSION_LATENESS_S" in refused.value.message
    assert admission.admit("batch", crowd) >= 0, "the batch lane yields instead: refused only past its wait limit"
    WorkerRegistry(queues, ttl_s=5).remove("w1")


def test_a_segment_counts_as_heard_once_its_call_makes_its_first_fragment_not_when_the_call_ends(
    queues: redis.Redis, book: ScheduleBook
) -> None:
    admission, stats, alive = _admission(queues, book, admission_lateness_s=0.5)
    assert Window(busy_s=8.0, calls=4).seconds_to_audio == 2.0, "workers that do not say: the whole call"
    stats.record(chars=200, busy_s=8.0, segments=10, calls=4, heard_s=1.2)  # calls of 2 s, heard after 0.3 s
    step, heard = admission.pace(hosts=alive)
    assert heard == pytest.approx(0.3), "calls' seconds to their first fragments, per call"
    now = time.time()
    # A playing stream's next segment, due a little after two steps and a first fragment: with a newcomer due now
    # run before it, it is still heard in time (counted as made only at its call's end, 2 s, it was late already,
    # and the newcomer would have made it later).
    book.add("playing", {0: now + 2 * step + heard + 0.05})
    admission.admit("realtime", [now])
    WorkerRegistry(queues, ttl_s=5).remove("w1")


def test_a_stream_already_late_runs_first_and_closes_the_door_only_to_jobs_that_would_wait_behind_it(
    queues: redis.Redis, book: ScheduleBook
) -> None:
    admission, stats, alive = _admission(queues, book, admission_lateness_s=1.0)
    stats.record(chars=200, busy_s=2.0, segments=10)
    step = admission.segment_s(hosts=alive)
    now = time.time()
    book.add("stalled", {i: now - 3.0 for i in range(int(3.0 / step))})  # 3 s of work its listener waits for
    admission.admit("realtime", [now + 30])  # a job due later runs after it and delays nobody
    with pytest.raises(ServiceUnavailable):
        admission.admit("realtime", [now])  # a job due now would wait 3 s behind it
    book.remove("stalled", range(int(3.0 / step)))
    admission.admit("realtime", [now])
    book.add("stuck", {0: now - 3600})  # a stuck stream's entry (the janitor ends it) is one segment of work
    admission.admit("realtime", [now])
    WorkerRegistry(queues, ttl_s=5).remove("w1")


def test_with_fifo_scheduling_every_outstanding_segment_is_ahead(queues: redis.Redis, book: ScheduleBook) -> None:
    admission, stats, alive = _admission(queues, book, scheduler="fifo")
    stats.record(chars=200, busy_s=2.0, segments=10)
    now = time.time()
    book.add("later", {i: now + 600 for i in range(30)})
    assert admission.estimated_wait_s(now, hosts=alive) == pytest.approx(6.0 / alive)
    WorkerRegistry(queues, ttl_s=5).remove("w1")


@pytest.fixture
def paced(settings_env: dict[str, str]) -> Iterator[tuple[str, redis.Redis]]:
    """Return a Redis database of its own (URL and client) with one worker written by hand, whose engines make
    100 characters a second; emptied before and after."""
    with spare_database(settings_env["REDIS_URL"], 3) as isolated:  # no real worker announces itself here
        client = redis.Redis.from_url(isolated)
        WorkerRegistry(client, ttl_s=30).beat("w1", {})
        Stats(client).record(chars=200, busy_s=2.0, segments=10, ok=10)
        yield isolated, client
        client.close()


def test_a_reader_with_a_max_age_asks_redis_who_is_alive_at_most_that_often(quiet: redis.Redis) -> None:
    """The API asks at every submission; a beat or a death counts half a second later at most, as the stats do."""
    writer = WorkerRegistry(quiet, ttl_s=5)
    reader = WorkerRegistry(quiet, ttl_s=5, max_age_s=API_MAX_AGE_S)
    assert reader.alive() == []
    writer.beat("w-new", {})
    assert reader.alive() == [], "answered from the list read just now"
    assert WorkerRegistry(quiet, ttl_s=5).alive()[0]["hostname"] == "w-new", "a reader without a max age asks each time"
    wait_for(lambda: [w["hostname"] for w in reader.alive()] == ["w-new"], 2, "the beat counts once the list is old")
    writer.remove("w-new")
    wait_for(lambda: reader.alive() == [], 2, "and so does a worker's leaving")


def test_with_no_worker_alive_the_api_answers_503_with_retry_after(settings_env: dict[str, str]) -> None:
    isolated = settings_env["REDIS_URL"].rsplit("/", 1)[0] + "/3"  # a database no worker announces itself in
    redis.Redis.from_url(isolated).flushdb()
    app = api_app(settings_env, redis_url=isolated)
    response = app.test_client().post("/v1/jobs", json={"text": "Is anyone there?"})
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    assert app.test_client().get("/readyz").status_code == 503
    redis.Redis.from_url(isolated).flushdb()


def test_an_overloaded_api_answers_a_realtime_job_503_with_retry_after_and_the_delay_it_would_cause(
    settings_env: dict[str, str], paced: tuple[str, redis.Redis]
) -> None:
    isolated, client = paced
    now = time.time()
    ScheduleBook(client, default_seconds_per_char=0.2).add("behind", {i: now for i in range(50)})  # 10 s due now
    app = api_app(settings_env, redis_url=isolated, admission_lateness_s=1.0)
    response = app.test_client().post("/v1/jobs", json={"text": "Am I let in?"})
    assert response.status_code == 503
    error = response.get_json()["error"]
    assert error["code"] == "unavailable" and error["estimated_excess_s"] > 8
    assert int(response.headers["Retry-After"]) == math.ceil(error["estimated_excess_s"])
    batch = app.test_client().post("/v1/jobs", json={"text": "Am I let in?", "priority": "batch"})
    assert batch.status_code == 202, "the batch lane is not refused while its own wait limit holds"


def test_the_stats_window_sums_every_bucket_in_it_and_none_before_since(redis_client: redis.Redis) -> None:
    stats = Stats(redis_client)
    now = int(time.time())
    redis_client.hset(keys.stats(now - 5), mapping={"chars": 7, "busy_s": 0.125, "failed": 1})
    redis_client.hset(keys.stats(now - 70), mapping={"chars": 1000})  # outside the minute
    stats.record(chars=10, busy_s=0.25, segments=2, ok=2)
    window = stats.window()
    assert (window.chars, window.busy_s, window.segments, window.ok, window.failed) == (17, 0.375, 2, 2, 1)
    assert stats.window(since=now - 2).chars == 10
    assert Stats(redis_client).window(since=now + 5) == Window()


def test_the_stats_between_two_times_sum_the_buckets_holding_them_and_none_outside(redis_client: redis.Redis) -> None:
    base = int(time.time()) - 100  # seconds no live worker records into
    for second, chars in ((base, 1), (base + 1, 10), (base + 2, 100), (base + 3, 1000)):
        redis_client.hset(keys.stats(second), mapping={"chars": chars, "calls": 1, "segments": 2})
    window = Stats(redis_client).between(base + 1.5, base + 2.25)
    assert (window.chars, window.calls, window.segments) == (110, 2, 4)
    assert Stats(redis_client).between(base + 3.5, base + 1.5) == Window(), "an end before the start sums nothing"


def test_a_reader_given_a_max_age_answers_from_the_window_it_summed_that_recently_and_sums_again_after(
    redis_client: redis.Redis, app: Flask
) -> None:
    base = int(time.time()) - 100  # seconds no live worker records into
    redis_client.hset(keys.stats(base), mapping={"chars": 5})
    reader = Stats(redis_client, max_age_s=60)
    assert reader.between(base, base + 1).chars == 5
    redis_client.hset(keys.stats(base + 1), mapping={"chars": 7})
    assert reader.between(base, base + 1).chars == 5, "kept: not summed again within its max age"
    assert reader.between(base, base + 2).chars == 12, "another span is summed"
    assert Stats(redis_client).between(base, base + 1).chars == 12, "a reader without a max age always sums"
    reader.max_age_s = 0.000_001
    assert reader.between(base, base + 1).chars == 12, "past its max age it sums again"
    assert app.extensions["tts"].admission.stats.max_age_s == API_MAX_AGE_S, "the API's admission reads so"


def _paced_admission(client: redis.Redis, stats: Stats, loaded: Settings, **parts: Any) -> Admission:
    """Return an admission reading ``stats`` (first segments written by hand) under ``loaded`` settings."""
    return Admission(stats=stats, breaker=_breaker(client), workers=WorkerRegistry(client, ttl_s=30),
                     book=ScheduleBook(client, default_seconds_per_char=0.2), settings=loaded,
                     policy=scheduling_policy(loaded), **parts)  # fmt: skip


def test_a_realtime_job_is_refused_when_recent_first_segments_say_its_own_would_take_longer_than_the_limit(
    paced: tuple[str, redis.Redis],
) -> None:
    isolated, client = paced  # first segments written by hand
    stats = Stats(client)
    loaded = load_settings(redis_url=isolated, admission_first_audio_s=1.0, admission_retry_margin_s=0)
    admission = _paced_admission(client, stats, loaded)
    now = time.time()
    stats.record(first_chars=20, first_s=2.0)
    stats.record(first_chars=20, first_s=2.0)
    assert admission.admit("realtime", [now], first_chars=20) == 0.0, "two first segments say too little yet"
    stats.record(first_chars=10, first_s=1.0)  # 5 s for 50 characters: 0.1 s each
    assert admission.estimated_first_audio_s(20) == pytest.approx(2.0)
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now], first_chars=20)
    assert refused.value.details["estimated_first_audio_s"] == pytest.approx(2.0)
    assert refused.value.retry_after == FIRST_AUDIO_WINDOW_S, "by then the estimate reads other first segments"
    assert "TTS_ADMISSION_FIRST_AUDIO_S" in refused.value.message
    with pytest.raises(ServiceUnavailable) as longer:
        admission.admit("realtime", [now], first_chars=80)
    assert longer.value.retry_after == 8, "a first segment longer to make than the window: its own estimate"
    admission.admit("realtime", [now], first_chars=8)  # a shorter first segment is made within the limit
    admission.admit("realtime", [now], first_chars=0)  # its first segment is cached: nothing to make
    admission.admit("batch", [now + 60], first_chars=20)  # the batch lane is not held to first audio
    off = _paced_admission(client, stats, load_settings(redis_url=isolated, admission_first_audio_s=0))
    off.admit("realtime", [now], first_chars=20)  # 0 turns it off


def test_on_engines_slower_than_the_limit_a_first_segment_is_judged_against_one_made_alone(
    paced: tuple[str, redis.Redis],
) -> None:
    isolated, client = paced
    stats = Stats(client)
    loaded = load_settings(redis_url=isolated, admission_retry_margin_s=0)
    assert loaded.admission_first_audio_s == 1.0, "on by default"
    admission = _paced_admission(client, stats, loaded)
    now = time.time()
    stats.record(chars=20, busy_s=5.0, segments=1, calls=1, solo_chars=20, solo_s=5.0)  # a big model on CPUs
    for _ in range(3):
        stats.record(first_chars=20, first_s=5.5)
    admission.admit("realtime", [now], first_chars=20)  # 5.5 s, but only 0.5 s longer than alone
    for _ in range(6):
        stats.record(first_chars=20, first_s=8.0)  # now sharing its calls with others'
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now], first_chars=20)
    assert "longer than alone" in refused.value.message


def test_each_variant_s_first_audio_is_judged_by_its_own_recent_first_segments(
    paced: tuple[str, redis.Redis],
) -> None:
    isolated, client = paced
    stats = Stats(client)
    loaded = load_settings(redis_url=isolated, admission_first_audio_s=1.0, admission_retry_margin_s=0)
    admission = _paced_admission(client, stats, loaded)
    now = time.time()
    for _ in range(3):
        stats.record(first_chars=20, first_s=4.0, model="big")  # 0.2 s a character
        stats.record(first_chars=20, first_s=0.4, model="big@fast")  # 0.02 s a character
    window = stats.window(seconds=FIRST_AUDIO_WINDOW_S)
    assert window.firsts == 6 and window.of("big@fast").firsts == 3 and window.of("unheard").firsts == 0
    admission.admit("realtime", [now], first_chars=20, model="big@fast")  # 0.4 s: its own pace, not the mix's
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now], first_chars=20, model="big")
    assert refused.value.details["estimated_first_audio_s"] == pytest.approx(4.0)
    # A variant that made too few first segments lately is judged by every model's.
    assert admission.estimated_first_audio_s(20, "big@quality") == pytest.approx(2.2)
    # A variant slower than the limit alone is held to the limit beyond its own alone pace, not another's.
    stats.record(chars=20, busy_s=3.9, segments=1, calls=1, solo_chars=20, solo_s=3.9, model="big")
    stats.record(chars=20, busy_s=0.1, segments=1, calls=1, solo_chars=20, solo_s=0.1, model="big@fast")
    assert admission.alone_first_audio_s(20, "big") == pytest.approx(3.9)
    assert admission.alone_first_audio_s(20, "big@fast") == pytest.approx(0.1)
    admission.admit("realtime", [now], first_chars=20, model="big")  # 4.0 s: 0.1 s longer than alone


def test_the_api_passes_the_first_segments_length_to_the_first_audio_check(settings_env: dict[str, str]) -> None:
    isolated = settings_env["REDIS_URL"].rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(isolated)
    client.flushdb()
    WorkerRegistry(client, ttl_s=30).beat("w1", {})
    for _ in range(3):
        Stats(client).record(first_chars=10, first_s=2.0)  # 0.2 s a character
    app = api_app(settings_env, redis_url=isolated, admission_first_audio_s=1.0)
    response = app.test_client().post("/v1/jobs", json={"text": "Am I let in at all?"})
    assert response.status_code == 503
    error = response.get_json()["error"]
    assert error["estimated_first_audio_s"] > 1.0
    assert int(response.headers["Retry-After"]) == max(
        FIRST_AUDIO_WINDOW_S, math.ceil(error["estimated_first_audio_s"])
    )
    assert app.test_client().post("/v1/jobs", json={"text": "Hi."}).status_code == 202, "a short one is made in time"
    client.flushdb()


def test_a_refused_request_counts_as_a_retry_once_and_only_when_it_comes_back_after_its_retry_after(
    redis_client: redis.Redis,
) -> None:
    redis_client.delete(keys.REFUSALS_PENDING)
    refusals, now = Refusals(redis_client), time.time()
    refusals.remember("ip-a", "digest", retry_after_s=5, now=now, pending=True)
    key = keys.refusal("ip-a", "digest")
    assert 0 < redis_client.ttl(key) <= 5 + 30, "forgotten by itself past its Retry-After and a grace"
    assert refusals.redeem("ip-a", "digest", now=now + 1) == (False, 1), "too soon: a newcomer, the retry awaited"
    assert refusals.redeem("ip-b", "digest", now=now + 5) == (False, 1), "another caller's same request"
    assert refusals.redeem("ip-a", "other", now=now + 5) == (False, 1), "the caller's other request"
    assert refusals.redeem("ip-a", "digest", now=now + 5 - EARLY_S) == (True, 0), "a little early counts (whole s)"
    assert refusals.redeem("ip-a", "digest", now=now + 6) == (False, 0), "a retry counts once"
    assert not redis_client.exists(key)
    refusals.remember("ip-a", "margin", retry_after_s=1, now=now, pending=False)  # refused for the margin alone
    refusals.remember("ip-b", "gone", retry_after_s=1, now=now, pending=True)  # a retry that never comes
    assert refusals.redeem("ip-c", "new", now=now) == (False, 1), "only want of capacity is awaited"
    assert refusals.redeem("ip-c", "new", now=now + 1 + 30 + 0.01) == (False, 0), "awaited no longer than remembered"
    redis_client.delete(keys.REFUSALS_PENDING, keys.refusal("ip-a", "margin"), keys.refusal("ip-b", "gone"))


def test_a_newcomer_must_leave_the_margin_kept_for_retries_and_the_same_request_after_its_retry_after_may_use_it(
    queues: redis.Redis, book: ScheduleBook
) -> None:
    admission, stats, alive = _admission(queues, book, admission_lateness_s=0.5, admission_retry_margin_s=0.25)
    stats.record(chars=200, busy_s=2.0, segments=10, calls=10)
    step = admission.segment_s(hosts=alive)
    now = time.time()
    # Work due before a newcomer's first segment that makes it 0.1 s short of its 0.5 s allowance: within the
    # allowance, not within the margin.
    ahead = round(0.4 / step)
    book.add("ahead", {i: now - 1 for i in range(ahead)})
    assert admission.excess_s_if_admitted([now], hosts=alive, now=now) == 0, "within the allowance"
    excess = admission.excess_s_if_admitted([now], hosts=alive, now=now, margin_s=0.25)
    assert 0 < excess < 0.25, "the case under test: refused for the margin alone"
    asker = ("ip-a", "digest-1")
    queues.delete(keys.REFUSALS_PENDING)
    admission.admit("realtime", [now], asker=("ip-c", "below-capacity"))  # no refusal awaits a retry: no margin
    Refusals(queues).remember("ip-z", "refused", retry_after_s=5, now=now, pending=True)  # for want of capacity
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now], asker=asker)
    assert refused.value.retry_after == 1 and "kept for retries" in refused.value.message
    assert refused.value.details[KEPT_FOR_RETRIES] == 0.25
    with pytest.raises(ServiceUnavailable):
        admission.admit("realtime", [now], asker=asker)  # sent again at once, before its Retry-After: a newcomer
    with pytest.raises(ServiceUnavailable):
        admission.admit("realtime", [now], asker=("ip-b", "digest-2"))  # another newcomer
    # The first try was refused 5 s ago and told to come back after 1 s.
    Refusals(queues).remember(*asker, retry_after_s=1, now=now - 5, pending=False)
    admission.admit("realtime", [now], asker=asker)
    with pytest.raises(ServiceUnavailable):
        admission.admit("realtime", [now], asker=asker)  # the retry was let in once: a newcomer again
    assert Refusals(queues).redeem("ip-z", "refused", now=now + 5) == (True, 0), "the awaited retry came"
    admission.admit("realtime", [now], asker=asker)  # none awaited (a refusal for the margin alone is not): no margin
    queues.delete(keys.REFUSALS_PENDING)
    _admission(queues, book, admission_lateness_s=0.5, admission_retry_margin_s=0)[0].admit("realtime", [now])
    # (with no margin kept, a newcomer is let in)
    WorkerRegistry(queues, ttl_s=5).remove("w1")


def test_the_first_audio_check_keeps_a_margin_for_retries_of_at_most_half_its_limit(
    paced: tuple[str, redis.Redis],
) -> None:
    isolated, client = paced  # first segments written by hand
    stats = Stats(client)
    for _ in range(3):
        stats.record(first_chars=10, first_s=1.0)  # 0.1 s a character
    loaded = load_settings(
        redis_url=isolated, admission_first_audio_s=1.0, admission_retry_margin_s=0.25, admission_lateness_s=0
    )  # this test's subject is the first-audio check
    admission = _paced_admission(client, stats, loaded, refusals=Refusals(client))
    now = time.time()
    Refusals(client).remember("ip-z", "refused", retry_after_s=60, now=now, pending=True)  # a retry awaited
    admission.admit("realtime", [now], first_chars=7, asker=("ip-a", "short"))  # 0.7 s: within 1 s less 0.25 s
    with pytest.raises(ServiceUnavailable) as refused:
        admission.admit("realtime", [now], first_chars=9, asker=("ip-a", "nine"))  # 0.9 s: within the margin
    assert "0.25 s kept for retries" in refused.value.message
    assert refused.value.retry_after == FIRST_AUDIO_WINDOW_S
    Refusals(client).remember("ip-a", "nine", retry_after_s=FIRST_AUDIO_WINDOW_S, now=now - 10, pending=False)
    admission.admit("realtime", [now], first_chars=9, asker=("ip-a", "nine"))  # its retry may use the margin
    with pytest.raises(ServiceUnavailable):
        admission.admit("realtime", [now], first_chars=11, asker=("ip-a", "nine"))  # over the limit itself
    wide = load_settings(
        redis_url=isolated, admission_first_audio_s=1.0, admission_retry_margin_s=5, admission_lateness_s=0
    )
    halved = Admission(stats=stats, breaker=_breaker(client), workers=WorkerRegistry(client, ttl_s=30),
                       book=ScheduleBook(client, default_seconds_per_char=0.2), settings=wide,
                       policy=scheduling_policy(wide), refusals=Refusals(client))  # fmt: skip
    halved.admit("realtime", [now], first_chars=5, asker=("ip-a", "five"))  # 0.5 s: never more than half the limit
    with pytest.raises(ServiceUnavailable):
        halved.admit("realtime", [now], first_chars=6, asker=("ip-a", "six"))
    admission.admit("realtime", [now], first_chars=9)  # who asks unknown: no retry could be told apart, no margin
    client.delete(keys.REFUSALS_PENDING)
    admission.admit("realtime", [now], first_chars=9, asker=("ip-b", "nine"))  # no retry awaited: no margin


def test_the_api_lets_in_the_same_request_sent_again_after_its_retry_after_before_a_newcomer(
    settings_env: dict[str, str], paced: tuple[str, redis.Redis]
) -> None:
    isolated, client = paced
    now = time.time()
    ScheduleBook(client, default_seconds_per_char=0.2).add("behind", {i: now - 1 for i in range(2)})  # 0.4 s due
    # Within the 1 s allowance, but a first try must leave 5 s of it to spare: only retries get in.
    app = api_app(settings_env, redis_url=isolated, admission_lateness_s=1.0, admission_retry_margin_s=5)
    asking = {"text": "May I come in again?", "seed": 7}
    assert app.test_client().post("/v1/jobs", json={**asking, "seed": 6}).status_code == 202, "no retry awaited"
    Refusals(client).remember("ip-other", "refused", retry_after_s=60, now=now, pending=True)  # one is now
    first = app.test_client().post("/v1/jobs", json=asking)
    assert first.status_code == 503 and "kept for retries" in first.get_json()["error"]["message"]
    assert first.get_json()["error"]["estimated_excess_s"] == 0, "no listener would be late: only the margin"
    retry_after = int(first.headers["Retry-After"])
    assert retry_after == 1
    time.sleep(retry_after)  # as a client told to come back in 1 s does
    assert app.test_client().post("/v1/jobs", json={**asking, "seed": 8}).status_code == 503, "another request"
    assert app.test_client().post("/v1/jobs", json=asking).status_code == 202, "the same one, after Retry-After"
    assert app.test_client().post("/v1/jobs", json=asking).status_code == 503, "let in once as a retry"

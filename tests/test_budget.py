"""The job store stays inside its memory budget: compact audio, audio retention apart from the record, 410 Gone
after it, trimming of the oldest finished audio, 503 when live work fills the budget, and a full Redis at
write time that is waited out rather than counted as an engine failure."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import numpy as np
import pytest
import redis
from flask import Flask

from api import create_app
from cache import keys
from cache.budget import StoreBudget
from cache.jobstore import JobRequest, JobStore, StartState, WriteResult
from cache.stats import Stats
from core.audio import PackedAudio, to_pcm16
from core.errors import SettingsInvalid, StoreFull
from core.metrics import STORE_FULL_WAITS
from core.settings import Settings, load_settings
from tests.support.servers import WorkerProcess
from workers.segment import SegmentSynthesizer

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip


def _done_job(store: JobStore, pcm: bytes, rate: int, segments: int = 1) -> str:
    job_id = store.create(REQUEST, [f"Segment {i}." for i in range(segments)])
    for i in range(segments):
        store.write_segment(job_id, i, pcm, sample_rate=rate, meta={"duration_s": 1.0})
    return job_id


def test_segment_audio_is_kept_losslessly_in_at_most_sixty_percent_of_raw_pcm(
    redis_client: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(redis_client, ttl=600, codec="flac")
    job_id = _done_job(store, pcm, rate)
    kept = redis_client.hstrlen(keys.audio(job_id), "0")
    assert kept <= 0.6 * len(pcm), f"FLAC kept {kept} bytes of {len(pcm)}"
    assert store.segment(job_id, 0) == pcm, "lossless: the same samples come back"


def test_vorbis_keeps_at_most_a_quarter_of_raw_pcm_and_the_same_length(
    redis_client: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(redis_client, ttl=600, codec="vorbis")
    job_id = _done_job(store, pcm, rate)
    assert redis_client.hstrlen(keys.audio(job_id), "0") <= 0.25 * len(pcm)
    back = store.segment(job_id, 0)
    assert back is not None and len(back) == len(pcm)
    a, b = np.frombuffer(pcm, "<i2").astype(float), np.frombuffer(back, "<i2").astype(float)
    assert np.corrcoef(a, b)[0, 1] > 0.9, "lossy, but the same speech"


def test_a_finished_jobs_audio_expires_before_its_record(redis_client: redis.Redis, speech: tuple[bytes, int]) -> None:
    pcm, rate = speech
    store = JobStore(redis_client, ttl=86_400, audio_ttl=3600)
    job_id = _done_job(store, pcm, rate)
    assert 3500 < redis_client.ttl(keys.audio(job_id)) <= 3600
    assert redis_client.ttl(keys.job(job_id)) > 80_000
    # What serves only the audio goes with it: a day of finished jobs keeps their records, not their texts and events.
    for key in (keys.texts(job_id), keys.segment_meta(job_id), keys.events(job_id)):
        assert redis_client.exists(key) and 0 < redis_client.ttl(key) <= 3600, key
    record = store.get(job_id)
    assert record is not None and record.finished_at is not None
    assert record.audio_expires_at == pytest.approx(record.finished_at + 3600, abs=1)
    assert redis_client.zscore(keys.AUDIO_KEPT, job_id) is not None, "listed for the memory budget"


def _wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_audio_routes_answer_410_gone_saying_why_once_the_audio_expired(
    app: Flask, redis_client: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(redis_client, ttl=600, audio_ttl=1)  # a one-second audio TTL: real expiry, not a DEL
    job_id = _done_job(store, pcm, rate)
    client = app.test_client()
    assert client.get(f"/v1/jobs/{job_id}/segments/0").status_code == 200
    _wait_until(lambda: not redis_client.exists(keys.audio(job_id)))
    for url in (f"/v1/jobs/{job_id}/segments/0", f"/v1/jobs/{job_id}/audio", f"/v1/jobs/{job_id}/segments/0?wait=1"):
        response = client.get(url)
        assert response.status_code == 410, url
        error = response.get_json()["error"]
        assert error["code"] == "gone" and "TTS_AUDIO_TTL_S" in error["message"] and "record stays" in error["message"]
    view = client.get(f"/v1/jobs/{job_id}").get_json()
    assert view["status"] == "done" and view["audio_expires_at"] is not None, "the record is still there"


def test_past_the_trim_mark_the_oldest_finished_audio_goes_first_and_live_jobs_stay(
    app: Flask, redis_client: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(redis_client, ttl=600)
    live = store.create(REQUEST, ["Still being made.", "Second."])
    store.write_segment(live, 0, pcm, sample_rate=rate, meta={})
    finished = [_done_job(store, pcm, rate, segments=6) for _ in range(12)]
    per_job = sum(redis_client.memory_usage(keys.audio(j), samples=0) or 0 for j in finished) / len(finished)
    used = StoreBudget(redis_client).usage().used
    # A budget whose trim mark (95%) is passed now, and whose low mark (85%) lies three jobs' audio below.
    budget = StoreBudget(redis_client, budget_bytes=int((used - 3 * per_job) / 0.85), trim_at=0.95)
    assert budget.usage().share > 0.95
    trimmed = budget.trim()
    assert trimmed.after is not None and trimmed.after.share < 0.85, "down to 10 points below the mark"
    assert 3 <= trimmed.jobs < len(finished)
    gone = [j for j in finished if not redis_client.exists(keys.audio(j))]
    assert gone == finished[: len(gone)], "oldest first"
    assert redis_client.exists(keys.audio(live)), "a live job's audio is never removed"
    assert not redis_client.exists(keys.texts(gone[0])) and not redis_client.exists(keys.events(gone[0]))
    assert redis_client.exists(keys.job(gone[0])), "the record stays, to say why the audio is gone"
    response = app.test_client().get(f"/v1/jobs/{gone[0]}/audio")
    assert response.status_code == 410
    assert "memory budget" in response.get_json()["error"]["message"]
    assert app.test_client().get(f"/v1/jobs/{finished[-1]}/segments/0").status_code == 200


def test_admission_answers_503_with_retry_after_when_live_work_fills_the_store(
    settings_env: dict[str, str], redis_client: redis.Redis, worker: WorkerProcess
) -> None:
    used_mb = StoreBudget(redis_client).usage().used / 2**20
    budget_mb = max(1, int(used_mb / 0.95))  # already past the 90% mark
    app = create_app(
        {"redis_url": settings_env["REDIS_URL"], "models_file": settings_env["TTS_MODELS_FILE"],
         "store_budget_mb": budget_mb}
    )  # fmt: skip
    response = app.test_client().post("/v1/jobs", json={"text": "Is there room?", "model": "espeak-en"})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "10"
    error = response.get_json()["error"]
    assert error["code"] == "store_full" and "memory budget" in error["message"]


def _fill(client: redis.Redis) -> int:
    """Write junk until Redis refuses writes at its maxmemory; return how many keys it took."""
    n = 0
    while True:
        try:
            client.set(f"junk:{n}", b"x" * 65536)
        except redis.OutOfMemoryError:
            return n
        n += 1


def test_a_write_to_a_full_store_changes_nothing_and_is_refused_as_out_of_memory(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    job_id = store.create(REQUEST, ["One.", "Two."], pending=[1])
    assert store.start_segment(job_id, 0, worker="w1").state is StartState.GO
    own_redis.config_set("maxmemory", own_redis.info("memory")["used_memory"] + 4 * 2**20)
    _fill(own_redis)
    with pytest.raises(redis.OutOfMemoryError):
        store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={}, worker="w1", advance=True)
    assert own_redis.sismember(keys.held("w1"), keys.segment_member(job_id, 0)), "still held: nothing changed"
    assert store.pending(job_id) == [1] and not store.has_segment(job_id, 0)
    own_redis.delete(*[f"junk:{i}" for i in range(20)])
    write = store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={}, worker="w1", advance=True)
    assert write.result is WriteResult.WRITTEN and write.next_index == 1


class _OneShotBackend:
    """Returns one fixed waveform, as an engine would."""

    def __init__(self, wave: np.ndarray, rate: int) -> None:
        self.wave, self.rate = wave, rate

    def synthesize(self, *_: object, **__: object) -> tuple[np.ndarray, int]:
        return self.wave, self.rate


class _FillingBackend:
    """Runs a side effect, then answers as the wrapped backend does."""

    def __init__(self, inner: Any, effect: Any) -> None:
        self.inner, self.effect = inner, effect

    def synthesize(self, *args: object, **kwargs: object) -> Any:
        self.effect()
        return self.inner.synthesize(*args, **kwargs)


def _synthesizer(client: redis.Redis, store: JobStore, budget: StoreBudget, wave: np.ndarray, rate: int,
                 **extra: Any) -> SegmentSynthesizer:  # fmt: skip
    from cache.schedule import ScheduleBook
    from cache.sentences import SentenceCache
    from core.policy import scheduling_policy
    from core.registry import load_registry

    settings = Settings()
    return SegmentSynthesizer(
        store=store,
        cache=SentenceCache(client, ttl_s=60, enabled=False),
        stats=Stats(client),
        enqueue=lambda *_args: None,
        registry=load_registry(settings),
        backend=_OneShotBackend(wave, rate),  # type: ignore[arg-type]
        max_attempts=3,
        worker="w1",
        book=ScheduleBook(client, default_seconds_per_char=0.08),
        policy=scheduling_policy(settings),
        wait_for_room=budget.wait_for_room,
        **extra,
    )


def _limited(
    client: redis.Redis, speech: tuple[bytes, int], text: str, **extra: Any
) -> tuple[JobStore, str, SegmentSynthesizer]:
    """Return a store 4 MB short of its maxmemory, a job of one segment, and a synthesizer that makes it."""
    pcm, rate = speech
    store = JobStore(client, ttl=600)
    job_id = store.create(REQUEST, [text])
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 4 * 2**20)
    wave = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767
    return store, job_id, _synthesizer(client, store, StoreBudget(client, full_at=0.9), wave, rate, **extra)


def test_a_worker_waits_for_room_in_a_full_store_and_counts_no_engine_failure(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, _ = speech
    store, job_id, synthesizer = _limited(own_redis, speech, "Wait for room, then speak.")
    start = store.start_segment(job_id, 0, worker="w1")
    filled = _fill(own_redis)
    outcome: list[Any] = []
    waits = STORE_FULL_WAITS._value.get()
    worker = threading.Thread(target=lambda: outcome.append(synthesizer._make(job_id, 0, start)))
    worker.start()
    _wait_until(lambda: STORE_FULL_WAITS._value.get() > waits)  # the write was refused, and it waits
    assert worker.is_alive() and not store.has_segment(job_id, 0), "refused while full, and waiting"
    own_redis.delete(*[f"junk:{i}" for i in range(filled)])  # room: what a trim or an expiry would make
    worker.join(30)
    assert outcome and outcome[0].value == "written"
    assert store.segment(job_id, 0) == pcm
    assert Stats(own_redis).window().failed == 0, "a full store is no engine failure: the breaker stays shut"


def test_a_segment_waits_short_of_the_limit_so_the_brokers_own_writes_always_find_room(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    job_id = store.create(REQUEST, ["Short of the limit, wait."])
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=int(used / 0.97), full_at=0.9)  # 97%: past 95%, under the limit
    assert budget.write_at == pytest.approx(0.95) and not budget.room_to_write()
    wave = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767
    synthesizer = _synthesizer(own_redis, store, budget, wave, rate, has_room=budget.room_to_write)
    start = store.start_segment(job_id, 0, worker="w1")
    outcome: list[Any] = []
    waits = STORE_FULL_WAITS._value.get()
    worker = threading.Thread(target=lambda: outcome.append(synthesizer._make(job_id, 0, start)))
    worker.start()
    _wait_until(lambda: STORE_FULL_WAITS._value.get() > waits)
    assert worker.is_alive() and not store.has_segment(job_id, 0), "Redis would take it, but the segment waits"
    budget.budget_bytes = 10 * used  # room: what a trim or a shed would make
    worker.join(30)
    assert outcome and outcome[0].value == "written" and store.segment(job_id, 0) == pcm


def test_a_store_that_stays_full_raises_store_full_for_the_task_to_retry_as_the_same_attempt(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    store, job_id, synthesizer = _limited(own_redis, speech, "No room at all.", room_wait_s=1.0)
    # A full store refuses the start's writes; fill it once the segment has started, inside the engine call.
    backend = synthesizer.backend
    synthesizer.backend = _FillingBackend(backend, lambda: _fill(own_redis))  # type: ignore[assignment]
    with pytest.raises(StoreFull):
        synthesizer.run(job_id, 0, token="task-1:0")
    held = own_redis.sismember(keys.held("w1"), keys.segment_member(job_id, 0))
    assert not held, "let go: the task's retry message carries it"
    assert store.attempts(job_id, 0) == 1 and Stats(own_redis).window().failed == 0


def test_packed_audio_round_trips_every_codec_and_empty_audio() -> None:
    pcm = to_pcm16(np.sin(np.arange(2400) / 7).astype(np.float32) * 0.3)
    for codec in ("flac", "vorbis", "pcm"):
        packed = PackedAudio.pack(pcm, 24000, codec)
        assert packed.codec == codec and len(packed.pcm()) == len(pcm)
        assert packed.samples() == len(pcm) // 2, f"{codec} counts its samples"
    assert PackedAudio.pack(b"", 24000).pcm() == b""
    assert PackedAudio(pcm).codec == "raw" and PackedAudio(pcm).pcm() == pcm, "untagged PCM from before codecs"


def test_a_janitor_trims_finished_audio_even_when_redis_refuses_every_write(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    finished = [_done_job(store, pcm, rate, segments=4) for _ in range(6)]
    own_redis.config_set("maxmemory", own_redis.info("memory")["used_memory"] + 4 * 2**20)
    filled = _fill(own_redis)
    own_redis.delete(*[f"junk:{i}" for i in range(filled - 20, filled)])  # just under the limit: writes refused
    janitor = _janitor(own_redis, store, StoreBudget(own_redis))
    with pytest.raises(redis.OutOfMemoryError):
        own_redis.set("one-more", b"x" * 2**20)
    with contextlib.suppress(redis.RedisError):  # the lock's SET may still be refused: the trim ran before it
        janitor.run_once()
    assert not own_redis.exists(keys.audio(finished[0])), "the oldest finished audio made room"
    assert StoreBudget(own_redis).usage().share < 0.8
    own_redis.set("one-more", b"x" * 2**20)  # writes work again


def test_one_janitor_trims_at_a_time_so_that_two_workers_do_not_remove_twice_what_is_needed(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    finished = [_done_job(store, pcm, rate, segments=4) for _ in range(6)]
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=int(used / 0.97), trim_at=0.95)
    janitor = _janitor(own_redis, store, budget)
    trimming = own_redis.lock(keys.TRIM_LOCK, timeout=10)
    assert trimming.acquire(blocking=False), "another worker's janitor is trimming"
    assert janitor.keep_budget(time.time()) == 0 and all(own_redis.exists(keys.audio(j)) for j in finished)
    trimming.release()
    assert janitor.keep_budget(time.time()) >= 1, "once it is done, the next pass trims"
    assert not own_redis.exists(keys.TRIM_LOCK), "and gives the lock back when it is done"


def _janitor(client: redis.Redis, store: JobStore, budget: StoreBudget) -> Any:
    from cache.custody import BrokerKeys, Custody
    from cache.schedule import ScheduleBook
    from cache.workers import WorkerRegistry
    from workers.janitor import Janitor

    return Janitor(
        store=store,
        custody=Custody(client, BrokerKeys(queues=["realtime"]), task_name="t"),
        heartbeats=WorkerRegistry(client, ttl_s=6),
        enqueue=lambda *_args: None,
        book=ScheduleBook(client, default_seconds_per_char=0.08),
        worker="w1",
        dead_after_s=6,
        interval_s=2,
        working_on=set,
        budget=budget,
    )


def _half_made_books(client: redis.Redis, store: JobStore, pcm: bytes, rate: int, count: int) -> list[str]:
    """Create ``count`` live jobs of 8 segments with 4 written, in the order they came."""
    live = []
    for n in range(count):
        job_id = store.create(REQUEST, [f"Book {n}, part {i}." for i in range(8)])
        for i in range(4):
            store.write_segment(job_id, i, pcm, sample_rate=rate, meta={})
        live.append(job_id)
        client.zadd(keys.LIVE_JOBS, {job_id: time.time() + n})
    return live


def _status(store: JobStore, job_id: str) -> str:
    record = store.get(job_id)
    return record.status.value if record else "gone"


def test_when_live_work_fills_the_store_the_newest_jobs_fail_saying_why_and_the_oldest_go_on(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    live = _half_made_books(own_redis, store, pcm, rate, 6)  # each one's next segment waits for room
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=int(used / 0.96))  # past 95%, where segment writes wait
    assert budget.usage().share >= budget.write_at
    janitor = _janitor(own_redis, store, budget)
    now = time.time()
    janitor.keep_budget(now)
    assert "failed" not in {_status(store, j) for j in live}, "one pass is not judged stuck: a trim may follow"
    janitor.keep_budget(now + 2)
    failed = [j for j in live if _status(store, j) == "failed"]
    assert failed == live[-len(failed) :] and 1 <= len(failed) < len(live), "the newest failed, the oldest go on"
    assert budget.usage().share < 0.8, "down below the trim mark: the older jobs have room to write"
    record = store.get(failed[-1])
    error = (record.error if record else None) or ""
    assert "newest were failed so that older ones can finish" in error and "TTS_REDIS_MAXMEMORY" in error
    assert not own_redis.exists(keys.audio(failed[0])) and own_redis.exists(keys.audio(live[0]))
    assert not any(own_redis.zscore(keys.LIVE_JOBS, j) for j in failed)


def test_a_store_full_of_something_else_than_live_audio_fails_no_job_and_says_so(
    own_redis: redis.Redis, speech: tuple[bytes, int], caplog: pytest.LogCaptureFixture
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    live = _half_made_books(own_redis, store, pcm, rate, 2)
    for n in range(160):  # what failing jobs cannot free: records, pieces, another tenant's keys
        own_redis.set(f"other:{n}", b"x" * 65536)
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=int(used / 0.97))
    janitor = _janitor(own_redis, store, budget)
    now = time.time()
    with caplog.at_level(logging.ERROR, logger="workers.janitor"):
        janitor.keep_budget(now)
        janitor.keep_budget(now + 2)
    assert "failed" not in {_status(store, j) for j in live}, "failing them would free next to nothing"
    assert any("not with live jobs' audio" in r.getMessage() for r in caplog.records)


def test_a_job_that_finished_meanwhile_keeps_its_audio_when_the_store_sheds(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    done = _done_job(store, pcm, rate, segments=2)
    assert store.fail(done, "made room", drop_audio=True) is False, "over already: not failed"
    assert own_redis.exists(keys.audio(done)), "and its audio stays, removed only with a live job's failure"


def test_neither_the_api_nor_a_worker_starts_on_a_job_store_that_would_evict_keys(
    redis_client: redis.Redis, settings_env: dict[str, str]
) -> None:
    from tests.support.apps import api_app
    from workers.celery_app import celery_enqueue, create_celery
    from workers.wiring import build_runtime

    settings = load_settings(redis_url=settings_env["REDIS_URL"], models_file=settings_env["TTS_MODELS_FILE"],
                             tiny_model_dir=settings_env["TTS_TINY_MODEL_DIR"], default_model="espeak-en")  # fmt: skip
    redis_client.config_set("maxmemory-policy", "allkeys-lru")  # as a managed Redis left at its default might be
    try:
        with pytest.raises(SettingsInvalid, match=r"maxmemory-policy allkeys-lru.*noeviction"):
            api_app(settings_env)
        with pytest.raises(SettingsInvalid, match="maxmemory-policy allkeys-lru"):
            build_runtime(settings, hostname="w-evicting", enqueue=celery_enqueue(create_celery(settings)))
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    api_app(settings_env).extensions["tts"].close()  # starts again once it is fixed

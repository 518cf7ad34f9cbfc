"""Admission counts the audio admitted jobs will still write: each job reserves it as it is admitted, its writes
spend it, its end gives back the rest, and a burst of books is admitted only as far as the store can hold them."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from flask import Flask
from simple_websocket import Client

from api import create_app
from api.admission import Admission
from api.services import _admission as build_admission
from cache import keys
from cache.budget import RESERVED_ROOM_AGE_S, StoreBudget
from cache.finished import REMOVABLE_SCAN
from cache.jobstore import JobRequest, JobStore
from cache.reservations import DEFAULT_BYTES_PER_CHAR, LEARNED_FROM_CHARS, WANTED_FOR_S, Reservations, Verdict
from cache.schedule import ScheduleBook
from cache.workers import WorkerRegistry
from client.cli import main
from core.errors import StoreFull, StoreTooSmall
from core.metrics import STORE_RESERVED, STORE_USED
from core.policy import scheduling_policy
from core.settings import load_settings
from devstack.api import ApiProcess
from tests.support.http import serving
from tests.support.processes import wait_for
from tests.support.servers import WorkerProcess
from tests.support.sockets import close, connect, receive_until_end

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="batch", seed=None, cache=False)  # fmt: skip


def _owed_on_record(client: redis.Redis, job_id: str) -> int:
    return int(client.hget(keys.job(job_id), "owed_bytes") or 0)


def test_a_job_reserves_its_audio_its_writes_spend_it_and_its_end_gives_back_the_rest(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    reserved = reservations.reserve("espeak-en", 20, largest=10**9, most=10**9)  # 240,000 bytes at the default
    need = reserved.audio.bytes
    assert reserved.verdict is Verdict.RESERVED and need == 20 * DEFAULT_BYTES_PER_CHAR > len(pcm)
    job_id = store.create(REQUEST, ["One.", "Two.", "Three."], pending=[1, 2], owed=(need, DEFAULT_BYTES_PER_CHAR))
    store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={})
    written = own_redis.hstrlen(keys.audio(job_id), "0")
    assert 0 < written < len(pcm), "FLAC: less than the raw PCM"
    assert reservations.owed() == need - written == _owed_on_record(own_redis, job_id)
    assert store.cancel(job_id)
    assert reservations.owed() == 0 and _owed_on_record(own_redis, job_id) == 0, "the rest given back at its end"


def test_the_reserved_audio_is_exported_as_a_share_of_the_budget_beside_the_memory_used(own_redis: redis.Redis) -> None:
    reservations, budget = Reservations(own_redis), StoreBudget(own_redis, budget_bytes=100 * DEFAULT_BYTES_PER_CHAR)
    reservations.reserve("espeak-en", 25, largest=10**9, most=10**9)
    usage = budget.usage()
    assert STORE_RESERVED._value.get() == pytest.approx(0.25) == usage.owed / usage.budget
    assert STORE_USED._value.get() == pytest.approx(usage.share)


def test_a_job_that_finishes_or_fails_leaves_nothing_owed_even_when_its_audio_outgrew_the_estimate(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    small = DEFAULT_BYTES_PER_CHAR  # one character's: less than one segment, so the writes spend it all, no more
    reservations.reserve("espeak-en", 1, largest=10**9, most=10**9)
    done = store.create(REQUEST, ["One.", "Two."], owed=(small, DEFAULT_BYTES_PER_CHAR))
    reservations.reserve("espeak-en", 1, largest=10**9, most=10**9)
    failed = store.create(REQUEST, ["One.", "Two."], owed=(small, DEFAULT_BYTES_PER_CHAR))
    for i in (0, 1):
        store.write_segment(done, i, pcm, sample_rate=rate, meta={})
    assert reservations.owed() == small, "the finished job spent its reservation, never below nothing"
    assert store.fail(failed, "the engine gave up", drop_audio=False)
    assert reservations.owed() == 0


def test_a_burst_of_reservations_takes_exactly_the_room_there_is(own_redis: redis.Redis) -> None:
    reservations = Reservations(own_redis)
    rate = {"espeak-en:bytes": DEFAULT_BYTES_PER_CHAR * 100, "espeak-en:chars": 100}  # learned: estimates are whole
    own_redis.hset(keys.BYTES_PER_CHAR, mapping=rate)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def reserve() -> None:
        found = Reservations(own_redis).reserve("espeak-en", 1, largest=10**9, most=5 * DEFAULT_BYTES_PER_CHAR + 500)
        with lock:
            outcomes.append(found.verdict)

    threads = [threading.Thread(target=reserve) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count(Verdict.RESERVED) == 5 and outcomes.count(Verdict.NO_ROOM) == 15
    assert reservations.owed() == 5 * DEFAULT_BYTES_PER_CHAR


def _per_char(reservations: Reservations, model: str) -> float:
    """Return the bytes per character a job on ``model`` reserves at (by reserving one character)."""
    return reservations.reserve(model, 1, largest=10**12, most=10**12).audio.per_char


def test_a_models_writes_teach_its_bytes_per_character_from_the_default(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    assert _per_char(reservations, "espeak-en") == DEFAULT_BYTES_PER_CHAR
    text = "Every byte a job will write is counted first."
    job_id = store.create(REQUEST, [text] * 3)
    store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={}, learn=("espeak-en", len(text)))
    assert len(text) < LEARNED_FROM_CHARS and _per_char(reservations, "espeak-en") == DEFAULT_BYTES_PER_CHAR
    for i in (1, 2):
        store.write_segment(job_id, i, pcm, sample_rate=rate, meta={}, learn=("espeak-en", len(text)))
    per_segment = own_redis.hstrlen(keys.audio(job_id), "0")
    assert _per_char(reservations, "espeak-en") == pytest.approx(per_segment / len(text), rel=1e-6)
    assert _per_char(reservations, "chattts-tiny") == DEFAULT_BYTES_PER_CHAR, "learned per model"
    found = reservations.reserve("espeak-en", 1000, largest=10**9, most=10**12)
    assert found.audio.bytes == pytest.approx(1000 * per_segment / len(text), abs=1), "reserved at the learned rate"
    too_large = reservations.reserve("espeak-en", 1000, largest=found.audio.bytes - 1, most=10**12)
    assert too_large.verdict is Verdict.TOO_LARGE, "judged at the learned rate"
    # At the cautious default, a model not heard yet is never too large: it reserves the full mark at most, and
    # what room there is, so that it is not refused for ever where its estimate would never fit.
    cold = reservations.reserve("chattts-tiny", 1000, largest=1000 * DEFAULT_BYTES_PER_CHAR // 4, most=10**12)
    assert cold.verdict is Verdict.RESERVED and cold.audio.bytes == 1000 * DEFAULT_BYTES_PER_CHAR // 4
    assert not cold.learned and found.learned
    owed = reservations.owed()
    squeezed = reservations.reserve("chattts-tiny", 1000, largest=10**12, most=owed + 5000)
    assert squeezed.verdict is Verdict.RESERVED and squeezed.audio.bytes == 5000
    none_left = reservations.reserve("chattts-tiny", 1000, largest=10**12, most=owed + 5000)
    assert none_left.verdict is Verdict.NO_ROOM, "no room at all: refused"


def test_a_recount_corrects_a_difference_from_the_live_jobs_found_twice_and_spares_one_in_flight(
    own_redis: redis.Redis,
) -> None:
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    for owed in (700, 300):  # two admitted jobs, as admission reserves and writes them
        own_redis.incrby(keys.STORE_OWED, owed)
        store.create(REQUEST, ["One."], owed=(owed, 10.0))
    assert reservations.owed() == 1000
    own_redis.incrby(keys.STORE_OWED, 5000)  # a submission in flight: reserved, its record not yet written
    assert reservations.recount() == (6000, 6000), "one sight of a difference corrects nothing"
    own_redis.decrby(keys.STORE_OWED, 5000)  # that submission failed and gave it back
    own_redis.incrby(keys.STORE_OWED, 2000)  # an API died between reserving and writing its job: a leak
    assert reservations.recount() == (3000, 1000), "a difference found twice: the smaller of the two taken off"
    assert reservations.recount() == (1000, 1000)


def test_room_for_reserved_audio_is_made_only_from_audio_that_ended_a_while_ago(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store = JobStore(own_redis, ttl=600)
    finished = []
    for _ in range(30):  # about 3.5 MB of audio, beside Redis's own 1.5
        job_id = store.create(REQUEST, ["One.", "Two."])
        for i in (0, 1):
            store.write_segment(job_id, i, pcm, sample_rate=rate, meta={})
        finished.append(job_id)
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=2 * used)  # 50% used
    own_redis.set(keys.STORE_OWED, int(0.35 * budget.budget_bytes))  # 85% once the live jobs have written theirs
    assert budget.trim().jobs == 0, "just finished: kept"
    trimmed = budget.trim(now=time.time() + RESERVED_ROOM_AGE_S + 1)  # the same audio, a while on
    assert trimmed.after is not None and trimmed.after.projected_share < 0.7 and 1 <= trimmed.jobs < len(finished)
    assert [j for j in finished if not own_redis.exists(keys.audio(j))] == finished[: trimmed.jobs], "oldest first"
    # Written audio past the mark is trimmed at any age, as before.
    own_redis.set(keys.STORE_OWED, 0)
    assert StoreBudget(own_redis, budget_bytes=int(budget.usage().used / 0.85)).trim().jobs >= 1


def test_a_job_failed_at_the_memory_limit_to_make_room_gives_back_its_reservation(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    found = reservations.reserve("espeak-en", 100, largest=10**9, most=10**9)
    job_id = store.create(REQUEST, ["One.", "Two.", "Three."], owed=(found.audio.bytes, DEFAULT_BYTES_PER_CHAR))
    store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={})
    own_redis.config_set("maxmemory", own_redis.info("memory")["used_memory"] + 4 * 2**20)
    for size in (65536, 16):  # to the very limit: a big value is refused short of it, where small writes pass
        with pytest.raises(redis.OutOfMemoryError):
            for n in itertools.count():
                own_redis.set(f"junk:{size}:{n}", b"x" * size)
    with pytest.raises(redis.OutOfMemoryError):
        own_redis.incrby(keys.STORE_OWED, -1)
    assert store.fail(job_id, "the store is full", drop_audio=True), "its audio removed first, then its end written"
    assert reservations.owed() == 0 and not own_redis.exists(keys.audio(job_id))


@pytest.fixture
def budget_app(settings_env: dict[str, str], worker: WorkerProcess) -> Iterator[Any]:
    """Return a maker of API apps with a memory budget of so many MB, on the session's Redis, with its worker
    alive (admission needs one); their connections are closed after the test."""
    made: list[Flask] = []

    def make(budget_mb: int) -> Flask:
        config = {"redis_url": settings_env["REDIS_URL"], "models_file": settings_env["TTS_MODELS_FILE"],
                  "store_budget_mb": budget_mb}  # fmt: skip
        made.append(create_app(config))
        return made[-1]

    yield make
    for app in made:
        app.extensions["tts"].close()


@pytest.fixture
def espeak_rate(redis_client: redis.Redis) -> Iterator[Any]:
    """Let a test set what espeak-en is taken to write per character; the learned rate is restored after."""
    saved = redis_client.hgetall(keys.BYTES_PER_CHAR)

    def set_rate(per_char: int) -> None:
        redis_client.hset(keys.BYTES_PER_CHAR, mapping={"espeak-en:bytes": per_char * 1000, "espeak-en:chars": 1000})

    yield set_rate
    redis_client.delete(keys.BYTES_PER_CHAR)
    if saved:
        redis_client.hset(keys.BYTES_PER_CHAR, mapping=saved)


def test_a_burst_of_books_is_admitted_only_as_far_as_the_store_can_hold_their_audio(
    budget_app: Any, redis_client: redis.Redis, espeak_rate: Any
) -> None:
    espeak_rate(2000)
    book = " ".join(f"Sentence {n} of a long book, read by a patient voice." for n in range(80))  # ~4,400 chars
    need_mb = len(book) * 2000 / 2**20  # about 8.4 MB each
    owed_before = Reservations(redis_client).owed()
    used_mb = (StoreBudget(redis_client).usage().used + owed_before) / 2**20
    app = budget_app(int((used_mb + 3.5 * need_mb) / 0.9) + 1)  # room for three, not four
    answers: list[Any] = []
    lock = threading.Lock()

    def submit(n: int) -> None:
        body = {"text": f"Book {n}. {book}", "model": "espeak-en", "priority": "batch"}
        answer = app.test_client().post("/v1/jobs", json=body)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = [a.get_json()["id"] for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code != 202]
    try:
        # Writes move audio from the reservations into the memory used as the books are made, so a fourth may
        # find room if one of the three ended meanwhile; never all eight.
        assert 1 <= len(admitted) <= 4 and len(refused) >= 4, [a.get_json() for a in answers]
        for answer in refused:
            error = answer.get_json()["error"]
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "10", error
            assert error["code"] == "store_full" and "would not fit" in error["message"], error
            assert error["estimated_audio_bytes"] >= 8 * 2**20
    finally:
        for job_id in admitted:
            app.test_client().delete(f"/v1/jobs/{job_id}")
    wait_for(lambda: Reservations(redis_client).owed() == owed_before, 10, "every reservation given back")


def test_a_job_whose_audio_could_never_fit_is_refused_413_saying_what_to_do(
    budget_app: Any, redis_client: redis.Redis, espeak_rate: Any
) -> None:
    espeak_rate(1_000_000)  # a megabyte per character
    used_mb = StoreBudget(redis_client).usage().used / 2**20
    app = budget_app(int(used_mb) + 64)
    answer = app.test_client().post("/v1/jobs", json={"text": "Hello there, " * 10, "model": "espeak-en"})
    error = answer.get_json()["error"]
    assert answer.status_code == 413 and error["code"] == "store_too_small", error
    assert "split the text" in error["message"] and "TTS_REDIS_MAXMEMORY" in error["message"]


def _store_admission(client: redis.Redis, budget: StoreBudget) -> Admission:
    """Return the admission check the API builds (api/services.py), on ``client`` with ``budget``."""
    settings = load_settings()
    book = ScheduleBook(client, default_seconds_per_char=0.1)
    return build_admission(client, settings, workers=WorkerRegistry(client, ttl_s=30), book=book, budget=budget,
                           policy=scheduling_policy(settings))  # fmt: skip


def test_a_job_that_would_fit_only_where_the_store_keeps_records_for_good_is_refused_413_not_503_forever(
    own_redis: redis.Redis,
) -> None:
    # The store's state is set directly: espeak-en's learned rate (10 KB a character), 3 MB the store keeps for good
    # (as records and queues are), then the same 3 MB as finished audio a trim removes, then a job still live.
    own_redis.hset(keys.BYTES_PER_CHAR, mapping={"espeak-en:bytes": 10_000_000, "espeak-en:chars": 1000})
    own_redis.set("tts:test:records", b"r" * 3_000_000)
    used = StoreBudget(own_redis).usage().used
    budget = StoreBudget(own_redis, budget_bytes=int((used + 1_000_000) / 0.9), read_every_s=0)
    admission = _store_admission(own_redis, budget)
    chars = 200  # 2 MB of audio: below the full mark alone (4 MB and more), not beside the 3 MB kept
    with pytest.raises(StoreTooSmall) as refused:
        admission.reserve_audio("espeak-en", chars)
    assert refused.value.status == 413 and "keeps for good" in refused.value.message, refused.value.message
    assert "split the text" in refused.value.message and Reservations(own_redis).owed() == 0
    own_redis.delete("tts:test:records")
    own_redis.hset(keys.audio("finished"), "0", b"a" * 3_000_000)
    own_redis.zadd(keys.AUDIO_KEPT, {"finished": time.time()})
    with pytest.raises(StoreFull) as later:
        admission.reserve_audio("espeak-en", chars)
    assert later.value.retry_after == 10, "finished audio makes way for it: retry"
    own_redis.zadd(keys.AUDIO_KEPT, {f"gone-{n}": 0 for n in range(REMOVABLE_SCAN)})  # too many to measure
    with pytest.raises(StoreFull):
        admission.reserve_audio("espeak-en", chars)
    own_redis.delete(keys.AUDIO_KEPT)
    own_redis.zadd(keys.LIVE_JOBS, {"live": time.time()})
    with pytest.raises(StoreFull):
        admission.reserve_audio("espeak-en", chars)  # the live job's end may free room
    once = StoreBudget(own_redis, budget_bytes=budget.budget_bytes, read_every_s=60)
    assert once.kept_for_good() is None
    own_redis.delete(keys.LIVE_JOBS)
    assert once.kept_for_good() is None, "measured once per read_every_s, not at every refusal of a burst"
    assert budget.kept_for_good() is not None


def test_tts_book_waits_out_a_full_store_and_is_admitted_once_room_is_given_back(
    budget_app: Any, redis_client: redis.Redis, espeak_rate: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    espeak_rate(2000)
    text_file, out = tmp_path / "chapter.txt", tmp_path / "chapter.wav"
    text_file.write_text("A short chapter, read once the store has room for it. " * 4, encoding="utf-8")
    store, reservations = JobStore(redis_client, ttl=600), Reservations(redis_client)
    budget_mb = _budget_mb_with_room(redis_client, 8)
    # Another job holds all the room but 100 KB: the chapter (about 440 KB at 2,000 bytes a character) waits.
    room = _room_below_full_mark(redis_client, budget_mb)
    held = reservations.reserve("espeak-en", (room - 100_000) // 2000, largest=10**12, most=10**12)
    assert held.verdict is Verdict.RESERVED
    blocker = store.create(REQUEST, ["Holding the room."], owed=(held.audio.bytes, 2000.0))
    codes: list[int] = []
    waited: list[str] = []
    with serving(budget_app(budget_mb)) as url:
        argv = ["book", str(text_file), "-o", str(out), "--url", url, "--model", "espeak-en"]
        book = threading.Thread(target=lambda: codes.append(main(argv)))
        book.start()
        wait_for(lambda: waited.append(capsys.readouterr().err) or "not admitted yet" in "".join(waited), 30,
                 "the book told it waits")  # fmt: skip
        store.cancel(blocker)  # its room given back
        book.join(timeout=60)
    said = "".join(waited)
    assert "not admitted yet (store_full: not accepting this job: its audio" in said, said
    assert "trying again in 10 s" in said
    assert codes == [0] and out.exists()


def test_books_may_reserve_only_their_lanes_share_so_a_realtime_job_still_finds_room(
    budget_app: Any, redis_client: redis.Redis, espeak_rate: Any
) -> None:
    espeak_rate(2000)
    store, reservations = JobStore(redis_client, ttl=600), Reservations(redis_client)
    usage = StoreBudget(redis_client).usage()
    budget_mb = int((usage.used + reservations.owed()) / 2**20 / 0.72) + 8
    app = budget_app(budget_mb)
    # Books already hold the batch lane's share (0.8 of the 90% mark) but for 100 KB.
    room = _room_below_full_mark(redis_client, budget_mb, share=0.8)
    held = reservations.reserve("espeak-en", (room - 100_000) // 2000, largest=10**12, most=10**12)
    blocker = store.create(REQUEST, ["Holding the batch lane's room."], owed=(held.audio.bytes, 2000.0))
    text = "A chapter of about two hundred characters, which would need some four hundred kilobytes of audio. " * 2
    admitted: list[str] = []
    try:
        book = app.test_client().post("/v1/jobs", json={"text": text, "model": "espeak-en", "priority": "batch"})
        assert book.status_code == 503 and book.get_json()["error"]["code"] == "store_full", book.get_json()
        assert "full for this lane at 72%" in book.get_json()["error"]["message"]
        assert 0 < int(redis_client.hget(keys.STORE_WANTED, "mark") or 0) < budget_mb * 2**20 * 0.72, "room asked"
        voice = app.test_client().post("/v1/jobs", json={"text": text, "model": "espeak-en", "priority": "realtime"})
        assert voice.status_code == 202, voice.get_json()
        admitted.append(voice.get_json()["id"])
    finally:
        store.cancel(blocker)
        redis_client.delete(keys.STORE_WANTED)
        for job_id in admitted:
            app.test_client().delete(f"/v1/jobs/{job_id}")


def test_a_job_refused_for_want_of_room_gets_it_from_older_finished_audio_once(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    finished = []
    for _ in range(30):
        job_id = store.create(REQUEST, ["One.", "Two."])
        for i in (0, 1):
            store.write_segment(job_id, i, pcm, sample_rate=rate, meta={})
        finished.append(job_id)
    budget = StoreBudget(own_redis, budget_bytes=4 * StoreBudget(own_redis).usage().used)  # 25%: nothing to trim
    a_while_on = time.time() + RESERVED_ROOM_AGE_S + 1
    assert budget.trim(now=a_while_on).jobs == 0
    # A book was refused: it would fit were the store 1 MB emptier (a batch job's mark lies below the trim mark).
    mark = budget.usage().used - 2**20
    reservations.want_room(mark, 2**20)
    reservations.want_room(mark + 2**20, 2**19)  # a smaller job refused too: the larger room is kept
    assert budget.trim().jobs == 0, "the audio just finished is kept"
    trimmed = budget.trim(now=a_while_on)
    assert trimmed.after is not None and trimmed.after.used <= mark and 1 <= trimmed.jobs < len(finished)
    assert budget.trim(now=a_while_on).jobs == 0, "made once: the next pass removes nothing more"
    assert 0 < own_redis.ttl(keys.STORE_WANTED) <= WANTED_FOR_S


def test_a_room_mark_no_removal_can_reach_removes_nothing_and_one_met_is_cleared_as_its_job_gets_in(
    own_redis: redis.Redis, speech: tuple[bytes, int]
) -> None:
    pcm, rate = speech
    store, reservations = JobStore(own_redis, ttl=600), Reservations(own_redis)
    for _ in range(10):
        job_id = store.create(REQUEST, ["One."])
        store.write_segment(job_id, 0, pcm, sample_rate=rate, meta={})
    budget = StoreBudget(own_redis, budget_bytes=4 * StoreBudget(own_redis).usage().used)
    own_redis.set(keys.STORE_OWED, budget.budget_bytes // 2)  # live books' reservations: no removal frees them
    reservations.want_room(budget.budget_bytes // 4, 2**20)  # a mark below them
    assert budget.trim(now=time.time() + RESERVED_ROOM_AGE_S + 1).jobs == 0, "in vain: nothing removed"
    # Once a job as large as the one that asked gets in, the mark goes: the room was for it.
    own_redis.set(keys.STORE_OWED, 0)
    assert reservations.reserve("espeak-en", 10, largest=10**9, most=10**9).audio.bytes < 2**20
    assert own_redis.exists(keys.STORE_WANTED), "a smaller job leaves it"
    assert reservations.reserve("espeak-en", 100, largest=10**9, most=10**9).audio.bytes >= 2**20
    assert not own_redis.exists(keys.STORE_WANTED)


def test_the_room_a_large_refused_book_waits_for_is_held_against_much_smaller_books_not_realtime_jobs(
    own_redis: redis.Redis,
) -> None:
    reservations = Reservations(own_redis)
    own_redis.hset(keys.BYTES_PER_CHAR, mapping={"espeak-en:bytes": 1000 * 100, "espeak-en:chars": 100})  # 1 KB a char
    most = 10_000_000
    own_redis.set(keys.STORE_OWED, 4_000_000)
    big = reservations.reserve("espeak-en", 7000, largest=10**9, most=most, lane="batch")  # 7 MB: 1 MB short
    assert big.verdict is Verdict.NO_ROOM
    reservations.want_room(most - big.audio.bytes, big.audio.bytes, "batch")
    small = reservations.reserve("espeak-en", 3000, largest=10**9, most=most, lane="batch")  # 3 MB would fit ...
    assert small.verdict is Verdict.NO_ROOM, "... but the room is the waiting book's"
    voice = reservations.reserve("espeak-en", 100, largest=10**9, most=most, lane="realtime")
    assert voice.verdict is Verdict.RESERVED, "another lane's job is not held back"
    own_redis.decrby(keys.STORE_OWED, 2_000_000)  # live books finished: room for the big one
    assert reservations.reserve("espeak-en", 7000, largest=10**9, most=most, lane="batch").verdict is Verdict.RESERVED
    assert not own_redis.exists(keys.STORE_WANTED), "its room taken, the mark goes"
    assert reservations.reserve("espeak-en", 500, largest=10**9, most=most, lane="batch").verdict is Verdict.RESERVED
    # A job of about the waiting one's size is not held back for it: they take turns as they come.
    own_redis.set(keys.STORE_OWED, 0)
    reservations.want_room(most - 6_000_000, 6_000_000, "batch")
    assert reservations.reserve("espeak-en", 4000, largest=10**9, most=most, lane="batch").verdict is Verdict.RESERVED
    assert reservations.reserve("espeak-en", 2000, largest=10**9, most=most, lane="batch").verdict is Verdict.NO_ROOM


def _fill_the_store(client: redis.Redis, budget_mb: int) -> str:
    """Reserve all the room left below the full mark (90% of ``budget_mb``), and half the budget more (other tests'
    jobs ending meanwhile give theirs back), for a job of its own; return its id (canceling it gives it back)."""
    store, reservations = JobStore(client, ttl=600), Reservations(client)
    room = _room_below_full_mark(client, budget_mb)
    held = reservations.reserve("espeak-en", (room + budget_mb * 2**19) // 2000, largest=10**12, most=10**12)
    assert held.verdict is Verdict.RESERVED
    # An open text stream with no segment yet: nothing for the session's worker to make and finish (which would
    # give the reservation back while the test still needs the store full).
    return store.create(REQUEST, [], fields={"text_open": "1"}, owed=(held.audio.bytes, 2000.0))


def _room_below_full_mark(client: redis.Redis, budget_mb: int, share: float = 1.0) -> int:
    """Return the bytes left below the full mark (90% of ``budget_mb``, times a lane's ``share``) beside what is
    used and reserved now."""
    return int(budget_mb * 2**20 * 0.9 * share) - StoreBudget(client).usage().used - Reservations(client).owed()


def _budget_mb_with_room(client: redis.Redis, room_mb: int) -> int:
    """Return a budget whose full mark (90%) leaves ``room_mb`` beside what is used and reserved now."""
    return int((StoreBudget(client).usage().used + Reservations(client).owed()) / 2**20 / 0.9) + room_mb


def test_a_text_streams_piece_is_refused_503_while_the_store_is_full_and_taken_when_sent_again_after(
    budget_app: Any, redis_client: redis.Redis, espeak_rate: Any
) -> None:
    espeak_rate(2000)
    budget_mb = _budget_mb_with_room(redis_client, 8)
    app = budget_app(budget_mb)
    client = app.test_client()
    body = {"model": "espeak-en", "text": "Hello there. ", "text_stream": True, "cache": False}
    job_id, other = (client.post("/v1/jobs", json=body).json["id"] for _ in range(2))
    first = {"seq": 0, "text": "A first sentence, taken while there is room. "}
    assert client.post(f"/v1/jobs/{job_id}/text", json=first).status_code == 200
    blocker = _fill_the_store(redis_client, budget_mb)
    try:
        app.extensions["tts"].admission.budget.usage()  # read the store now, not up to a second later
        again = client.post(f"/v1/jobs/{job_id}/text", json=first)
        assert again.status_code == 200 and again.json["duplicate"] is True, "a retry adds no text: answered as before"
        piece = {"seq": 1, "text": "A second sentence comes when there is room. "}
        sent_at = time.time()
        refused = client.post(f"/v1/jobs/{job_id}/text", json=piece)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "10", refused.json
        error = refused.json["error"]
        assert error["code"] == "store_full" and error["seq"] == 1 and "the same seq" in error["message"]
        record = JobStore(redis_client, ttl=600).get(job_id)
        assert record is not None and record.text_next_seq == 1, "the refused piece was not kept"
        last = float(redis_client.hget(keys.job(job_id), "text_last_at") or 0)
        assert last >= sent_at, "but the stream is not idle: its client is sending (no idle flush or end meanwhile)"
        ended = client.post(f"/v1/jobs/{other}/text", json={"seq": 0, "text": "", "final": True})
        assert ended.status_code == 200, "an empty final piece adds no text: a stream can always be ended"
    finally:
        JobStore(redis_client, ttl=600).cancel(blocker)
    app.extensions["tts"].admission.budget.usage()
    taken = client.post(f"/v1/jobs/{job_id}/text", json={**piece, "final": True})
    assert taken.status_code == 200 and taken.json["duplicate"] is False, taken.json
    assert taken.json["text_stream"]["next_seq"] == 2


def _probe_until_refused(url: str, job_id: str) -> None:
    """Send pieces to an open text stream until one is refused for want of room: the API has read the store full
    (it reads it at most once a second)."""
    seqs = itertools.count()

    def refused() -> bool:
        answer = requests.post(f"{url}/v1/jobs/{job_id}/text", json={"seq": next(seqs), "text": "Probe. "}, timeout=10)
        return answer.status_code == 503 and answer.json()["error"]["code"] == "store_full"

    wait_for(refused, 10, "a piece refused by the full store")


def test_a_voice_sockets_piece_waits_while_the_store_is_full_and_is_taken_once_there_is_room(
    settings_env: dict[str, str], worker: WorkerProcess, redis_client: redis.Redis, espeak_rate: Any, tmp_path: Path
) -> None:
    espeak_rate(2000)
    budget_mb = _budget_mb_with_room(redis_client, 8)
    # TTS_STREAM_WRITE_TIMEOUT_S is 8 s here instead of 30, so that the piece that never finds room is refused
    # within the test; one API process, so that one read of the store serves every request.
    env = {**settings_env, "TTS_STORE_BUDGET_MB": str(budget_mb), "TTS_STREAM_WRITE_TIMEOUT_S": "8"}
    api = ApiProcess(env, tmp_path / "api.log", processes=1)
    api.start()
    sockets: list[Client] = []
    try:
        opened = []
        for _ in range(2):
            ws = connect(api)
            sockets.append(ws)
            ws.send(json.dumps({"model": "espeak-en", "cache": False}))
            opened.append(json.loads(ws.receive(timeout=30))["id"])
        probe = requests.post(f"{api.url}/v1/jobs", json={"model": "espeak-en", "text": "Probe. ", "text_stream": True,
                                                          "cache": False}, timeout=10).json()["id"]  # fmt: skip
        blocker = _fill_the_store(redis_client, budget_mb)
        try:
            _probe_until_refused(api.url, probe)
            never, waits = sockets
            never.send(json.dumps({"text": "This sentence never finds room."}))
            events, _ = receive_until_end(never, timeout=30)
            assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "store_full", events
            wait_for(lambda: redis_client.hget(keys.job(opened[0]), "status") == b"canceled", 10,
                     "the refused stream's job canceled")  # fmt: skip
            waits.send(json.dumps({"text": "This sentence waits for room, and is spoken."}))
            logged = f"text stream {opened[1]}: piece 0 waits for room in the job store"
            wait_for(lambda: logged in api.log_tail(200), 10, "the piece waiting for room")
            assert int(redis_client.hget(keys.job(opened[1]), "text_next_seq") or 0) == 0, "not taken while full"
        finally:
            JobStore(redis_client, ttl=600).cancel(blocker)
        planned = json.loads(waits.receive(timeout=10) or "{}")
        assert planned.get("type") == "planned" and planned["seq"] == 0 and planned["segments_total"] >= 1, planned
        requests.delete(f"{api.url}/v1/jobs/{probe}", timeout=10)
    finally:
        for ws in sockets:
            close(ws)
        api.stop()

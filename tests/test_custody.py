"""Every unfinished segment is somewhere: held by a live worker, in the outbox, or on the broker."""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from kombu import Connection

from cache import keys
from cache.custody import BrokerKeys, Custody
from cache.idempotency import CLAIM_TTL_S, TTL_S, IdempotencyKeys
from cache.jobstore import OUTBOX_GRACE_S, JobStore, StartState, WriteResult
from cache.workers import WorkerRegistry
from celery_config import SYNTHESIZE_TASK
from core.errors import ServiceUnavailable
from tests.support.jobs import REQUEST, TEXTS, wait_done
from tests.support.servers import RedisServer
from workers import broker
from workers.janitor import Janitor, dead_workers


def _store(app: Flask) -> JobStore:
    return JobStore(app.extensions["tts"].redis, ttl=600)


def _segment_events(client: redis.Redis, job_id: str) -> Counter[int]:
    events = client.xrange(keys.events(job_id))
    return Counter(int(fields[b"index"]) for _, fields in events if fields[b"type"] == b"segment")


def test_a_redelivery_of_the_same_attempt_is_not_counted_again(app: Flask) -> None:
    store = _store(app)
    job_id = store.create(REQUEST, TEXTS)
    first = store.start_segment(job_id, 0, worker="w-redeliver", token="task-a:0")
    again = store.start_segment(job_id, 0, worker="w-redeliver", token="task-a:0")
    retried = store.start_segment(job_id, 0, worker="w-redeliver", token="task-a:1")
    assert (first.attempt, first.redelivered) == (1, False)
    assert (again.attempt, again.redelivered) == (1, True)
    assert (retried.attempt, retried.redelivered) == (2, False)
    store.cancel(job_id)


def test_only_failures_count_against_the_attempt_cap_never_copies_of_a_delivery(app: Flask) -> None:
    store, custody = _store(app), Custody(app.extensions["tts"].redis)
    job_id = store.create(REQUEST, TEXTS)
    # What one dropped connection can leave: kombu's restore, the task's own retry and the janitor's copies of a
    # segment whose reply was lost, each a new token. They are attempts started, and none of them a failure.
    starts = [store.start_segment(job_id, 0, worker="w-copies", token=f"copy-{n}:0") for n in range(5)]
    assert [(s.state, s.attempt, s.failed) for s in starts] == [(StartState.GO, n + 1, 0) for n in range(5)]
    assert store.count_failure(job_id, 0) == 1, "the engine raised: one failure"
    assert store.start_segment(job_id, 0, worker="w-copies", token="copy-5:0").failed == 1
    store.hold("w-copies", job_id, 1)  # delivered, never started: its worker's death is no failure of it
    assert custody.hand_over("w-copies") == 2
    assert (store.failures(job_id, 0), store.failures(job_id, 1)) == (2, 0), "the death counts once, where started"
    store.cancel(job_id)
    assert store.count_failure("no-such-job", 0) == 0
    assert not app.extensions["tts"].redis.exists(keys.attempts("no-such-job")), "no counter without a job"


def test_a_segment_whose_worker_died_on_it_max_attempts_times_fails_its_job_with_the_reason(
    app: Flask, served: FlaskClient
) -> None:
    services = app.extensions["tts"]
    store = _store(app)
    job_id = store.create(REQUEST, TEXTS[:1])
    for death in range(3):  # TTS_SEGMENT_MAX_ATTEMPTS: three workers SIGKILLed on this segment, say by a poison
        assert store.start_segment(job_id, 0, worker=f"w-dies-{death}", token=f"poison-{death}:0").failed == death
        Custody(services.redis).hand_over(f"w-dies-{death}", now=time.time() + 3600)  # due later: ours to send
    services.redis.zrem(keys.OUTBOX, keys.segment_member(job_id, 0))
    services.enqueue(job_id, [0], "realtime")  # the live worker gets it a fourth time: it gives up at once
    job = wait_done(served, job_id)
    assert job["status"] == "failed"
    assert "segment 0 failed 3 times" in job["error"], job


def test_a_started_segment_is_held_by_its_worker_until_it_is_written(app: Flask) -> None:
    store, custody = _store(app), Custody(app.extensions["tts"].redis)
    job_id = store.create(REQUEST, TEXTS)
    store.start_segment(job_id, 1, worker="w-hold")
    assert custody.held("w-hold") == {keys.segment_member(job_id, 1)}
    assert "w-hold" in custody.holders()
    write = store.write_segment(job_id, 1, b"\0\0", sample_rate=8000, meta={}, worker="w-hold")
    assert write.result is WriteResult.WRITTEN
    assert custody.held("w-hold") == set()
    again = store.write_segment(job_id, 1, b"\1\1", sample_rate=8000, meta={}, worker="w-hold")
    assert again.result is WriteResult.DUPLICATE, "a second write of a segment must not replace the first"
    assert store.segment(job_id, 1) == b"\0\0"
    store.cancel(job_id)


def test_a_write_advances_the_job_in_the_same_step(app: Flask) -> None:
    store, client = _store(app), app.extensions["tts"].redis
    job_id = store.create(REQUEST, TEXTS, pending=[1, 2], publish=[0])
    member = keys.segment_member(job_id, 0)
    score = client.zscore(keys.OUTBOX, member)
    assert score is not None and score == pytest.approx(time.time() + OUTBOX_GRACE_S, abs=2)
    store.published(job_id, [0])
    assert client.zscore(keys.OUTBOX, member) is None
    client.zadd(keys.DUE, {member: time.time()})

    write = store.write_segment(job_id, 0, b"\0\0", sample_rate=8000, meta={}, worker="w-adv", advance=True)
    assert (write.result, write.next_index) == (WriteResult.WRITTEN, 1)
    assert client.zscore(keys.OUTBOX, keys.segment_member(job_id, 1)) is not None, "the fed segment is in the outbox"
    assert client.zscore(keys.DUE, member) is None, "a written segment leaves the deadline books"
    assert store.pending(job_id) == [2]

    store.write_segment(job_id, 1, b"\0\0", sample_rate=8000, meta={}, worker="w-adv")  # no advance: 2 stays
    assert store.pending(job_id) == [2]
    last = store.write_segment(job_id, 2, b"\0\0", sample_rate=8000, meta={}, worker="w-adv", advance=True)
    assert (last.result, last.next_index) == (WriteResult.FINISHED, None)
    assert job_id not in store.live_jobs()
    assert store.pending(job_id) == []
    store.published(job_id, [1])


def test_a_janitor_back_from_an_outage_declares_no_one_dead_until_live_workers_could_beat() -> None:
    beats = {"alive": 99.0, "stale": 80.0}
    args: dict[str, Any] = {"me": "me", "now": 100.0, "dead_after_s": 6.0, "interval_s": 2.0}
    holders = ["alive", "stale", "never", "me"]
    assert dead_workers(holders, beats, reachable_since=98.0, **args) == []
    assert dead_workers(holders, beats, reachable_since=95.0, **args) == ["stale", "never"]


def test_a_dead_workers_segments_are_enqueued_again_and_its_job_finishes(app: Flask, served: FlaskClient) -> None:
    services = app.extensions["tts"]
    store, custody = _store(app), Custody(services.redis)
    job_id = store.create(REQUEST, TEXTS[:2])
    # What a worker SIGKILLed mid-batch leaves: two segments held, their messages unacked in kombu for an hour.
    for index in (0, 1):
        assert store.start_segment(job_id, index, worker="w-ghost", token=f"ghost-{index}:0").state is StartState.GO
    services.redis.zadd(keys.WORKERS, {"w-ghost": time.time() - 60})
    assert wait_done(served, job_id)["status"] == "done"
    assert "w-ghost" not in custody.holders() and custody.held("w-ghost") == set()
    assert store.attempts(job_id, 0) == store.attempts(job_id, 1) == 2, "the dead worker's attempt counts, once"
    assert all(meta["worker"] != "w-ghost" for meta in store.segment_meta(job_id).values())
    assert _segment_events(services.redis, job_id) == {0: 1, 1: 1}


def test_segments_written_to_the_outbox_but_never_published_are_published_after_the_grace(
    app: Flask, served: FlaskClient
) -> None:
    services = app.extensions["tts"]
    # What an API killed between writing a job and enqueueing its first window leaves.
    written_at = time.time()
    job_id = _store(app).create(REQUEST, TEXTS[:2], publish=[0, 1])
    job = wait_done(served, job_id, timeout=OUTBOX_GRACE_S + 30)
    assert job["status"] == "done"
    record = _store(app).get(job_id)
    assert record is not None and record.finished_at is not None
    finished_at = record.finished_at
    assert finished_at - written_at >= OUTBOX_GRACE_S, "published before its taker's grace ran out"
    assert services.redis.zscore(keys.OUTBOX, keys.segment_member(job_id, 0)) is None
    assert _segment_events(services.redis, job_id) == {0: 1, 1: 1}


def test_a_live_worker_hands_its_stale_holds_to_the_outbox(app: Flask) -> None:
    services = app.extensions["tts"]
    store, custody = _store(app), Custody(services.redis)
    registry = WorkerRegistry(services.redis, ttl_s=60)
    registry.beat("w-audit", {})
    job_id = store.create(REQUEST, TEXTS)
    for index in (0, 1):
        store.start_segment(job_id, index, worker="w-audit")
    working = {keys.segment_member(job_id, 0)}
    janitor = Janitor(store=store, custody=custody, heartbeats=registry, enqueue=services.enqueue,
                      book=services.book, worker="w-audit", dead_after_s=60, interval_s=1,
                      working_on=lambda: set(working))  # fmt: skip
    assert janitor.release_own_stale(time.time()) == 1
    assert custody.held("w-audit") == working
    assert services.redis.zscore(keys.OUTBOX, keys.segment_member(job_id, 1)) is not None
    store.cancel(job_id)
    registry.remove("w-audit")


def _claimed_earlier(client: redis.Redis, caller: str, key: str, job_id: str, seconds_ago: float) -> None:
    """Leave the claim a request made ``seconds_ago`` and never recorded a job for (its API process died)."""
    value = {"digest": "digest", "job_id": job_id, "filled": False, "claimed_at": time.time() - seconds_ago}
    client.set(keys.idempotency(caller, key), json.dumps(value), ex=TTL_S)


def test_a_retry_after_the_api_died_between_writing_a_job_and_recording_it_gets_that_job(app: Flask) -> None:
    client, store = app.extensions["tts"].redis, _store(app)
    written = store.create(REQUEST, TEXTS, job_id="a" * 32)  # written by the request that then died
    _claimed_earlier(client, "caller", "died-after-writing", written, seconds_ago=CLAIM_TTL_S + 60)
    made: list[str] = []

    def submit(job_id: str) -> str:
        made.append(job_id)
        return job_id

    idem = IdempotencyKeys(client)
    again = idem.submit_once("caller", "died-after-writing", "digest", submit=submit,
                             exists=lambda job_id: store.get(job_id) is not None)  # fmt: skip
    assert again == written and made == [], "the job the key claimed, not a second one"
    recorded = idem.claim("caller", "died-after-writing", "digest", "b" * 32)
    assert recorded is not None and recorded.filled and recorded.job_id == written
    store.cancel(written)


def test_an_idempotency_claim_whose_job_was_never_written_is_taken_over_after_seconds(app: Flask) -> None:
    client, store = app.extensions["tts"].redis, _store(app)
    idem = IdempotencyKeys(client)
    _claimed_earlier(client, "caller", "died-before-writing", "c" * 32, seconds_ago=CLAIM_TTL_S + 1)
    taken = idem.submit_once("caller", "died-before-writing", "digest", submit=lambda job_id: job_id,
                             exists=lambda job_id: store.get(job_id) is not None)  # fmt: skip
    assert taken != "c" * 32
    recorded = idem.claim("caller", "died-before-writing", "digest", "d" * 32)
    assert recorded is not None and recorded.filled and recorded.job_id == taken
    assert client.ttl(keys.idempotency("caller", "died-before-writing")) > CLAIM_TTL_S


def test_a_fresh_claim_whose_job_is_not_written_yet_is_waited_for_then_answered_503(app: Flask) -> None:
    client, store = app.extensions["tts"].redis, _store(app)
    _claimed_earlier(client, "caller", "in-flight", "e" * 32, seconds_ago=0)
    with pytest.raises(ServiceUnavailable, match="still being accepted"):
        IdempotencyKeys(client).submit_once("caller", "in-flight", "digest", submit=lambda job_id: job_id,
                                            exists=lambda job_id: store.get(job_id) is not None)  # fmt: skip


#: A queue list no worker pops, standing for a broker queue whose task waits its turn.
WAITING = "tts-test:waiting"


def _janitor(app: Flask, worker: str) -> Janitor:
    services = app.extensions["tts"]
    return Janitor(
        store=_store(app),
        custody=Custody(services.redis, BrokerKeys(queues=[WAITING]), task_name=SYNTHESIZE_TASK),
        heartbeats=WorkerRegistry(services.redis, ttl_s=6),
        enqueue=services.enqueue,
        book=services.book,
        worker=worker,
        dead_after_s=6,
        interval_s=2,
        working_on=set,
    )


def _kombu_message(job_id: str, index: int) -> dict[str, Any]:
    body = base64.b64encode(json.dumps([[job_id, index], {}, {}]).encode()).decode()
    return {"body": body, "headers": {"task": SYNTHESIZE_TASK, "id": f"lost-{index}"}, "properties": {}}


def test_a_full_account_finds_segments_that_are_nowhere_and_orphaned_deliveries(
    app: Flask, served: FlaskClient
) -> None:
    services = app.extensions["tts"]
    client: redis.Redis = services.redis
    store = _store(app)
    job_id = store.create(REQUEST, TEXTS)
    # Segment 0: popped by a worker that died before kombu recorded it (nowhere). Segment 1: delivered to a
    # worker that died before holding it (kombu's unacked hash, an hour from redelivery). Segment 2: queued.
    client.hset("unacked", "tag-1", json.dumps([_kombu_message(job_id, 1), "", "realtime"]))
    client.zadd("unacked_index", {"tag-1": time.time() - 60})
    client.lpush(WAITING, json.dumps(_kombu_message(job_id, 2)))
    janitor = _janitor(app, "w-accountant")
    try:
        assert janitor.account(time.time()) == 2
        assert client.hget("unacked", "tag-1") is None, "the orphaned delivery is dropped, not redelivered later"
        assert client.zscore(keys.OUTBOX, keys.segment_member(job_id, 2)) is None, "a queued segment is not lost"
    finally:
        client.delete(WAITING)
    services.enqueue(job_id, [2], "realtime")  # the queued task, as the worker would have popped it
    assert wait_done(served, job_id)["status"] == "done"
    assert _segment_events(client, job_id) == {0: 1, 1: 1, 2: 1}


class _SubmitAfterOutboxRead(Custody):
    """The real custody reads, with a submission landing just after the account has read the outbox."""

    def __init__(self, client: redis.Redis, submit: Callable[[], str]) -> None:
        super().__init__(client, BrokerKeys(queues=[WAITING]), task_name=SYNTHESIZE_TASK)
        self.submit = submit
        self.submitted: list[str] = []

    def in_outbox(self) -> set[str]:
        seen = super().in_outbox()
        self.submitted.append(self.submit())
        return seen


def test_a_job_submitted_while_the_account_is_taken_is_not_declared_lost_and_published_twice(app: Flask) -> None:
    services = app.extensions["tts"]
    store = _store(app)
    custody = _SubmitAfterOutboxRead(services.redis, lambda: store.create(REQUEST, TEXTS, publish=range(len(TEXTS))))
    janitor = Janitor(store=store, custody=custody, heartbeats=WorkerRegistry(services.redis, ttl_s=6),
                      enqueue=services.enqueue, book=services.book, worker="w-accountant", dead_after_s=6,
                      interval_s=2, working_on=set)  # fmt: skip
    now = time.time()
    assert janitor.account(now) == 0
    (job_id,) = custody.submitted
    # Still the API's grace in the outbox (its own publish follows), not "due now" for the janitor's.
    grace = [services.redis.zscore(keys.OUTBOX, keys.segment_member(job_id, i)) for i in range(len(TEXTS))]
    assert all(score is not None and score > now for score in grace), grace
    store.cancel(job_id)


def test_a_broker_channel_whose_connection_is_gone_raises_a_connection_error(redis_server: RedisServer) -> None:
    broker.install()
    connection = Connection(redis_server.url)
    channel = connection.default_channel
    connection.collect()  # what Celery's consumer does on a connection loss, before closing
    with pytest.raises(redis.ConnectionError):
        channel._connparams()


def test_a_full_account_drops_deliveries_of_written_segments(app: Flask) -> None:
    client: redis.Redis = app.extensions["tts"].redis
    store = _store(app)
    job_id = store.create(REQUEST, TEXTS[:1])
    store.write_segment(job_id, 0, b"\0\0", sample_rate=8000, meta={})
    # The ack of a written segment, lost with its connection: kombu would deliver it again an hour later.
    client.hset("unacked", "tag-spent", json.dumps([_kombu_message(job_id, 0), "", "realtime"]))
    client.zadd("unacked_index", {"tag-spent": time.time() - 60})
    assert _janitor(app, "w-hygiene").account(time.time()) == 0
    assert client.hget("unacked", "tag-spent") is None
    assert client.zscore("unacked_index", "tag-spent") is None

"""A worker's upkeep (janitor, text-stream sweep, reconciler) outlives any one step's failure, and what Celery drops
with a lost broker connection is handed on."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from cache import keys
from cache.jobstore import JobStatus
from core.metrics import UPKEEP_FAILURES
from core.settings import Settings, load_settings
from devstack.local import free_port
from tests.support.databases import spare_database
from tests.support.jobs import REQUEST, TEXTS
from tests.support.servers import RedisServer
from workers.__main__ import forget_dropped_deliveries
from workers.celery_app import celery_enqueue, create_celery
from workers.runtime import WorkerRuntime
from workers.wiring import REDIS_TIMEOUT_S, build_runtime, job_store_client

UPKEEP_DB = 12


@pytest.fixture
def quiet_url(redis_server: RedisServer) -> Iterator[str]:
    """A database of the suite's Redis that no running worker serves."""
    with spare_database(redis_server.url, UPKEEP_DB) as url:
        yield url


def _settings(url: str, settings_env: dict[str, str]) -> Settings:
    return load_settings(redis_url=url, models_file=settings_env["TTS_MODELS_FILE"],
                         tiny_model_dir=settings_env["TTS_TINY_MODEL_DIR"], default_model="espeak-en")  # fmt: skip


def _runtime(settings: Settings, broker_url: str) -> WorkerRuntime:
    """A worker's runtime on ``settings`` whose Celery publishes to ``broker_url``."""
    celery = create_celery(settings.model_copy(update={"redis_url": broker_url}))
    return build_runtime(settings, hostname="w-upkeep", enqueue=celery_enqueue(celery))


def test_a_broker_publish_failing_in_the_janitors_pass_neither_ends_the_upkeep_nor_skips_the_reconciler(
    quiet_url: str, settings_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(quiet_url, settings_env)
    # Nothing listens on the broker's port: Celery's publish gives up with kombu's OperationalError, not a
    # Redis error (as when the broker drops mid-pass while the job store still answers).
    runtime = _runtime(settings, f"redis://127.0.0.1:{free_port()}/0")
    client = redis.Redis.from_url(quiet_url)
    try:
        store = runtime.store
        to_publish = store.create(REQUEST, TEXTS)  # its segments sit in the outbox: the janitor publishes them
        client.zadd(keys.OUTBOX, {keys.segment_member(to_publish, i): time.time() - 10 for i in range(len(TEXTS))})
        expired = store.create(REQUEST, TEXTS)  # past its deadline: the reconciler fails it
        client.zrem(keys.OUTBOX, *(keys.segment_member(expired, i) for i in range(len(TEXTS))))
        client.hset(keys.job(expired), "created_at", f"{time.time() - settings.job_deadline_s - 60:.6f}")
        failures_before = UPKEEP_FAILURES.labels("janitor pass")._value.get()

        with caplog.at_level(logging.ERROR, logger="workers.runtime"):
            runtime.look_after({"reconcile": 0.0, "trim": 0.0})  # raises nothing

        assert UPKEEP_FAILURES.labels("janitor pass")._value.get() == failures_before + 1
        assert any("janitor pass failed" in r.getMessage() and r.exc_info for r in caplog.records)
        failed = store.get(expired)
        assert failed is not None and failed.status is JobStatus.FAILED
        assert "deadline" in (failed.error or "")
        # Nothing was lost: what could not be published is still in the outbox for the next pass.
        assert client.zscore(keys.OUTBOX, keys.segment_member(to_publish, 0)) is not None
    finally:
        runtime.backend.close()
        client.close()


def test_the_heartbeat_says_when_the_last_upkeep_pass_ended_so_a_stuck_upkeep_shows(
    quiet_url: str, settings_env: dict[str, str]
) -> None:
    settings = _settings(quiet_url, settings_env)
    runtime = _runtime(settings, quiet_url)
    try:
        runtime.announce()
        (before,) = runtime.heartbeats.alive()
        runtime.look_after({"reconcile": 0.0, "trim": 0.0})
        runtime.announce()
        (after,) = runtime.heartbeats.alive()
        assert before["upkeep_at"] < after["upkeep_at"] <= time.time() + 0.0005  # kept to the millisecond, rounded
    finally:
        runtime.heartbeats.remove("w-upkeep")
        runtime.backend.close()


def test_deliveries_celery_drops_with_its_broker_connection_are_handed_on_and_their_redelivery_is_made(
    quiet_url: str, settings_env: dict[str, str]
) -> None:
    settings = _settings(quiet_url, settings_env)
    runtime = _runtime(settings, quiet_url)
    client = redis.Redis.from_url(quiet_url)
    try:
        store, synthesizer = runtime.store, runtime.synthesizer
        job_id = store.create(REQUEST, TEXTS, publish=range(len(TEXTS)))
        store.published(job_id, range(len(TEXTS)))
        waiting, running = keys.segment_member(job_id, 0), keys.segment_member(job_id, 1)
        synthesizer.received(job_id, 0)  # a retry waiting out its countdown in Celery's timer
        synthesizer.received(job_id, 1)
        synthesizer.started(job_id, 1)  # a thread is making this one

        # The consumer lost its broker connection: Celery dropped the request in its timer, and stops its steps.
        forget_dropped_deliveries(runtime)(parent=None).stop(parent=None)

        assert runtime.janitor.release_own_stale(time.time()) == 1
        assert client.zscore(keys.OUTBOX, waiting) is not None, "the dropped delivery's segment is handed on"
        assert runtime.janitor.custody.held("w-upkeep") == {running}, "the running one stays held"
        synthesizer.received(job_id, 0)  # kombu delivers the dropped message again
        assert synthesizer._deliveries_here(waiting) == 1, "taken as the only delivery here, so it is made"
    finally:
        runtime.backend.close()
        client.close()


def test_a_workers_call_to_a_job_store_that_stopped_answering_fails_within_its_timeout_instead_of_hanging(
    quiet_url: str, settings_env: dict[str, str]
) -> None:
    """A connection a network fault left half-open: without a timeout the heartbeat's or a task's thread hung."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    client = job_store_client(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout_s=1.0)
    began = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()  # connected, and never answered
    assert time.monotonic() - began < 5 and len(accepted) == 1
    client.close()
    for held in (*accepted, silent):
        held.close()
    runtime = _runtime(_settings(quiet_url, settings_env), quiet_url)
    try:
        options = runtime.store.redis.connection_pool.connection_kwargs
        assert options["socket_timeout"] == REDIS_TIMEOUT_S and options["socket_keepalive"] is True
    finally:
        runtime.backend.close()


def test_the_upkeep_unloads_idle_models_but_keeps_the_workers_default_resident(
    quiet_url: str, settings_env: dict[str, str]
) -> None:
    """Before, a default model that was not pinned was unloaded after TTS_MODEL_IDLE_S, and the first request after
    a quiet spell waited for its load (the README says each worker keeps its default resident)."""
    from dataclasses import replace as with_changes

    from workers.engines.base import SynthesisRequest

    runtime = _runtime(_settings(quiet_url, settings_env), quiet_url)
    pool = runtime.backend.pool
    try:
        default = runtime.registry.get(None)
        assert default.name == "espeak-en" and not default.pinned
        other = with_changes(runtime.registry.get("espeak-yue"), pinned=False)
        pool.synthesize(default, [SynthesisRequest(text="Hello.")])
        pool.synthesize(other, [SynthesisRequest(text="你好")])
        pool.idle_s = 0.0  # both idle at once: what TTS_MODEL_IDLE_S (600 s) does after ten quiet minutes
        runtime.look_after({"reconcile": time.monotonic(), "trim": time.monotonic()})
        assert [m["model"] for m in pool.loaded()] == ["espeak-en"]
    finally:
        runtime.backend.close()


def test_a_delivery_of_an_ended_job_lets_its_hold_go_so_the_janitor_finds_nothing_stale(
    quiet_url: str, settings_env: dict[str, str]
) -> None:
    """Before, the hold a delivery took was left behind when the job had ended: the janitor warned that the worker
    held segments it no longer works on, and put them in the outbox only for them to be dropped there."""
    runtime = _runtime(_settings(quiet_url, settings_env), quiet_url)
    try:
        store, synthesizer = runtime.store, runtime.synthesizer
        canceled, written = store.create(REQUEST, TEXTS), store.create(REQUEST, TEXTS)
        store.cancel(canceled)
        store.write_segment(written, 0, b"\0\0", sample_rate=8000, meta={})
        for job_id in (canceled, written):
            assert synthesizer.received(job_id, 0)
            synthesizer.started(job_id, 0)
            synthesizer.run(job_id, 0)
            synthesizer.let_go(job_id, 0)
        assert runtime.janitor.custody.held("w-upkeep") == set()
        assert runtime.janitor.release_own_stale(time.time()) == 0
        store.cancel(written)
    finally:
        runtime.backend.close()

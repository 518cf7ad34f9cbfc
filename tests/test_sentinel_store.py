"""A Sentinel group goes wherever a Redis URL goes, and the API promises only what a replica holds.

The failover itself (a primary killed, frozen, a Sentinel killed) is in tests/chaos/test_failover.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from flask import Flask
from werkzeug.test import TestResponse

from api import create_app
from api.services import build_services
from cache import keys
from cache.connect import SentinelBlockingPool, redis_client
from cache.jobstore import JobRequest, JobStore, store_of
from cache.nodes import noting
from cache.replication import Replication, Round, Unreplicated
from cache.workers import WorkerRegistry
from celery_config import celery_settings, queue_keys
from core.errors import SettingsInvalid
from core.metrics import REPLICA_CONFIRMATIONS
from core.settings import load_settings
from core.store_url import SentinelUrl, parse_sentinel_url
from devstack.redis_server import RedisServer
from devstack.sentinel import SentinelGroup
from tests.conftest import IN_CI
from workers.wiring import job_store_client

T = TypeVar("T")

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None, cache=False)  # fmt: skip


def test_a_sentinel_url_names_its_sentinels_service_database_and_passwords() -> None:
    url = "redis+sentinel://app:p%40ss@s1:26379,s2:26380,[::1]/tts/3?sentinel_password=guard"
    assert parse_sentinel_url(url) == SentinelUrl(
        sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26379)),
        service="tts",
        db=3,
        username="app",
        password="p@ss",
        sentinel_password="guard",
    )
    assert parse_sentinel_url("redis+sentinel://s1/tts").db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "names the service"),
        ("redis+sentinel:///tts/0", "at least one Sentinel"),
        ("redis+sentinel://s1:port/tts", "no Sentinel address"),
        ("redis+sentinel://s1/tts/zero", "no number"),
        ("redis+sentinel://s1/tts?socket_timeout=1", "only sentinel_password"),
        ("http://redis.example/0", "redis+sentinel://"),
    ],
)
def test_a_malformed_store_url_is_refused_at_start_saying_what_it_may_be(url: str, says: str) -> None:
    with pytest.raises(SettingsInvalid) as refused:
        load_settings(redis_url=url)
    assert "REDIS_URL" in str(refused.value) and says in str(refused.value)


def test_the_api_waits_for_one_replica_under_sentinel_and_for_none_with_one_redis() -> None:
    assert load_settings(redis_url="redis+sentinel://s1/tts").replicas_to_wait_for == 1
    assert load_settings(redis_url="redis://127.0.0.1:6379/0").replicas_to_wait_for == 0
    assert load_settings(redis_url="redis://127.0.0.1:6379/0", redis_wait_replicas=2).replicas_to_wait_for == 2


def test_the_broker_gets_one_sentinel_url_per_sentinel_and_the_service_as_master_name() -> None:
    conf = celery_settings(load_settings(redis_url="redis+sentinel://:pw@s1:1,s2:2/tts/4?sentinel_password=g"))
    assert conf["broker_url"] == "sentinel://:pw@s1:1/4;sentinel://:pw@s2:2/4"
    options = conf["broker_transport_options"]
    assert options["master_name"] == "tts" and options["sentinel_kwargs"] == {"password": "g"}
    assert options["queue_order_strategy"] == "priority", "the lanes keep their order under Sentinel"


def _installed(build: Callable[[], T]) -> T:
    """Return what ``build`` makes of redis-server's processes; skip locally, fail in CI, where none is installed."""
    try:
        return build()
    except RuntimeError as e:
        if IN_CI:
            raise
        pytest.skip(str(e))


def _server(workdir: Path) -> RedisServer:
    server = _installed(lambda: RedisServer(workdir))
    server.start()
    return server


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """Run a Sentinel group (a primary, two replicas, three Sentinels) for this module."""
    group = _installed(lambda: SentinelGroup(tmp_path_factory.mktemp("redis-ha")))
    group.start()
    yield group
    group.stop()


def _app(url: str, settings_env: dict[str, str], **settings: object) -> Flask:
    WorkerRegistry(redis_client(url), ttl_s=60).beat("stand-in-worker", {})  # admission needs a live worker
    return create_app({"redis_url": url, "models_file": Path(settings_env["TTS_MODELS_FILE"]),
                       "tiny_model_dir": Path(settings_env["TTS_TINY_MODEL_DIR"]), "default_model": "espeak-en",
                       **settings})  # fmt: skip


def test_every_client_reaches_the_primary_the_sentinels_name(group: SentinelGroup) -> None:
    services = build_services(load_settings(redis_url=group.url, default_model="espeak-en"))
    try:
        assert isinstance(services.redis.connection_pool, SentinelBlockingPool), "the requests' pool stays bounded"
        clients = {"job store": services.redis, "sentence cache": services.cache.redis, "event hub": services.hub.redis}
        for name, client in clients.items():
            client.set(f"written-by:{name}", 1)
            assert redis.Redis(port=group.primary().port).exists(f"written-by:{name}"), name
    finally:
        services.close()


def test_a_job_through_a_sentinel_url_is_answered_202_once_a_replica_holds_it(
    group: SentinelGroup, settings_env: dict[str, str]
) -> None:
    app = _app(group.url, settings_env)
    try:
        answer = app.test_client().post("/v1/jobs", json={"text": "Kept on two machines. At least."})
        assert answer.status_code == 202, answer.get_data(as_text=True)
        job = answer.get_json()
        primary = group.primary().port
        replicas = [redis.Redis(port=node.port) for node in group.nodes if node.port != primary]
        assert any(r.exists(keys.job(job["id"])) for r in replicas), "202 came before any replica held the job"
        queued = sum(int(redis.Redis(port=primary).llen(key)) for key in queue_keys("realtime"))
        assert queued >= job["segments_total"], "the broker took the tasks through the Sentinels too"
    finally:
        app.extensions["tts"].close()


def test_a_job_no_replica_confirms_in_time_is_answered_503_saying_how_to_find_it(
    tmp_path: Path, settings_env: dict[str, str]
) -> None:
    server = _server(tmp_path / "alone")  # no replica: WAIT 1 times out
    app = _app(server.url, settings_env, redis_wait_replicas=1, redis_wait_timeout_ms=50)
    try:
        answer = app.test_client().post("/v1/jobs", json={"text": "Nobody copies this."})
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
        message = answer.get_json()["error"]["message"]
        assert "0 of the 1 replicas" in message and "Idempotency-Key" in message, message
    finally:
        app.extensions["tts"].close()
        server.stop()


def test_a_primary_that_lost_its_replicas_refuses_writes_and_the_api_answers_503(
    tmp_path: Path, settings_env: dict[str, str]
) -> None:
    server = _server(tmp_path / "cut-off")
    app = _app(server.url, settings_env)
    redis.Redis(port=server.port).config_set("min-replicas-to-write", 1)  # as every node of a Sentinel group runs
    try:
        answer = app.test_client().post("/v1/jobs", json={"text": "Cut off from its replicas."})
        assert answer.status_code == 503 and "Retry-After" in answer.headers
        assert "none of its replicas answer" in answer.get_json()["error"]["message"]
    finally:
        app.extensions["tts"].close()
        server.stop()


def test_every_reply_of_a_sentinel_client_notes_its_node_and_another_node_is_not_confirmed(
    group: SentinelGroup,
) -> None:
    client = redis_client(group.url, note_nodes=True)
    replication = Replication(client, replicas=1, timeout_ms=1000)
    with noting() as touched:
        client.get("anything")
    primary = ("127.0.0.1", group.primary_port())
    assert touched == {primary}
    assert replication.confirm(touched).node == primary
    stale = next(("127.0.0.1", node.port) for node in group.nodes if node.port != primary[1])
    with pytest.raises(Unreplicated, match=f"came from 127.0.0.1:{stale[1]}, not from the primary"):
        replication.confirm({primary, stale})  # a reply of the old primary, after a failover


def test_callers_that_arrive_during_a_round_share_the_next_one(group: SentinelGroup) -> None:
    replication = Replication(redis_client(group.url), replicas=1, timeout_ms=1000)
    rounds, release = [], threading.Event()
    run_round = replication._round

    def held_round() -> Round:  # the first round waits until every other caller waits for a round
        rounds.append(time.monotonic())
        if len(rounds) == 1:
            release.wait(10)
        return run_round()

    replication._round = held_round  # type: ignore[method-assign]
    answers: list[tuple[float, float]] = []

    def call() -> None:
        since = time.monotonic()
        answers.append((since, replication.confirm(since=since).started))

    threads = [threading.Thread(target=call) for _ in range(16)]
    threads[0].start()
    _wait_for(lambda: len(rounds) == 1)
    for thread in threads[1:]:
        thread.start()
    _wait_for(lambda: len(replication._changed._waiters) == 15)  # type: ignore[attr-defined]
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(answers) == 16 and all(started >= since for since, started in answers), "a round began too early"
    assert len(rounds) <= 2, f"16 callers took {len(rounds)} rounds: the 15 that waited did not share one"


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_a_write_no_replica_confirms_raises_a_lost_connection_though_the_primary_applied_it(tmp_path: Path) -> None:
    server = _server(tmp_path / "alone")  # no replica: WAIT 1 times out
    client = redis.Redis(port=server.port)
    store = JobStore(client, ttl=60, replication=Replication(client, replicas=1, timeout_ms=50))
    try:
        job_id = store.create(REQUEST, ["Only here."])
        with pytest.raises(Unreplicated, match="0 of the 1 replicas") as refused:
            store.write_segment(job_id, 0, b"\0\0" * 160, sample_rate=16000, meta={})
        assert isinstance(refused.value, redis.ConnectionError), "a worker retries it as a lost connection"
        assert store.has_segment(job_id, 0), "the primary applied it: only the confirmation is missing"
    finally:
        server.stop()


@contextlib.contextmanager
def _replicas_paused(group: SentinelGroup) -> Iterator[None]:
    """Freeze the group's replicas (SIGSTOP) for the block: the primary's WAITs go unanswered."""
    replicas = [node for node in group.nodes if node.port != group.primary_port()]
    for node in replicas:
        node.pause()
    try:
        yield
    finally:
        for node in replicas:
            node.resume()


def test_a_stream_breaks_off_before_a_chunk_no_replica_confirms_and_gives_its_slot_back(
    group: SentinelGroup, settings_env: dict[str, str]
) -> None:
    app = _app(group.url, settings_env, redis_wait_timeout_ms=300)
    svc, client = app.extensions["tts"], app.test_client()
    try:
        job = client.post("/v1/jobs", json={"text": "Heard only once a replica has it."}).get_json()
        svc.store.write_segment(job["id"], 0, b"\1\0" * 2400, sample_rate=24000, meta={"duration_s": 0.1})
        stream = client.get(f"/v1/jobs/{job['id']}/events", buffered=False)
        assert stream.status_code == 200 and svc.holds.open_here == 1
        chunks = iter(stream.response)
        assert next(chunks).startswith(b"retry:"), "the first chunk reads nothing"
        with _replicas_paused(group), pytest.raises(Unreplicated, match="0 of the 1 replicas"):
            next(chunks)  # segment 0's event: read, then not confirmed
        stream.close()
        assert svc.holds.open_here == 0, "the stream's slot was not given back"
    finally:
        svc.close()


def test_answers_wait_for_a_replica_under_sentinel_and_are_503_while_none_confirms(
    group: SentinelGroup, settings_env: dict[str, str]
) -> None:
    app = _app(group.url, settings_env, redis_wait_timeout_ms=300)
    client = app.test_client()
    try:
        job = client.post("/v1/jobs", json={"text": "Read back from the primary."}).get_json()
        confirmed = REPLICA_CONFIRMATIONS.labels("confirmed")._value.get()
        assert client.get(f"/v1/jobs/{job['id']}").status_code == 200
        assert REPLICA_CONFIRMATIONS.labels("confirmed")._value.get() > confirmed, "the answer was not confirmed"
        with _replicas_paused(group):
            answer = client.get(f"/v1/jobs/{job['id']}")
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
        assert "0 of the 1 replicas" in answer.get_json()["error"]["message"]
    finally:
        app.extensions["tts"].close()


def test_what_a_primary_frozen_past_its_failover_takes_or_answers_on_waking_reaches_no_caller(
    tmp_path: Path, settings_env: dict[str, str]
) -> None:
    group = _installed(lambda: SentinelGroup(tmp_path / "redis-ha"))
    group.start()
    app = _app(group.url, settings_env)
    client = app.test_client()
    try:
        job = client.post("/v1/jobs", json={"text": "Written before the freeze."}).get_json()
        store = store_of(job_store_client(group.url), load_settings(redis_url=group.url))  # as a worker wires it
        assert store.get(job["id"]) is not None and client.get(f"/v1/jobs/{job['id']}").status_code == 200
        old = group.primary()
        old.pause()
        outcomes: dict[str, object] = {}

        def write() -> None:  # a worker's segment, sent to the frozen primary: it runs it as it wakes
            try:
                outcomes["write"] = store.write_segment(job["id"], 0, b"\1\0" * 160, sample_rate=24000, meta={})
            except redis.ConnectionError as e:
                outcomes["write"] = e

        def read() -> None:  # a caller's poll, read from the frozen primary as it wakes
            outcomes["read"] = client.get(f"/v1/jobs/{job['id']}")

        callers = [threading.Thread(target=write), threading.Thread(target=read)]
        for caller in callers:
            caller.start()
        group.wait_new_primary(old.port)
        old.resume()
        for caller in callers:
            caller.join(30)
        # Refused, as a lost connection: NOREPLICAS if the node read its replicas' hang-ups before the write as it
        # woke; else a confirmation that fails (WAIT short, the Sentinels naming another primary, or no Sentinel
        # naming any while they promote one). Which, depends on the order things happen as it wakes.
        told = outcomes["write"]
        assert isinstance(told, redis.ConnectionError), f"the writer was told {told!r}"
        answer = outcomes["read"]
        assert isinstance(answer, TestResponse), answer
        assert answer.status_code == 503 and "Retry-After" in answer.headers, answer.get_data(as_text=True)
        new = group.client(group.primary_port() or 0)  # itself: a client's old connection may still reach the old node
        assert not new.hexists(keys.audio(job["id"]), "0"), (
            "the new primary lacks the segment: the writer makes it again"
        )
        # Answers come from the new primary again once a replica of it is in sync (503 with Retry-After until then).
        _wait_for(lambda: client.get(f"/v1/jobs/{job['id']}").status_code == 200, timeout=30)
    finally:
        app.extensions["tts"].close()
        group.stop()


def test_a_dead_sentinel_is_passed_over_at_once_not_retried(group: SentinelGroup) -> None:
    dead = socket.create_server(("127.0.0.1", 0))  # takes each connection and hangs up: a Sentinel that dies
    accepted = []

    def hang_up() -> None:
        while True:
            try:
                conn, _ = dead.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        sentinels = ",".join(f"127.0.0.1:{port}" for port in [dead.getsockname()[1], *group.sentinel_ports])
        client = redis_client(f"redis+sentinel://{sentinels}/{group.service}/0")
        assert client.ping()
        assert accepted == [1], f"the dead Sentinel was tried {len(accepted)} times before the next was asked"
    finally:
        dead.close()

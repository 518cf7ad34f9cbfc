"""The shared clients a request needs, built once per app and kept in app.extensions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from flask import Flask, current_app

from api.admission import Admission
from api.holds import StreamHolds
from api.submission import Submitter
from cache.breaker import CircuitBreaker
from cache.budget import StoreBudget, build_budget, check_no_eviction
from cache.connect import blocking_pool, redis_client
from cache.events import EventHub
from cache.jobstore import JobStore, store_of
from cache.refusals import Refusals
from cache.replication import Replication
from cache.reservations import Reservations
from cache.schedule import ScheduleBook
from cache.sentences import SentenceCache, build_cache
from cache.stats import API_MAX_AGE_S, Stats
from cache.streams import CallerStreams
from cache.text_streams import TextStreams, build_text_streams
from cache.workers import WorkerRegistry
from core.apikeys import KeyRing
from core.policy import SchedulingPolicy, scheduling_policy
from core.registry import Registry, load_registry
from core.settings import Settings
from workers.celery_app import Enqueue, celery_enqueue, create_celery

#: How long a request waits for one of the process's Redis connections before it answers 503.
REDIS_CONNECTION_WAIT_S = 10


@dataclass
class Services:
    """Everything a view needs, passed around instead of globals."""

    settings: Settings
    redis: redis.Redis
    store: JobStore
    registry: Registry
    workers: WorkerRegistry
    cache: SentenceCache
    admission: Admission
    enqueue: Enqueue
    book: ScheduleBook
    budget: StoreBudget
    hub: EventHub
    holds: StreamHolds
    keys: KeyRing
    policy: SchedulingPolicy
    submitter: Submitter
    text_streams: TextStreams
    #: Waits until a job or piece about to be promised is on replicas (a no-op with none to wait for).
    replication: Replication
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Close every connection these services opened (a server process just exits; tests build many apps)."""
        for close in self.closers:
            close()


def _request_pool(settings: Settings) -> redis.ConnectionPool:
    """Return the bounded pool of Redis connections this process's requests share."""
    # Held streams run by the thousand (gevent): their Redis calls queue for a bounded set of connections instead
    # of opening one each (redis-py's default pool refuses past 100), and their waits share one loop (the hub).
    # A wait without the hub blocks in XREAD for up to max_wait_s: the socket must wait longer.
    return blocking_pool(
        settings.redis_url,
        max_connections=settings.api_redis_connections,
        timeout=REDIS_CONNECTION_WAIT_S,
        note_nodes=True,  # what a request reads is confirmed before it is answered (api/served.py)
        health_check_interval=30,
        socket_timeout=settings.max_wait_s + 10,
    )


def _admission(
    client: redis.Redis,
    settings: Settings,
    *,
    workers: WorkerRegistry,
    book: ScheduleBook,
    budget: StoreBudget,
    policy: SchedulingPolicy,
) -> Admission:
    """Return the admission check of new jobs, with the circuit breaker it consults."""
    stats = Stats(client, max_age_s=API_MAX_AGE_S)  # every submission reads the last minute: twice a second suffices
    breaker = CircuitBreaker(
        client,
        stats,
        failure_rate=settings.breaker_failure_rate,
        min_failures=settings.breaker_min_failures,
        cooldown_s=settings.breaker_cooldown_s,
    )
    return Admission(
        stats=stats, breaker=breaker, workers=workers, book=book, settings=settings, budget=budget, policy=policy,
        reservations=Reservations(client), refusals=Refusals(client),
    )  # fmt: skip


def _holds(client: redis.Redis, settings: Settings, replication: Replication) -> StreamHolds:
    """Return the count of streams and long-polls held open, per caller and for this process; each chunk they send
    waits for ``replication``'s confirmation (api/served.py)."""
    return StreamHolds(
        CallerStreams(client, ttl_s=settings.stream_slot_ttl_s),
        per_caller=settings.max_streams_per_caller,
        per_process=settings.max_streams_per_process,
        ttl_s=settings.stream_slot_ttl_s,
        write_timeout_s=settings.stream_write_timeout_s,
        keepalive_s=settings.stream_keepalive_s,
        confirm=replication.confirm_noted,
    )


def worker_device_kinds(workers: WorkerRegistry) -> frozenset[str]:
    """Return the kinds of device the live workers' model hosts run on (from their heartbeats; empty: none known)."""
    return frozenset(kind for w in workers.alive() for kind in w.get("device_kinds", ()))


def build_services(settings: Settings) -> Services:
    """Connect to Redis and Celery and load the model registry."""
    pool = _request_pool(settings)
    client = redis.Redis(connection_pool=pool)
    celery = create_celery(settings)
    policy = scheduling_policy(settings)
    registry = load_registry(settings)
    workers = WorkerRegistry(client, ttl_s=settings.worker_dead_after_s, max_age_s=API_MAX_AGE_S)
    book = ScheduleBook(client, default_seconds_per_char=settings.seconds_per_char)
    check_no_eviction(client)
    budget = build_budget(client, settings)
    admission = _admission(client, settings, workers=workers, book=book, budget=budget, policy=policy)
    # Every stream and long-poll of this process waits through one loop on one connection, not one each.
    # Its own connection: the request pool may be exhausted by the very streams the hub serves.
    hub = EventHub(redis_client(settings.redis_url, health_check_interval=30, socket_timeout=30))
    store = store_of(client, settings, waiter=hub)
    cache = build_cache(settings)
    enqueue = celery_enqueue(celery)
    text_streams = build_text_streams(
        settings, store=store, book=book, policy=policy, enqueue=enqueue,
        language_of=lambda model: registry.get(model).language,
    )  # fmt: skip
    submitter = Submitter(
        settings=settings,
        registry=registry,
        store=store,
        cache=cache,
        enqueue=enqueue,
        book=book,
        policy=policy,
        admit=admission.admit,
        reserve_audio=admission.reserve_audio,
        release_audio=admission.release_audio,
        text_streams=text_streams,
        device_kinds=lambda: worker_device_kinds(workers),
    )
    return Services(
        settings=settings,
        redis=client,
        store=store,
        registry=registry,
        workers=workers,
        cache=cache,
        admission=admission,
        enqueue=enqueue,
        book=book,
        budget=budget,
        hub=hub,
        holds=_holds(client, settings, store.replication),
        keys=settings.key_ring,
        policy=policy,
        submitter=submitter,
        text_streams=text_streams,
        replication=store.replication,
        closers=[pool.disconnect, hub.close, cache.redis.connection_pool.disconnect, celery.close],
    )


def init_app(app: Flask, services: Services) -> None:
    """Attach the services to the app."""
    app.extensions["tts"] = services


def services() -> Services:
    """Return the current app's services."""
    found: Services = current_app.extensions["tts"]
    return found

"""Wire one worker process's dependencies from the settings: its Redis client, store, model pool, batcher,
synthesizer, janitor, reconciler and text-stream sweep, built once and handed to the runtime."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import redis

from cache.budget import StoreBudget, build_budget, check_no_eviction
from cache.connect import redis_client
from cache.custody import BrokerKeys, Custody
from cache.jobstore import JobStore, store_of
from cache.reservations import Reservations
from cache.schedule import ScheduleBook
from cache.sentences import build_cache
from cache.stats import Stats
from cache.text_streams import build_text_streams
from cache.workers import WorkerRegistry
from celery_config import QUEUES, SYNTHESIZE_TASK, queue_keys
from core.metrics import BATCH_SIZE, SYNTHESIS_SECONDS
from core.policy import SchedulingPolicy, scheduling_policy
from core.registry import load_registry
from core.settings import Settings
from workers.arrivals import FirstArrivals
from workers.backend import PooledBackend
from workers.batcher import Batcher, BatchObserver
from workers.celery_app import Enqueue
from workers.janitor import Janitor
from workers.launch import visible_gpus
from workers.layout import Layout, machine_layout
from workers.pool.handle import ModelHost
from workers.pool.pool import ModelPool, replica_device
from workers.reconciler import Reconciler
from workers.runtime import WorkerRuntime
from workers.segment import SegmentSynthesizer

#: A worker's own Redis calls (the broker's are kombu's) answer or fail within this. Without it, a connection a
#: network fault left half-open blocked its thread for good: the heartbeat's (the worker then looked dead while it
#: worked), the upkeep's, or a task's. Far above the longest blocking read a worker makes (the arrivals' 250 ms
#: XREAD) and any script it runs.
REDIS_TIMEOUT_S = 30.0


def batch_observer(stats: Stats) -> BatchObserver:
    """Return a callback recording each engine call in the metrics and the shared throughput stats."""

    def observe(model: str, size: int, chars: int, seconds: float, first_s: float) -> None:
        BATCH_SIZE.labels(model).observe(size)
        SYNTHESIS_SECONDS.labels(model).observe(seconds)
        with contextlib.suppress(redis.RedisError):
            # A segment made alone: how soon its first audio came is what the first-audio check compares with.
            solo = size == 1
            # heard_s is never 0 for a call that recorded it: a window with none is one of workers that do not say.
            stats.record(chars=chars, busy_s=seconds, segments=size, calls=1, heard_s=max(first_s, 1e-6),
                         solo_chars=chars if solo else 0, solo_s=first_s if solo else 0.0, model=model)  # fmt: skip

    return observe


def _model_pool(settings: Settings, layout: Layout) -> ModelPool:
    """Return the pool that runs each model in a host process of its own."""
    # "auto" is resolved inside each model host: the worker itself never imports torch.
    return ModelPool(
        lambda spec, replica: ModelHost(
            spec,
            device=replica_device(settings.device, replica),
            log_level=settings.log_level,
            torch_threads=layout.torch_threads,
            fragments=settings.fragments,
            graphs=settings.cuda_graphs,
        ),
        budget_mb=settings.model_budget_mb,
        idle_s=settings.model_idle_s,
        call_timeout_s=settings.task_time_limit_s,
    )


def _batcher(settings: Settings, layout: Layout, pool: ModelPool, stats: Stats, policy: SchedulingPolicy) -> Batcher:
    """Return the batcher feeding ``pool``, trading fuller batches against urgency as the policy says."""
    return Batcher(
        pool.synthesize,
        max_batch=settings.batch_max_size,
        max_wait_s=settings.batch_wait_ms / 1000,
        max_ratio=settings.batch_max_ratio,
        timing=policy.batch_timing,
        replicas=layout.replicas,
        observe=batch_observer(stats),
        join_batch=pool.join if settings.batch_join else None,
        share_cores=pool.share_cores,
        cores=layout.shared_cores,
    )


@dataclass(frozen=True)
class _Shared:
    """What a worker's parts share: its Redis client, the records kept there, its scheduling policy."""

    client: redis.Redis
    store: JobStore
    stats: Stats
    book: ScheduleBook
    heartbeats: WorkerRegistry
    budget: StoreBudget
    policy: SchedulingPolicy


def _janitor(
    settings: Settings, shared: _Shared, *, hostname: str, enqueue: Enqueue, synthesizer: SegmentSynthesizer
) -> Janitor:
    """Return the janitor that hands dead workers' segments on and accounts for live jobs'."""
    return Janitor(
        store=shared.store,
        custody=Custody(
            shared.client,
            BrokerKeys(queues=[key for lane in QUEUES for key in queue_keys(lane)]),
            task_name=SYNTHESIZE_TASK,
        ),
        heartbeats=shared.heartbeats,
        enqueue=enqueue,
        book=shared.book,
        worker=hostname,
        dead_after_s=settings.worker_dead_after_s,
        interval_s=settings.heartbeat_s,
        working_on=synthesizer.working_on,
        account_every_s=settings.reconcile_interval_s,
        policy=shared.policy,
        budget=shared.budget,
        reservations=Reservations(shared.client),
    )


def job_store_client(url: str, *, timeout_s: float = REDIS_TIMEOUT_S) -> redis.Redis:
    """Return the worker's client of the job store: every call answers or raises (a RedisError) within
    ``timeout_s``, and a dead peer is found by TCP keepalive while the connection idles."""
    return redis_client(
        url, note_nodes=True, health_check_interval=30, socket_timeout=timeout_s,
        socket_connect_timeout=min(10.0, timeout_s), socket_keepalive=True,
    )  # fmt: skip


def worker_layout(settings: Settings) -> Layout:
    """Return this worker's model hosts and threads, ``auto`` chosen for the machine (and logged)."""
    # nvidia-smi is only asked when a device is left to auto: a worker the launcher pinned names its GPU.
    visible = visible_gpus() if "auto" in settings.device else []
    return machine_layout(settings.model_replicas, settings.torch_threads, settings.device, visible)


def build_runtime(settings: Settings, *, hostname: str, enqueue: Enqueue) -> WorkerRuntime:
    """Wire a worker's dependencies from the settings."""
    client = job_store_client(settings.redis_url)
    check_no_eviction(client)
    shared = _Shared(
        client=client,
        store=store_of(client, settings),
        stats=Stats(client),
        book=ScheduleBook(client, default_seconds_per_char=settings.seconds_per_char),
        heartbeats=WorkerRegistry(client, ttl_s=settings.worker_dead_after_s),
        budget=build_budget(client, settings),
        policy=scheduling_policy(settings),
    )
    registry = load_registry(settings)
    layout = worker_layout(settings)
    pool = _model_pool(settings, layout)
    backend = PooledBackend(
        batcher=_batcher(settings, layout, pool, shared.stats, shared.policy),
        pool=pool,
        timeout_s=settings.task_time_limit_s,
    )
    synthesizer = SegmentSynthesizer(
        stats=shared.stats,
        enqueue=enqueue,
        cache=build_cache(settings),
        store=shared.store,
        registry=registry,
        backend=backend,
        max_attempts=settings.segment_max_attempts,
        worker=hostname,
        book=shared.book,
        policy=shared.policy,
        wait_for_room=shared.budget.wait_for_room,
        has_room=shared.budget.room_to_write,
        arrivals=FirstArrivals(client, shared.store.segment_meta_one),
    )
    reconciler = Reconciler(
        store=shared.store,
        enqueue=enqueue,
        stall_s=settings.reconcile_stall_s,
        deadline_s=settings.job_deadline_s,
        book=shared.book,
    )
    return WorkerRuntime(
        settings=settings,
        layout=layout,
        hostname=hostname,
        device=settings.device,
        store=shared.store,
        registry=registry,
        backend=backend,
        heartbeats=shared.heartbeats,
        reconciler=reconciler,
        synthesizer=synthesizer,
        janitor=_janitor(settings, shared, hostname=hostname, enqueue=enqueue, synthesizer=synthesizer),
        text_streams=build_text_streams(
            settings,
            store=shared.store,
            book=shared.book,
            policy=shared.policy,
            enqueue=enqueue,
            language_of=lambda model: registry.get(model).language,
        ),
    )

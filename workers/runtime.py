"""Everything one worker process holds: store, registry, backend, and its heartbeat."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

import redis
from celery import Celery

from cache.jobstore import JobStore
from cache.workers import WorkerRegistry
from core.registry import Registry, load_registry
from core.settings import Settings
from workers.backend import InProcessBackend, SynthesisBackend
from workers.engines.factory import build_engine, resolve_device
from workers.segment import SegmentSynthesizer

log = logging.getLogger(__name__)


@dataclass
class WorkerRuntime:
    """The worker's dependencies, built once per process and handed to tasks."""

    settings: Settings
    hostname: str
    device: str
    store: JobStore
    registry: Registry
    backend: SynthesisBackend
    heartbeats: WorkerRegistry
    synthesizer: SegmentSynthesizer
    _stop: threading.Event = field(default_factory=threading.Event)

    def announce(self) -> None:
        """Write this worker's heartbeat once."""
        self.heartbeats.beat(
            self.hostname, {"pid": os.getpid(), "device": self.device, "models": self.backend.loaded_models()}
        )

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            try:
                self.announce()
            except redis.RedisError as e:
                log.warning("heartbeat failed: %s", e)

    def start(self) -> None:
        """Load the default model, then announce this worker every few seconds."""
        spec = self.registry.get(None)
        log.info("worker %s on %s: preloading default model %r (engine %s)", self.hostname, self.device, spec.name, spec.engine)
        self.backend.synthesize(spec, _warm_request())
        log.info("worker %s ready: serving model %r with engine %s", self.hostname, spec.name, spec.engine)
        self.announce()
        threading.Thread(target=self._beat_forever, name="heartbeat", daemon=True).start()

    def stop(self) -> None:
        """Stop the heartbeat, forget this worker, unload models."""
        self._stop.set()
        try:
            self.heartbeats.remove(self.hostname)
        except redis.RedisError:
            pass
        self.backend.close()


def _warm_request():  # type: ignore[no-untyped-def]
    from workers.engines.base import SynthesisRequest

    return SynthesisRequest(text="ready")


def build_runtime(settings: Settings, *, hostname: str) -> WorkerRuntime:
    """Wire a worker's dependencies from the settings."""
    client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
    store = JobStore(client, ttl=settings.job_ttl_s)
    registry = load_registry(settings)
    device = settings.device
    backend = InProcessBackend(lambda spec: build_engine(spec, device=device))
    return WorkerRuntime(
        settings=settings,
        hostname=hostname,
        device=device if device != "auto" or registry.get(None).engine != "chattts" else resolve_device(device),
        store=store,
        registry=registry,
        backend=backend,
        heartbeats=WorkerRegistry(client, ttl_s=3 * settings.heartbeat_s),
        synthesizer=SegmentSynthesizer(
            store=store, registry=registry, backend=backend, max_attempts=settings.segment_max_attempts, worker=hostname
        ),
    )


def attach(app: Celery, runtime: WorkerRuntime) -> None:
    """Hand the runtime to the tasks of ``app``."""
    app.conf.tts_runtime = runtime


def runtime_of(app: Celery) -> WorkerRuntime:
    """Return the runtime attached to ``app``."""
    runtime = app.conf.get("tts_runtime")
    if runtime is None:
        raise RuntimeError("no worker runtime attached; start workers with `python -m workers`")
    found: WorkerRuntime = runtime
    return found

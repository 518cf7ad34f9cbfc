"""Everything one worker process holds: store, registry, backend, and its heartbeat."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from celery import Celery

from cache.jobstore import JobStore
from cache.text_streams import TextStreams
from cache.workers import WorkerRegistry
from core.metrics import GPU_MEMORY, MODEL_MEMORY, MODELS_RESIDENT, UPKEEP_FAILURES
from core.registry import ModelSpec, Registry
from core.settings import Settings
from workers.backend import PooledBackend
from workers.engines.base import SynthesisRequest
from workers.janitor import Janitor
from workers.layout import Layout
from workers.memory import release_free_memory
from workers.reconciler import Reconciler
from workers.segment import SegmentSynthesizer

log = logging.getLogger(__name__)


@dataclass
class WorkerRuntime:
    """The worker's dependencies, built once per process and handed to tasks."""

    settings: Settings
    layout: Layout
    hostname: str
    device: str
    store: JobStore
    registry: Registry
    backend: PooledBackend
    heartbeats: WorkerRegistry
    synthesizer: SegmentSynthesizer
    reconciler: Reconciler
    janitor: Janitor
    text_streams: TextStreams  # swept on a thread of its own: idle tails planned, idle streams ended
    _stop: threading.Event = field(default_factory=threading.Event)
    _loading: list[str] = field(default_factory=list)
    _loader: threading.Thread | None = None
    _upkept_at: float = field(default_factory=time.time)  # when the last upkeep pass ended (the heartbeat says)

    def announce(self) -> None:
        """Write this worker's heartbeat once and refresh the model-pool gauges."""
        loaded = self.backend.pool.loaded()
        MODELS_RESIDENT.set(len(loaded))
        MODEL_MEMORY.clear()
        GPU_MEMORY.clear()
        for model in loaded:  # a model's replicas together (one per core or per GPU)
            MODEL_MEMORY.labels(model["model"]).inc(model["memory_mb"])
            GPU_MEMORY.labels(model["model"]).inc(model["gpu_mb"])
        self.heartbeats.beat(
            self.hostname,
            {
                "pid": os.getpid(),
                "device": self.device,
                "device_kinds": list(self.layout.device_kinds),  # the API refuses a mode no worker here can run
                "hosts": self.layout.replicas,  # the API's pace estimate counts every worker's model hosts
                "torch_threads": self.layout.torch_threads,
                "models": self.backend.loaded_models(),
                "loading": list(self._loading),
                "pool": loaded,
                "mean_batch_size": round(self.backend.batcher.mean_batch_size(), 2),
                "upkeep_at": round(self._upkept_at, 3),  # a stuck upkeep thread shows (workers/probe.py)
            },
        )

    def _beat_forever(self) -> None:
        # Nothing else runs on this thread: a slow reconcile or model unload must not make us look dead.
        while not self._stop.wait(self.settings.heartbeat_s):
            _guarded("heartbeat", self.announce)  # whatever it raises, the next beat comes

    def _look_after_forever(self) -> None:
        last = {"reconcile": 0.0, "trim": 0.0}
        while not self._stop.wait(self.settings.heartbeat_s):
            self.look_after(last)

    def _sweep_forever(self) -> None:
        # Its own thread and pace: a tail idle past TTS_TEXT_STREAM_FLUSH_S is spoken within a third of that later,
        # not at the next upkeep pass (a heartbeat, 2 s, after it), and a slow janitor pass does not hold it up.
        every = max(0.1, min(self.settings.heartbeat_s, self.settings.text_stream_flush_s / 3))
        while not self._stop.wait(every):
            _guarded("text-stream sweep", self.text_streams.sweep)

    def look_after(self, last: dict[str, float]) -> None:
        """Run one upkeep pass: the janitor, the reconciler when due (``last`` holds when the timed steps last
        ran), then free memory and idle models.

        A step that fails is logged and the others still run; nothing a step raises ends the thread. A broker
        publish that fails mid-pass, for one, raises kombu's OperationalError rather than a Redis error, and a
        worker whose upkeep had died would go on beating, looking alive, with nobody handing its lost segments
        on or failing jobs past their deadline.
        """
        now = time.monotonic()
        if self.settings.malloc_trim_s and now - last["trim"] >= self.settings.malloc_trim_s:
            last["trim"] = now
            _guarded("memory release", release_free_memory)
        _guarded("janitor pass", self.janitor.run_once)
        if now - last["reconcile"] >= self.settings.reconcile_interval_s:
            last["reconcile"] = now
            _guarded("reconcile pass", lambda: self.reconciler.run_once(
                holder=self.hostname, interval_s=self.settings.reconcile_interval_s))  # fmt: skip
        # The default model stays, as pinned ones do: it is preloaded so that a first request after a quiet spell
        # does not wait for a load (seconds for real ChatTTS weights).
        _guarded("idle model reaping", lambda: self.backend.pool.reap_idle(keep={self.registry.default}))
        self._upkept_at = time.time()

    def preload(self) -> None:
        """Start loading the default and pinned models now, each in its own process, while Celery starts."""
        default = self.registry.get(None)
        pinned = [s for s in self.registry.models.values() if s.pinned and s.available and s is not default]
        self._loading = [spec.name for spec in [default, *pinned]]
        self._loader = threading.Thread(target=self._load, args=([default, *pinned],), name="loader", daemon=True)
        self._loader.start()

    def _load(self, specs: list[ModelSpec]) -> None:
        try:
            for spec in specs:
                log.info(
                    "worker %s: loading model %r (engine %s, device %s)",
                    self.hostname,
                    spec.name,
                    spec.engine,
                    self.device,
                )
                # Straight to the pool: a load is not work, and must not skew the throughput stats.
                for replica in range(self.layout.replicas):
                    self.backend.pool.synthesize(spec, [SynthesisRequest(text="ready")], replica)
                self._loading.remove(spec.name)
        except Exception:
            log.exception(
                "worker %s: loading its models failed; segments of them will fail and be retried", self.hostname
            )
            return
        log.info("worker %s ready: serving model %r with engine %s", self.hostname, specs[0].name, specs[0].engine)
        with contextlib.suppress(redis.RedisError):
            self.announce()

    def start(self) -> None:
        """Announce this worker, beat, and look after dead workers' segments, while its models load (``preload``).

        A worker that is loading is alive, not dead (loads take seconds, minutes for big models), and a dead
        predecessor's segments are handed over meanwhile; the heartbeat says what is still loading.
        """
        if self._loader is None:
            self.preload()
        self.announce()
        threading.Thread(target=self._beat_forever, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._look_after_forever, name="janitor", daemon=True).start()
        threading.Thread(target=self._sweep_forever, name="text-stream sweep", daemon=True).start()

    def stop(self) -> None:
        """Stop the heartbeat, forget this worker, unload models."""
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            self.heartbeats.remove(self.hostname)
        self.backend.close()


def _guarded(step: str, run: Callable[[], object]) -> None:
    """Run one upkeep step; log what it raises (a Redis error briefly, anything else with its traceback)."""
    try:
        run()
    except redis.RedisError as e:
        log.warning("%s failed: %s", step, e)
    except Exception:
        log.exception("%s failed; the next pass tries again", step)
    else:
        return
    UPKEEP_FAILURES.labels(step).inc()


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

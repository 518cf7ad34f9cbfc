"""Keep models loaded on demand within a memory budget: LRU eviction, idle unload, crash restart."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any

from core.errors import EngineLoadError
from core.metrics import MODEL_EVICTIONS, MODEL_LOAD_FAILURES, MODEL_LOAD_SECONDS, MODEL_LOADS
from core.registry import ModelSpec
from workers.engines.base import Piece, RateFragment, RateReady, SynthesisRequest, Waveform
from workers.pool.handle import HostCrashed, HostHung, ModelHost, refused

log = logging.getLogger(__name__)

#: Starts a host for a model's replica (the replica says which of the worker's devices it runs on).
HostFactory = Callable[[ModelSpec, int], ModelHost]


def replica_device(devices: str, replica: int) -> str:
    """Return the device of a model's ``replica``: ``devices`` is one device (``auto``, ``cpu``, ``cuda``,
    ``cuda:N``) for every replica, or a comma-separated list of them, whose replicas take them in turn (replica 0
    the first), so one worker can drive a host on each of several GPUs."""
    listed = [d.strip() for d in devices.split(",") if d.strip()] or ["auto"]
    return listed[replica % len(listed)]


def _tell(ready: RateReady, rate: int, index: int, wave: Waveform) -> None:
    ready(index, wave, rate)


def _tell_fragment(fragment: RateFragment, rate: int, index: int, piece: Piece) -> None:
    fragment(index, piece, rate)


#: A host's key: the model's name and which of its replicas (0 unless a model runs on several hosts).
HostKey = tuple[str, int]


class ModelPool:
    """(Model, replica) → running host; loads on first use, evicts least recently used, never pinned ones."""

    def __init__(self, start_host: HostFactory, *, budget_mb: float, idle_s: float, call_timeout_s: float) -> None:
        self._start_host = start_host
        self.budget_mb = budget_mb
        self.idle_s = idle_s
        self.call_timeout_s = call_timeout_s
        self._hosts: OrderedDict[HostKey, ModelHost] = OrderedDict()  # least recently used first
        self._model_locks: dict[HostKey, threading.Lock] = {}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.load_seconds: list[float] = []
        self._measured_mb: dict[str, float] = {}  # what each model held when last loaded

    def synthesize(
        self,
        spec: ModelSpec,
        requests: list[SynthesisRequest],
        replica: int = 0,
        *,
        ready: RateReady | None = None,
        fragment: RateFragment | None = None,
    ) -> tuple[list[Waveform], int]:
        """Run one batch on a host of the model, restarting a crashed host and retrying the batch once.

        ``ready`` is told each waveform and its rate as it arrives (again, on a retry, for those already told), and
        ``fragment`` each of their fragments before (on a retry, again from each one's first).
        """
        key = (spec.name, replica)
        for attempt in (1, 2):
            host = self._host(spec, key)
            told = None if ready is None else functools.partial(_tell, ready, host.sample_rate)
            pieces = None if fragment is None else functools.partial(_tell_fragment, fragment, host.sample_rate)
            try:
                waves = host.synthesize(requests, timeout_s=self.call_timeout_s, ready=told, fragment=pieces)
                return waves, host.sample_rate
            except HostCrashed as e:
                self._forget(key, host)
                self.counts["crashes"] += 1
                log.warning("model %s: %s (attempt %d)", spec.name, e, attempt)
                # A died host may have been killed for reasons of its own (another process's OOM): try again.
                # A hung call is not repeated: its callers have already waited the whole limit for it.
                if attempt == 2 or isinstance(e, HostHung):
                    raise
        raise AssertionError("unreachable")

    def join(
        self,
        spec: ModelSpec,
        requests: list[SynthesisRequest],
        replica: int,
        *,
        ready: RateReady,
        fragment: RateFragment | None = None,
    ) -> Future[bool]:
        """Offer segments to the call running on a host of the model; the future says whether they joined it.

        Never starts a host: segments join only a call that is running. ``ready`` is told each one's waveform
        and rate as it is made, ``fragment`` each of their fragments.
        """
        with self._lock:
            host = self._hosts.get((spec.name, replica))
        if host is None:
            return refused()
        pieces = None if fragment is None else functools.partial(_tell_fragment, fragment, host.sample_rate)
        return host.join(requests, functools.partial(_tell, ready, host.sample_rate), pieces)

    def share_cores(self, spec: ModelSpec, replica: int, threads: int) -> None:
        """Run a replica's host on ``threads`` torch threads from now on (its next call, if it has none running)."""
        with self._lock:
            host = self._hosts.get((spec.name, replica))
        if host is not None:
            host.share_cores(threads)

    def _host(self, spec: ModelSpec, key: HostKey) -> ModelHost:
        with self._lock:
            model_lock = self._model_locks.setdefault(key, threading.Lock())
        with model_lock:
            with self._lock:
                host = self._hosts.get(key)
                if host is not None and host.alive():
                    self._hosts.move_to_end(key)
                    return host
                if host is not None:  # died since its last call (killed, OOM): start afresh
                    del self._hosts[key]
                    self.counts["crashes"] += 1
                    log.warning("model %s host %s had died; restarting it", spec.name, host.pid)
            self._make_room(spec)
            try:
                host = self._start_host(spec, key[1])
            except EngineLoadError:
                MODEL_LOAD_FAILURES.labels(spec.name).inc()
                raise
            self.counts["loads"] += 1
            self.load_seconds.append(host.load_s)
            MODEL_LOADS.labels(spec.name).inc()
            MODEL_LOAD_SECONDS.labels(spec.name).observe(host.load_s)
            self._measured_mb[spec.name] = host.memory_mb
            with self._lock:
                self._hosts[key] = host
            return host

    def used_mb(self) -> float:
        """Return the memory all loaded models hold, as last measured."""
        with self._lock:
            return sum(h.memory_mb for h in self._hosts.values())

    def _make_room(self, spec: ModelSpec) -> None:
        need = max(spec.memory_mb, self._measured_mb.get(spec.name, 0.0))
        while self.used_mb() + need > self.budget_mb:
            with self._lock:
                # Never a replica of the model being loaded: that would only trade one copy for another.
                victim_key = next((k for k, h in self._hosts.items() if not h.spec.pinned and k[0] != spec.name), None)
                if victim_key is None:
                    log.warning(
                        "model %s needs %d MiB over the budget; only pinned models (or its replicas) are loaded",
                        spec.name,
                        spec.memory_mb,
                    )
                    return
                victim = self._hosts.pop(victim_key)
            log.info("evicting model %s (least recently used) to make room for %s", victim.spec.name, spec.name)
            victim.stop()
            self.counts["evictions"] += 1
            MODEL_EVICTIONS.labels(victim.spec.name, "budget").inc()

    def _forget(self, key: HostKey, host: ModelHost) -> None:
        with self._lock:
            if self._hosts.get(key) is host:
                del self._hosts[key]
        host.kill()

    def unload(self, name: str) -> bool:
        """Stop a model's hosts (ending a process frees all its memory); say whether it was loaded."""
        with self._lock:
            hosts = [self._hosts.pop(k) for k in [k for k in self._hosts if k[0] == name]]
        for host in hosts:
            host.stop()
        return bool(hosts)

    def reap_idle(self, now: float | None = None, *, keep: Collection[str] = ()) -> list[str]:
        """Unload models idle longer than ``idle_s``, except pinned ones and those named in ``keep`` (the worker's
        default, which it preloads to be resident); return their names."""
        now = time.monotonic() if now is None else now
        with self._lock:
            busy = {k[0] for k, h in self._hosts.items() if now - h.last_used <= self.idle_s}
            idle = sorted({k[0] for k, h in self._hosts.items() if not h.spec.pinned} - busy - set(keep))
        for name in idle:
            if self.unload(name):
                self.counts["idle_unloads"] += 1
                MODEL_EVICTIONS.labels(name, "idle").inc()
                log.info("unloaded model %s after %.0fs idle", name, self.idle_s)
        return idle

    def loaded(self) -> list[dict[str, Any]]:
        """Describe the loaded models: name, replica, the device asked for it, pid, memory, pinned, precision, and
        how a decode step runs."""
        with self._lock:
            return [
                {
                    "model": k[0],
                    "replica": k[1],
                    "device": h.device,
                    "pid": h.pid,
                    "memory_mb": round(h.memory_mb, 1),
                    "gpu_mb": h.memory["gpu_mb"],
                    "pinned": h.spec.pinned,
                    "precision": h.spec.precision,
                    "decode": h.decode_path,
                }
                for k, h in self._hosts.items()
            ]

    def host_pid(self, name: str, replica: int = 0) -> int | None:
        """Return the process id of a model's host, if loaded."""
        with self._lock:
            host = self._hosts.get((name, replica))
            return None if host is None else host.pid

    def close(self) -> None:
        """Stop every host."""
        with self._lock:
            hosts = list(self._hosts.values())
            self._hosts.clear()
        for host in hosts:
            host.stop()

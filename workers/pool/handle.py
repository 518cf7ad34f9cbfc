"""The worker's side of one model host: start it, send it batches, stop it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import threading
import time
from typing import Any

from core.errors import EngineLoadError, HostCrashed, HostHung, SynthesisError
from core.registry import ModelSpec, engine_entry
from workers.engines.base import Ready, SynthesisRequest, Waveform, every_one_made
from workers.pool.host import host_main

__all__ = ["HostCrashed", "HostHung", "ModelHost"]  # the errors' old home: pool.py and tests import them here

log = logging.getLogger(__name__)

# Spawn, never fork: a forked child of a process that touched CUDA or torch's
# thread pools inherits locks and state it cannot use.
_SPAWN = multiprocessing.get_context("spawn")


class ModelHost:
    """One running subprocess holding one loaded model; calls are serialised."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str,
        log_level: str = "INFO",
        torch_threads: int = 0,
        load_timeout_s: float = 600,
    ) -> None:
        self.spec = spec
        self._conn, child = _SPAWN.Pipe()
        # Resolved here, where the registry's plugins were imported: the spawned host has imported none of them.
        builder = engine_entry(spec.engine).builder
        self.process = _SPAWN.Process(
            target=host_main,
            args=(child, spec),
            kwargs={"builder": builder, "device": device, "log_level": log_level, "torch_threads": torch_threads},
            name=f"model-{spec.name}",
            daemon=True,
        )
        self._lock = threading.Lock()
        started = time.perf_counter()
        self.process.start()
        child.close()
        reply = self._receive(load_timeout_s, loading=True)
        if reply[0] != "ready":
            self.stop()
            raise EngineLoadError(str(reply[1]))
        self.sample_rate: int = reply[1]
        self.memory: dict[str, float] = reply[2]
        self.load_s = time.perf_counter() - started
        self.last_used = time.monotonic()
        log.info(
            "model %s loaded in pid %s in %.2fs (%.0f MiB resident, %.0f MiB GPU)",
            spec.name,
            self.process.pid,
            self.load_s,
            self.memory["rss_mb"],
            self.memory["gpu_mb"],
        )

    @property
    def pid(self) -> int | None:
        """Return the host's process id."""
        return self.process.pid

    @property
    def memory_mb(self) -> float:
        """Return the memory this host holds: GPU memory on CUDA, else resident memory."""
        return self.memory["gpu_mb"] or self.memory["rss_mb"]

    def alive(self) -> bool:
        """Say whether the host process is still running."""
        return self.process.is_alive()

    def _receive(self, timeout_s: float, *, loading: bool = False) -> tuple[Any, ...]:
        what = "loading" if loading else "synthesis"
        try:
            if not self._conn.poll(timeout_s):
                self.kill()
                raise HostHung(f"model {self.spec.name} did not answer within {timeout_s:.0f}s ({what}); killed it")
            reply: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError) as e:
            code = self.process.exitcode
            raise HostCrashed(f"model {self.spec.name} host died during {what} (exit code {code})") from e
        return reply

    def synthesize(
        self, requests: list[SynthesisRequest], *, timeout_s: float, ready: Ready | None = None
    ) -> list[Waveform]:
        """Send one batch and return exactly one waveform per request; tell ``ready`` each one as it arrives."""
        waves: list[Waveform | None] = [None] * len(requests)
        with self._lock:
            self.last_used = time.monotonic()
            until = self.last_used + timeout_s
            try:
                self._conn.send(("synth", [dataclasses.asdict(r) for r in requests]))
            except (BrokenPipeError, OSError) as e:
                raise HostCrashed(f"model {self.spec.name} host is gone") from e
            reply = self._receive(timeout_s)
            while reply[0] == "part":
                index, wave = reply[1], reply[2]
                waves[index] = wave
                if ready is not None:
                    ready(index, wave)
                reply = self._receive(max(0.0, until - time.monotonic()))
            self.last_used = time.monotonic()
        if reply[0] != "ok":
            raise SynthesisError(str(reply[1]))
        self.memory = reply[1]
        return every_one_made(waves, what=f"model {self.spec.name}")

    def kill(self) -> None:
        """End the host at once."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    def stop(self, timeout_s: float = 10) -> None:
        """Ask the host to unload and exit; kill it if it does not."""
        with self._lock:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop",))
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.kill()
            self._conn.close()

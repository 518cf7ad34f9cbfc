"""The worker's side of one model host: start it, send it batches, stop it."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import threading
import time
from concurrent.futures import Future
from typing import Any

from core.errors import EngineLoadError, HostCrashed, HostHung, SynthesisError
from core.fragments import NO_FRAGMENTS, FragmentSchedule
from core.registry import ModelSpec, engine_entry
from workers.engines.base import Fragment, Ready, SynthesisRequest, Waveform, every_one_made
from workers.pool.host import host_main

__all__ = ["HostCrashed", "HostHung", "ModelHost"]  # the errors' old home: pool.py and tests import them here

log = logging.getLogger(__name__)

# Spawn, never fork: a forked child of a process that touched CUDA or torch's
# thread pools inherits locks and state it cannot use.
_SPAWN = multiprocessing.get_context("spawn")


def refused() -> Future[bool]:
    """Return the answer to an offer that no call takes: already resolved, False."""
    answer: Future[bool] = Future()
    answer.set_result(False)
    return answer


@dataclasses.dataclass(frozen=True)
class _Route:
    """Where the parts and fragments numbered ``first`` to ``first + count - 1`` of a call go."""

    first: int
    count: int
    ready: Ready
    fragment: Fragment | None


class _Call:
    """The call in flight on a host: where each part goes, and the joins not yet answered."""

    def __init__(self, size: int, ready: Ready, fragment: Fragment | None) -> None:
        self.routes = [_Route(0, size, ready, fragment)]
        self.size = size  # parts numbered so far: the batch's, then each joined group's
        self.pending: dict[int, tuple[_Route, Future[bool]]] = {}  # join id: (its route, if joined; joined?)
        self.open = True  # joins may still be sent

    def _route(self, index: int) -> _Route:
        return next(route for route in self.routes if route.first <= index < route.first + route.count)

    def take(self, reply: tuple[Any, ...]) -> bool:
        """Act on one reply from the host (a fragment, a part, a join's answer); say whether it was a join taken in."""
        kind: str = reply[0]
        if kind == "fragment":
            route = self._route(reply[1])
            if route.fragment is not None:
                route.fragment(reply[1] - route.first, reply[2])
            return False
        if kind == "part":
            index, wave = reply[1], reply[2]
            route = self._route(index)
            route.ready(index - route.first, wave)
            return False
        if kind not in ("joined", "refused"):
            raise SynthesisError(f"unexpected reply {kind!r} from a model host")
        route, joined = self.pending.pop(reply[1])
        if kind == "joined":
            self.routes.append(dataclasses.replace(route, first=self.size))
            self.size += route.count
        taken: bool = kind == "joined"
        joined.set_result(taken)
        return taken

    def close(self) -> None:
        """Answer every join still waiting: refused (the host is gone, or never read it)."""
        for _, joined in self.pending.values():
            if not joined.done():
                joined.set_result(False)
        self.pending.clear()


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
        fragments: FragmentSchedule = NO_FRAGMENTS,
        graphs: str = "auto",
    ) -> None:
        self.spec = spec
        self.device = device
        self._conn, child = _SPAWN.Pipe()
        # Resolved here, where the registry's plugins were imported: the spawned host has imported none of them.
        builder = engine_entry(spec.engine).builder
        self.process = _SPAWN.Process(
            target=host_main,
            args=(child, spec),
            kwargs={
                "builder": builder,
                "device": device,
                "log_level": log_level,
                "torch_threads": torch_threads,
                "fragments": fragments,
                "graphs": graphs,
            },
            name=f"model-{spec.name}",
            daemon=True,
        )
        self._lock = threading.Lock()  # one call at a time
        self._sends = threading.Lock()  # a join is sent while a call is waiting for its parts
        self._state = threading.Lock()  # guards _call
        self._call: _Call | None = None
        self._join_ids = itertools.count()
        self._threads = 0  # the torch threads its next call runs on (0: its own)
        started = time.perf_counter()
        self.process.start()
        child.close()
        reply = self._receive(load_timeout_s, loading=True)
        if reply[0] != "ready":
            self.stop()
            raise EngineLoadError(str(reply[1]))
        self.sample_rate: int = reply[1]
        self.memory: dict[str, float] = reply[2]
        #: Whether segments can join a call while it runs (the engine's ``takes_arrivals``).
        self.takes_arrivals: bool = bool(reply[3])
        #: How its engine runs a decode step (``Engine.decode_path``).
        self.decode_path: str = str(reply[4])
        self.load_s = time.perf_counter() - started
        self.last_used = time.monotonic()
        log.info(
            "model %s loaded in pid %s in %.2fs (%.0f MiB resident, %.0f MiB GPU); decode step: %s",
            spec.name,
            self.process.pid,
            self.load_s,
            self.memory["rss_mb"],
            self.memory["gpu_mb"],
            self.decode_path,
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
        self,
        requests: list[SynthesisRequest],
        *,
        timeout_s: float,
        ready: Ready | None = None,
        fragment: Fragment | None = None,
    ) -> list[Waveform]:
        """Send one batch and return exactly one waveform per request; tell ``ready`` each one as it arrives, and
        ``fragment`` each of their fragments before.

        Segments ``join``-ed to the call meanwhile are told to their own ``ready``; each join extends the limit.
        """
        waves: list[Waveform | None] = [None] * len(requests)

        def told(index: int, wave: Waveform) -> None:
            waves[index] = wave
            if ready is not None:
                ready(index, wave)

        with self._lock:
            self.last_used = time.monotonic()
            until = self.last_used + timeout_s
            call = _Call(len(requests), told, fragment)
            with self._state:
                self._send(("synth", [dataclasses.asdict(r) for r in requests], self._threads), "is gone")
                self._call = call
            try:
                reply = self._receive(timeout_s)
                while reply[0] != "ok" and reply[0] != "error":
                    if call.take(reply):  # a join acknowledged: the call runs on for it
                        until = max(until, time.monotonic() + timeout_s)
                    reply = self._receive(max(0.0, until - time.monotonic()))
                with self._state:
                    call.open = False
                while call.pending:  # joins sent after the host's last ask: an idle host refuses them
                    call.take(self._receive(timeout_s))
            finally:
                with self._state:
                    self._call = None
                call.close()
            self.last_used = time.monotonic()
        if reply[0] != "ok":
            raise SynthesisError(str(reply[1]))
        self.memory = reply[1]
        return every_one_made(waves, what=f"model {self.spec.name}")

    def join(self, requests: list[SynthesisRequest], ready: Ready, fragment: Fragment | None = None) -> Future[bool]:
        """Offer segments to the call running now; the future says whether they joined it.

        Joined segments are told to ``ready`` (numbered from 0 among ``requests``) as they are made; if the call
        then fails, they are not told. Refused (no call running, one ending, an engine that cannot take them),
        they were never started.
        """
        with self._state:
            call = self._call
            if not self.takes_arrivals or call is None or not call.open:
                return refused()
            joined: Future[bool] = Future()
            join_id = next(self._join_ids)
            call.pending[join_id] = (_Route(-1, len(requests), ready, fragment), joined)
            try:
                self._send(("join", join_id, [dataclasses.asdict(r) for r in requests]), "is gone")
            except HostCrashed:
                del call.pending[join_id]
                joined.set_result(False)
        return joined

    def share_cores(self, threads: int) -> None:
        """Run torch on ``threads`` threads: from the running call's next decode step on, or from its next call."""
        with self._state:
            if threads == self._threads:
                return
            self._threads = threads
            if self._call is not None and self._call.open and self.takes_arrivals:
                with contextlib.suppress(HostCrashed):  # its call's own receive says so
                    self._send(("threads", threads), "is gone")

    def _send(self, message: tuple[Any, ...], gone: str) -> None:
        with self._sends:
            try:
                self._conn.send(message)
            except (BrokenPipeError, OSError) as e:
                raise HostCrashed(f"model {self.spec.name} host {gone}") from e

    def kill(self) -> None:
        """End the host at once."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    def stop(self, timeout_s: float = 10) -> None:
        """Ask the host to unload and exit; kill it if it does not."""
        with self._lock:
            with contextlib.suppress(HostCrashed):
                self._send(("stop",), "is gone")
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.kill()
            self._conn.close()

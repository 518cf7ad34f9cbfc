"""Collect segments from many callers for a few milliseconds and run them as one engine call per group."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from core.registry import ModelSpec
from workers.batching import plan_batches
from workers.engines.base import SynthesisRequest, Waveform

log = logging.getLogger(__name__)

RunBatch = Callable[[ModelSpec, list[SynthesisRequest]], tuple[list[Waveform], int]]
#: Called after each engine call with (model name, batch size, characters, seconds).
BatchObserver = Callable[[str, int, int, float], None]
#: Requests remembered as having been in a failed batch (oldest forgotten first).
_MAX_SUSPECTS = 4096


@dataclass
class _Pending:
    spec: ModelSpec
    request: SynthesisRequest
    urgent: bool = False
    future: Future[tuple[Waveform, int]] = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)


class Batcher:
    """One dispatcher thread per model turns concurrent submissions into batched engine calls."""

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch: int,
        max_wait_s: float,
        max_ratio: float = 1.5,
        observe: BatchObserver | None = None,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_ratio = max_ratio
        self._observe = observe
        self._queues: dict[str, queue.SimpleQueue[_Pending | None]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # Requests whose batch failed: their retries run alone, so one poison input cannot fail its neighbours again.
        self._suspects: OrderedDict[SynthesisRequest, None] = OrderedDict()
        self.batches = 0
        self.items = 0

    def submit(
        self, spec: ModelSpec, request: SynthesisRequest, *, urgent: bool = False
    ) -> Future[tuple[Waveform, int]]:
        """Queue one segment (``urgent``: a listener is waiting for it now); resolve to its waveform and rate."""
        pending = _Pending(spec, request, urgent)
        self._queue_for(spec.name).put(pending)
        return pending.future

    def _queue_for(self, name: str) -> queue.SimpleQueue[_Pending | None]:
        with self._lock:
            found = self._queues.get(name)
            if found is None:
                found = self._queues[name] = queue.SimpleQueue()
                thread = threading.Thread(target=self._dispatch, args=(found,), name=f"batcher-{name}", daemon=True)
                self._threads.append(thread)
                thread.start()
            return found

    def _collect(self, inbox: queue.SimpleQueue[_Pending | None], backlog: list[_Pending]) -> list[_Pending] | None:
        # With nothing waiting, block for the first arrival, then wait at most
        # max_wait_s for company. With a backlog the engine must not idle: take
        # only what is already queued.
        items = list(backlog)
        if not items:
            first = inbox.get()
            if first is None:
                return None
            items.append(first)
        deadline = time.monotonic() + (0.0 if backlog else self.max_wait_s)
        limit = 4 * self.max_batch  # look a little further than one batch, to group by length
        while len(items) < limit:
            remaining = deadline - time.monotonic()
            try:
                nxt = inbox.get(timeout=remaining) if remaining > 0 else inbox.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                inbox.put(None)  # stop after this round
                break
            items.append(nxt)
        return items

    def _dispatch(self, inbox: queue.SimpleQueue[_Pending | None]) -> None:
        backlog: list[_Pending] = []
        while True:
            items = self._collect(inbox, backlog)
            if items is None:
                return
            # Urgent segments (a job's first) first, then the oldest: the first group planned holds the
            # most pressing segment, and plan_batches keeps that group first.
            items.sort(key=lambda p: (not p.urgent, p.submitted))
            with self._lock:
                suspect = [p.request in self._suspects for p in items]
            groups = [[p] for p, s in zip(items, suspect, strict=True) if s] + plan_batches(
                [p for p, s in zip(items, suspect, strict=True) if not s],
                length=lambda p: len(p.request.text),
                max_batch=self.max_batch,
                max_ratio=self.max_ratio,
            )
            rank = {id(p): i for i, p in enumerate(items)}  # suspects' solo groups keep the urgent-then-oldest order
            groups.sort(key=lambda g: min(rank[id(p)] for p in g))
            # Run the group holding the oldest segment; the rest wait for the next round.
            self._run(groups[0])
            backlog = [p for g in groups[1:] for p in g]

    def _run(self, group: list[_Pending]) -> None:
        group = [p for p in group if p.future.set_running_or_notify_cancel()]  # drop what callers gave up on
        if not group:
            return
        spec = group[0].spec
        started = time.perf_counter()
        try:
            waves, rate = self._run_batch(spec, [p.request for p in group])
            if len(waves) != len(group):
                raise RuntimeError(f"engine returned {len(waves)} waveforms for {len(group)} segments")
        except Exception as e:  # every waiting caller learns of the failure; none hangs
            self._suspect([p.request for p in group])
            for pending in group:
                pending.future.set_exception(e)
            return
        with self._lock:
            for pending in group:
                self._suspects.pop(pending.request, None)
        elapsed = time.perf_counter() - started
        self.batches += 1
        self.items += len(group)
        for pending, wave in zip(group, waves, strict=True):
            pending.future.set_result((wave, rate))
        if self._observe is not None:
            try:
                self._observe(spec.name, len(group), sum(len(p.request.text) for p in group), elapsed)
            except Exception:  # observing must never break serving
                log.exception("batch observer failed")

    def _suspect(self, requests: list[SynthesisRequest]) -> None:
        with self._lock:
            for request in requests:
                self._suspects[request] = None
            while len(self._suspects) > _MAX_SUSPECTS:
                self._suspects.popitem(last=False)

    def mean_batch_size(self) -> float:
        """Return the mean number of segments per engine call so far."""
        return self.items / self.batches if self.batches else 0.0

    def close(self) -> None:
        """Stop the dispatcher threads once their queues drain."""
        with self._lock:
            for inbox in self._queues.values():
                inbox.put(None)

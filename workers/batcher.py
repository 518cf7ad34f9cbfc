"""Collect segments from many callers for a few milliseconds and run them as one engine call per group."""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Protocol

from core.policy import BatchTiming
from core.registry import ModelSpec
from workers.engines.base import RateReady, SynthesisRequest, Waveform, expect_one_per_input
from workers.planner import BatchPlanner, Due, Pending

log = logging.getLogger(__name__)


class RunBatch(Protocol):
    """Runs one engine call on one of the model's replicas; returns the waveforms and their rate.

    ``ready`` is told each waveform (and its rate) as soon as it is made, before the call returns.
    """

    def __call__(
        self, spec: ModelSpec, requests: list[SynthesisRequest], replica: int, *, ready: RateReady | None = None
    ) -> tuple[list[Waveform], int]: ...


#: Called after each engine call with (model name, batch size, characters, seconds).
BatchObserver = Callable[[str, int, int, float], None]


def _fail(pendings: list[Pending], error: Exception) -> None:
    """Fail every segment that has no outcome yet (and whose caller still waits) with ``error``."""
    for pending in pendings:
        future = pending.future
        try:
            if future.running() or future.set_running_or_notify_cancel():
                future.set_exception(error)
        except InvalidStateError:  # finished meanwhile: its caller has an answer
            pass


def _deliver(group: list[Pending], index: int, wave: Waveform, rate: int) -> None:
    """Give the segment at ``index`` of ``group`` its waveform, unless it already has one (a retried call)."""
    with contextlib.suppress(InvalidStateError):
        group[index].future.set_result((wave, rate))


class Batcher:
    """One dispatcher thread per model turns concurrent submissions into batched engine calls.

    Whenever one of the model's ``replicas`` is free, the dispatcher runs the batch its planner chooses
    (workers/planner.py: the most urgent segment and similar-length company). When that batch is not
    full, nothing else is waiting and its most urgent segment still has slack, it waits up to
    ``timing.hold_s`` for company. A deadline only moves later, and only a bounded amount (see
    ``core.schedule.Timeline``), while new work is never due before it arrives: every
    segment becomes the most urgent one in the end, so nothing starves.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch: int,
        max_wait_s: float,
        max_ratio: float = 1.5,
        timing: BatchTiming | None = None,
        replicas: int = 1,
        observe: BatchObserver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.timing = timing or BatchTiming()
        self.planner = BatchPlanner(max_batch=max_batch, max_ratio=max_ratio, timing=self.timing, clock=clock)
        self.replicas = max(1, replicas)
        self._observe = observe
        self._clock = clock
        self._queues: dict[str, queue.SimpleQueue[Pending | None]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.batches = 0
        self.items = 0
        self.holds = 0

    def submit(
        self, spec: ModelSpec, request: SynthesisRequest, *, deadline: Due | None = None, early: bool = False
    ) -> Future[tuple[Waveform, int]]:
        """Queue one segment due at ``deadline`` (epoch seconds; none: now); resolve to its waveform and rate.

        ``early``: the segment continues a stream already playing, so it should be written
        before its deadline, not start at it: it is ordered ``lead`` engine calls earlier.
        """
        pending = Pending(spec, request, self._clock() if deadline is None else deadline, early)
        self._queue_for(spec.name).put(pending)
        return pending.future

    def _queue_for(self, name: str) -> queue.SimpleQueue[Pending | None]:
        with self._lock:
            found = self._queues.get(name)
            if found is None:
                found = self._queues[name] = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._dispatch, args=(found, name), name=f"batcher-{name}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            return found

    def _collect(self, inbox: queue.SimpleQueue[Pending | None], backlog: list[Pending]) -> list[Pending] | None:
        # With nothing waiting, block for the first arrival, then wait at most
        # max_wait_s for company. With a backlog the engine must not idle: take
        # only what is already queued.
        items = list(backlog)
        if not items:
            first = inbox.get()
            if first is None:
                return None
            items.append(first)
        if not self._gather(inbox, items, 0.0 if backlog else self.max_wait_s):
            inbox.put(None)  # stop after this round
        return items

    def _gather(self, inbox: queue.SimpleQueue[Pending | None], items: list[Pending], wait_s: float) -> bool:
        """Add arrivals to ``items`` for up to ``wait_s`` (then what is already queued); False if told to stop."""
        until = time.monotonic() + wait_s
        while True:
            remaining = until - time.monotonic()
            try:
                nxt = inbox.get(timeout=remaining) if remaining > 0 else inbox.get_nowait()
            except queue.Empty:
                return True
            if nxt is None:
                return False
            items.append(nxt)
            if remaining > 0 and len(items) >= self.max_batch:
                until = 0.0  # a full batch is here: take what else is queued, wait no longer

    def choose(self, items: list[Pending]) -> list[Pending]:
        """Return the next batch: the earliest deadline and the similar-length segments due soonest after it."""
        return self.planner.plan(items)[0]

    def _dispatch(self, inbox: queue.SimpleQueue[Pending | None], name: str) -> None:
        # Each round waits for a free replica of the model, then plans the most urgent batch
        # from everything waiting at that moment: work is ordered as late as possible.
        # A fault in a round fails that round's segments (their tasks retry) and the next
        # round goes on: the dispatcher must outlive any bug, or every later caller would hang.
        free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for replica in range(self.replicas):
            free.put(replica)
        calls = ThreadPoolExecutor(self.replicas, thread_name_prefix=f"engine-{name}") if self.replicas > 1 else None
        backlog: list[Pending] = []
        while True:
            replica = free.get()
            items = self._collect(inbox, backlog)
            if items is None:
                if calls is not None:
                    calls.shutdown(wait=True)
                return
            try:
                backlog = self._round(items, replica, free, calls, inbox)
            except Exception as e:
                log.exception("batcher round for %s failed; its %d segments fail and are retried", name, len(items))
                _fail(items, e)
                backlog = []
                free.put(replica)

    def _round(
        self,
        items: list[Pending],
        replica: int,
        free: queue.SimpleQueue[int],
        calls: ThreadPoolExecutor | None,
        inbox: queue.SimpleQueue[Pending | None],
    ) -> list[Pending]:
        """Plan and start one batch on ``replica``; return what is left waiting."""
        group, head_due = self.planner.plan(items)
        if self.planner.should_hold(group, items, head_due):
            if not self._hold(inbox, items):
                inbox.put(None)  # stop after this round
            group, head_due = self.planner.plan(items)
        log.debug(
            "batch of %d (%d waiting) on replica %d: %d-%d chars, most urgent due in %.2f s",
            len(group),
            len(items),
            replica,
            min(len(p.request.text) for p in group),
            max(len(p.request.text) for p in group),
            head_due - self._clock(),
        )
        chosen = {id(p) for p in group}
        backlog = [p for p in items if id(p) not in chosen]
        if calls is None:
            self._run(group, replica)
            free.put(replica)
        else:
            calls.submit(self._run_then_free, group, replica, free)
        return backlog

    def _run_then_free(self, group: list[Pending], replica: int, free: queue.SimpleQueue[int]) -> None:
        try:
            self._run(group, replica)
        except Exception as e:  # a bug here must not leave the group's callers waiting for their timeout
            log.exception("engine call on replica %d failed outside the engine", replica)
            _fail(group, e)
        finally:
            free.put(replica)

    def _hold(self, inbox: queue.SimpleQueue[Pending | None], items: list[Pending]) -> bool:
        self.holds += 1
        return self._gather(inbox, items, self.timing.hold_s)

    def _run(self, group: list[Pending], replica: int = 0) -> None:
        group = [p for p in group if p.future.set_running_or_notify_cancel()]  # drop what callers gave up on
        if not group:
            return
        spec = group[0].spec
        started = time.perf_counter()
        try:
            # A segment's caller gets its audio the moment it is made, not when the longest of its batch is.
            waves, rate = self._run_batch(
                spec, [p.request for p in group], replica, ready=functools.partial(_deliver, group)
            )
            expect_one_per_input(waves, group, what="engine")
        except Exception as e:  # every waiting caller learns of the failure; none hangs
            self.planner.failed([p.request for p in group])
            _fail(group, e)
            return
        elapsed = time.perf_counter() - started
        self.planner.ran(group, elapsed)
        with self._lock:
            self.batches += 1
            self.items += len(group)
        for index, wave in enumerate(waves):  # those ``ready`` was not told of (a run that never tells it)
            _deliver(group, index, wave, rate)
        if self._observe is not None:
            try:
                self._observe(spec.name, len(group), sum(len(p.request.text) for p in group), elapsed)
            except Exception:  # observing must never break serving
                log.exception("batch observer failed")

    def mean_batch_size(self) -> float:
        """Return the mean number of segments per engine call so far."""
        return self.items / self.batches if self.batches else 0.0

    def close(self) -> None:
        """Stop the dispatcher threads once their queues drain."""
        with self._lock:
            for inbox in self._queues.values():
                inbox.put(None)

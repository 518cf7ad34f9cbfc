"""Collect segments from many callers for a few milliseconds and run them as one engine call per group."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field

from core.registry import ModelSpec
from workers.engines.base import SynthesisRequest, Waveform

log = logging.getLogger(__name__)

#: A deadline in epoch seconds, or a function returning the current one.
Due = float | Callable[[], float]
#: Runs one engine call: (model, requests, which of the model's replicas) → waveforms and their rate.
RunBatch = Callable[[ModelSpec, list[SynthesisRequest], int], tuple[list[Waveform], int]]
#: Called after each engine call with (model name, batch size, characters, seconds).
BatchObserver = Callable[[str, int, int, float], None]
#: Requests remembered as having been in a failed batch (oldest forgotten first).
_MAX_SUSPECTS = 4096


@dataclass
class _Pending:
    spec: ModelSpec
    request: SynthesisRequest
    #: When the listener needs it (epoch seconds, or a function giving the current estimate, which
    #: may move as the job's first audio becomes known); its arrival time when none was given (FIFO).
    due: Due
    #: Start it ``lead`` engine calls early: it continues a stream, and a late one makes its listener stall.
    early: bool = False
    future: Future[tuple[Waveform, int]] = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)


def _fail(pendings: list[_Pending], error: Exception) -> None:
    """Fail every segment that has no outcome yet (and whose caller still waits) with ``error``."""
    for pending in pendings:
        future = pending.future
        try:
            if future.running() or future.set_running_or_notify_cancel():
                future.set_exception(error)
        except InvalidStateError:  # finished meanwhile: its caller has an answer
            pass


def compatible(a: int, b: int, *, max_ratio: float, slack: int = 8) -> bool:
    """Say whether texts of lengths ``a`` and ``b`` pad acceptably in one batch."""
    return max(a, b) <= max_ratio * min(a, b) + slack


class Batcher:
    """One dispatcher thread per model turns concurrent submissions into batched engine calls.

    Whenever one of the model's ``replicas`` is free, the dispatcher runs the segment with
    the earliest deadline (a stream's next segment counted ``lead`` engine calls early, a
    job's first segment as early as it is late, up to ``first_priority_s``),
    together with the segments of similar length (``max_ratio``) that are due soonest after
    it, up to ``max_batch`` and at most ``horizon_s`` later than it. When that batch is not
    full, nothing else is waiting and its most urgent segment still has slack, it waits up to
    ``hold_s`` for company. A deadline only moves later, and only a bounded amount (see
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
        hold_s: float = 0.0,
        horizon_s: float = math.inf,
        lead: float = 0.0,
        first_priority_s: float = 0.0,
        replicas: int = 1,
        observe: BatchObserver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_ratio = max_ratio
        self.hold_s = hold_s
        self.horizon_s = horizon_s
        self.lead = lead
        self.first_priority_s = first_priority_s
        self.replicas = max(1, replicas)
        self._observe = observe
        self._clock = clock
        self._queues: dict[str, queue.SimpleQueue[_Pending | None]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # Requests whose batch failed: their retries run alone, so one poison input cannot fail its neighbours again.
        self._suspects: OrderedDict[SynthesisRequest, None] = OrderedDict()
        self._batch_s: dict[str, float] = {}  # per model: a moving average of one engine call's seconds
        self._batch_chars: dict[str, float] = {}  # ... and of its longest text's characters
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
        pending = _Pending(spec, request, self._clock() if deadline is None else deadline, early)
        self._queue_for(spec.name).put(pending)
        return pending.future

    def _queue_for(self, name: str) -> queue.SimpleQueue[_Pending | None]:
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
        if not self._gather(inbox, items, 0.0 if backlog else self.max_wait_s):
            inbox.put(None)  # stop after this round
        return items

    def _gather(self, inbox: queue.SimpleQueue[_Pending | None], items: list[_Pending], wait_s: float) -> bool:
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

    def choose(self, items: list[_Pending]) -> list[_Pending]:
        """Return the next batch: the earliest deadline and the similar-length segments due soonest after it."""
        return self._plan(items)[0]

    def _plan(self, items: list[_Pending]) -> tuple[list[_Pending], float]:
        """Return the next batch and its most urgent deadline (sorting ``items`` by deadline)."""
        name = items[0].spec.name
        call_s, call_chars = self._batch_s.get(name, 0.0), self._batch_chars.get(name, 1.0)

        now = self._clock()

        def lead(p: _Pending, due: float) -> float:
            # A first segment gains priority as it waits past its deadline, up to first_priority_s: under
            # overload its listener, who has nothing yet, waits first-hand; when the engines keep up it gains
            # little, and streams already playing keep theirs.
            if not p.early:
                return min(self.first_priority_s, max(0.0, now - due))
            # A stream's next segment must be written by its deadline, so it starts ``lead`` calls earlier;
            # a call lasts about as long as its longest text, so a long segment's call is counted longer.
            return self.lead * call_s * max(1.0, len(p.request.text) / call_chars)

        due = {id(p): d - lead(p, d) for p, d in ((p, self._due(p)) for p in items)}
        items.sort(key=lambda p: (due[id(p)], p.submitted))
        head = items[0]
        with self._lock:
            suspect = {id(p) for p in items if p.request in self._suspects}
        head_due = due[id(head)]
        if id(head) in suspect:
            return [head], head_due
        low = high = len(head.request.text)  # the group's shortest and longest texts
        group = [head]
        for p in items[1:]:
            if len(group) >= self.max_batch or due[id(p)] > head_due + self.horizon_s:
                break
            length = len(p.request.text)
            if id(p) not in suspect and compatible(min(low, length), max(high, length), max_ratio=self.max_ratio):
                group.append(p)
                low, high = min(low, length), max(high, length)
        return group, head_due

    def _due(self, pending: _Pending) -> float:
        """Return a segment's deadline now; one that cannot be computed (its job vanished) is due at once."""
        if not callable(pending.due):
            return pending.due
        try:
            return pending.due()
        except Exception:
            log.exception("deadline of a segment could not be computed; it is due now")
            pending.due = self._clock() - (time.monotonic() - pending.submitted)  # its arrival; logged once
            return pending.due

    def _dispatch(self, inbox: queue.SimpleQueue[_Pending | None], name: str) -> None:
        # Each round waits for a free replica of the model, then plans the most urgent batch
        # from everything waiting at that moment: work is ordered as late as possible.
        # A fault in a round fails that round's segments (their tasks retry) and the next
        # round goes on: the dispatcher must outlive any bug, or every later caller would hang.
        free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for replica in range(self.replicas):
            free.put(replica)
        calls = ThreadPoolExecutor(self.replicas, thread_name_prefix=f"engine-{name}") if self.replicas > 1 else None
        backlog: list[_Pending] = []
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
        items: list[_Pending],
        replica: int,
        free: queue.SimpleQueue[int],
        calls: ThreadPoolExecutor | None,
        inbox: queue.SimpleQueue[_Pending | None],
    ) -> list[_Pending]:
        """Plan and start one batch on ``replica``; return what is left waiting."""
        group, head_due = self._plan(items)
        if self._should_hold(group, items, head_due):
            if not self._hold(inbox, items):
                inbox.put(None)  # stop after this round
            group, head_due = self._plan(items)
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

    def _run_then_free(self, group: list[_Pending], replica: int, free: queue.SimpleQueue[int]) -> None:
        try:
            self._run(group, replica)
        except Exception as e:  # a bug here must not leave the group's callers waiting for their timeout
            log.exception("engine call on replica %d failed outside the engine", replica)
            _fail(group, e)
        finally:
            free.put(replica)

    def _should_hold(self, group: list[_Pending], items: list[_Pending], head_due: float) -> bool:
        """Hold for company only when the batch is not full, all waiting work is in it, and it has slack."""
        if self.hold_s <= 0 or len(group) >= self.max_batch or len(items) > len(group):
            return False
        expected = self._batch_s.get(group[0].spec.name, 0.0)
        return head_due - self._clock() > expected + self.hold_s

    def _hold(self, inbox: queue.SimpleQueue[_Pending | None], items: list[_Pending]) -> bool:
        self.holds += 1
        return self._gather(inbox, items, self.hold_s)

    def _run(self, group: list[_Pending], replica: int = 0) -> None:
        group = [p for p in group if p.future.set_running_or_notify_cancel()]  # drop what callers gave up on
        if not group:
            return
        spec = group[0].spec
        started = time.perf_counter()
        try:
            waves, rate = self._run_batch(spec, [p.request for p in group], replica)
            if len(waves) != len(group):
                raise RuntimeError(f"engine returned {len(waves)} waveforms for {len(group)} segments")
        except Exception as e:  # every waiting caller learns of the failure; none hangs
            self._suspect([p.request for p in group])
            _fail(group, e)
            return
        with self._lock:
            for pending in group:
                self._suspects.pop(pending.request, None)
        elapsed = time.perf_counter() - started
        previous = self._batch_s.get(spec.name)
        self._batch_s[spec.name] = elapsed if previous is None else 0.8 * previous + 0.2 * elapsed
        longest = float(max(len(p.request.text) for p in group))
        previous = self._batch_chars.get(spec.name)
        self._batch_chars[spec.name] = longest if previous is None else 0.8 * previous + 0.2 * longest
        with self._lock:
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

"""Collect segments from many callers for a few milliseconds and run them as one engine call per group."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Protocol

from core.errors import SynthesisError
from core.policy import BatchTiming
from core.registry import ModelSpec
from workers.engines.base import (
    Piece,
    RateFragment,
    RateReady,
    SegmentFragment,
    SynthesisRequest,
    Waveform,
    expect_one_per_input,
)
from workers.planner import BatchPlanner, Due, Early, Pending

log = logging.getLogger(__name__)


class RunBatch(Protocol):
    """Runs one engine call on one of the model's replicas; returns the waveforms and their rate.

    ``ready`` is told each waveform (and its rate) as soon as it is made, before the call returns, and ``fragment``
    each of their fragments before.
    """

    def __call__(
        self,
        spec: ModelSpec,
        requests: list[SynthesisRequest],
        replica: int,
        *,
        ready: RateReady | None = None,
        fragment: RateFragment | None = None,
    ) -> tuple[list[Waveform], int]: ...


class JoinBatch(Protocol):
    """Offers segments to the engine call running on one of the model's replicas; the future says if they joined.

    Joined segments' waveforms (and rate) are told to ``ready`` as each is made, and their fragments to ``fragment``;
    refused, they never started.
    """

    def __call__(
        self,
        spec: ModelSpec,
        requests: list[SynthesisRequest],
        replica: int,
        *,
        ready: RateReady,
        fragment: RateFragment | None = None,
    ) -> Future[bool]: ...


#: Gives a replica's host this many torch threads: (model, replica, threads).
ShareCores = Callable[[ModelSpec, int, int], None]
#: Called after each engine call with (model name, batch size, characters, seconds, seconds to its segments' first
#: fragments, on average).
BatchObserver = Callable[[str, int, int, float, float], None]


class _Wake:
    """Put in a model's queue when a replica frees, so a dispatcher waiting for arrivals looks again."""


_WAKE = _Wake()
Inbox = queue.SimpleQueue[Pending | None | _Wake]


#: A call takes joiners while what it started with is being made, and after that (while no other segment waits for a
#: replica) until it has run this many times as long as that took: rows that end are replaced rather than the call
#: draining row by row, yet a call that others keep joining still ends, within about four of its segments' time, and
#: is measured (the planner's call time, the stats admission reads). ``make bench-real`` measures what it buys.
JOIN_SPAN = 3.0


class _Running:
    """An engine call in progress on one replica, and the segments that joined it."""

    def __init__(self, group: list[Pending], started: float) -> None:
        self.group = group
        self.started = started  # time.perf_counter(), as Pending.made
        self.joined: list[Pending] = []  # accepted by the engine
        self.offered = 0  # segments offered and not yet answered
        self.open = True  # a refused offer closes it: the call is ending (or has not started)

    def joinable(self, *, extend: bool = True) -> bool:
        """Say whether it takes offers: not refused yet, and still making what it started with or, if ``extend``
        (no other segment waits for a replica to free), still making something and within ``JOIN_SPAN``."""
        if not self.open:
            return False
        if any(not p.future.done() for p in self.group):
            return True
        if not extend:
            return False
        took = max((p.made for p in self.group), default=0.0) - self.started  # none made (all canceled): 0
        return took > 0 and time.perf_counter() - self.started < JOIN_SPAN * took and bool(self.unfinished())

    def unfinished(self) -> list[Pending]:
        """Return its segments still being made."""
        return [p for p in (*self.group, *self.joined) if not p.future.done()]

    def live(self) -> int:
        """Return how many of its segments are still being made (or offered to it)."""
        return self.offered + len(self.unfinished())


def _fail(pendings: list[Pending], error: Exception) -> None:
    """Fail every segment that has no outcome yet (and whose caller still waits) with ``error``."""
    for pending in pendings:
        future = pending.future
        try:
            # A finished future (its waveform came before the call failed) keeps its outcome.
            if not future.done() and (future.running() or future.set_running_or_notify_cancel()):
                future.set_exception(error)
        except (InvalidStateError, RuntimeError):  # finished meanwhile: its caller has an answer
            pass


def _deliver(group: list[Pending], index: int, wave: Waveform, rate: int) -> None:
    """Give the segment at ``index`` of ``group`` its waveform, unless it already has one (a retried call)."""
    pending = group[index]
    with contextlib.suppress(InvalidStateError):
        pending.future.set_result((wave, rate))
        pending.made = time.perf_counter()


def _deliver_fragment(group: list[Pending], index: int, piece: Piece, rate: int) -> None:
    """Give the segment at ``index`` of ``group`` a fragment, while its caller still waits for it."""
    pending = group[index]
    if piece.number == 0 and not pending.first_piece:
        pending.first_piece = time.perf_counter()
    if pending.fragment is not None and not pending.future.done():
        pending.fragment(piece, rate)


class Batcher:
    """One dispatcher thread per model turns concurrent submissions into batched engine calls.

    Whenever one of the model's ``replicas`` is free, the dispatcher runs the batch its planner chooses
    (workers/planner.py: the most urgent segment and similar-length company). When that batch is not
    full, nothing else is waiting and its most urgent segment still has slack, it waits up to
    ``timing.hold_s`` for company. A deadline only moves later, and only a bounded amount (see
    ``core.schedule.Timeline``), while new work is never due before it arrives: every
    segment becomes the most urgent one in the end, so nothing starves.

    With ``join_batch``, a segment that arrives while every replica is busy and must start within one engine
    call (``BatchPlanner.joinable``: a job's first segment, a stream's next one about to be late) joins the
    running call with the fewest segments still being made, up to ``max_batch``, instead of waiting for a call
    to end; a call takes such segments while what it started with is still being made and, after that, while no
    other segment waits for a replica, until it has run ``JOIN_SPAN`` times as long, so that it ends. Segments
    join only while at most a batch of them must start now (more, and the engines are behind: the next call to
    end starts a full batch of them anyway), and a job's first segment never joins a call still making a playing
    stream's segment due within one engine call (``BatchPlanner.can_slow``): joiners slow every row.
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
        join_batch: JoinBatch | None = None,
        share_cores: ShareCores | None = None,
        cores: int = 0,
    ) -> None:
        self._run_batch = run_batch
        self._join_batch = join_batch
        # With ``cores`` to share among the replicas, the calls running split them: one alone takes them all.
        self._share_cores = share_cores if cores > 1 and replicas > 1 else None
        self.cores = cores
        self._running: dict[int, _Running] = {}
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.timing = timing or BatchTiming()
        self.planner = BatchPlanner(max_batch=max_batch, max_ratio=max_ratio, timing=self.timing, clock=clock)
        self.replicas = max(1, replicas)
        self._observe = observe
        self._clock = clock
        self._queues: dict[str, Inbox] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.batches = 0
        self.items = 0
        self.holds = 0
        self.joined = 0

    def submit(
        self,
        spec: ModelSpec,
        request: SynthesisRequest,
        *,
        deadline: Due | None = None,
        early: Early = False,
        fragment: SegmentFragment | None = None,
    ) -> Future[tuple[Waveform, int]]:
        """Queue one segment due at ``deadline`` (epoch seconds; none: now); resolve to its waveform and rate.

        ``early`` (or a function saying so now): the segment continues a stream already playing, so it should be
        written before its deadline, not start at it: it is ordered ``lead`` engine calls earlier. ``fragment`` is
        told its fragments (and their rate) as they are made, before the future resolves.
        """
        pending = Pending(spec, request, self._clock() if deadline is None else deadline, early, fragment=fragment)
        self._queue_for(spec.name).put(pending)
        return pending.future

    def _queue_for(self, name: str) -> Inbox:
        with self._lock:
            found = self._queues.get(name)
            if found is None:
                found = self._queues[name] = Inbox()
                thread = threading.Thread(
                    target=self._dispatch, args=(found, name), name=f"batcher-{name}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            return found

    def _collect(self, inbox: Inbox, backlog: list[Pending]) -> list[Pending] | None:
        # With nothing waiting, block for the first arrival, then wait at most
        # max_wait_s for company. With a backlog the engine must not idle: take
        # only what is already queued.
        items = list(backlog)
        while not items:
            first = inbox.get()
            if first is None:
                return None
            if isinstance(first, Pending):
                items.append(first)
        if not self._gather(inbox, items, 0.0 if backlog else self.max_wait_s):
            inbox.put(None)  # stop after this round
        return items

    def _gather(self, inbox: Inbox, items: list[Pending], wait_s: float) -> bool:
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
            if not isinstance(nxt, Pending):
                continue
            items.append(nxt)
            if remaining > 0 and len(items) >= self.max_batch:
                until = 0.0  # a full batch is here: take what else is queued, wait no longer

    def _free_replica(self, free: queue.SimpleQueue[int], inbox: Inbox, backlog: list[Pending]) -> int:
        """Wait for a free replica; meanwhile let urgent arrivals join the calls running (with ``join_batch``)."""
        while True:
            with contextlib.suppress(queue.Empty):
                return free.get_nowait()
            if self._join_batch is None:
                return free.get()
            self._offer(inbox, backlog)
            nxt = inbox.get()  # an arrival, a replica freeing (_WAKE), or the end
            if isinstance(nxt, Pending):
                backlog.append(nxt)
            # What else has arrived meanwhile is offered with it: one join (one prompt pass) for them all.
            if nxt is None or not self._gather(inbox, backlog, 0.0):
                replica = free.get()
                inbox.put(None)  # stop once the backlog is done
                return replica

    def _offer(self, inbox: Inbox, backlog: list[Pending]) -> None:
        """Offer the waiting segments that cannot wait for a call to end to the calls running, least busy first.

        A job's first segment is not offered to a call still making a playing stream's segment that is nearly due
        (joiners slow every row, and a listener who has started must not stall for a newcomer); a stream's next
        segment is: its own listener is playing too.
        """
        urgent = [p for p in self.planner.joinable(backlog) if not p.future.cancelled()]
        if not urgent:
            return
        # A call runs on past what it started with only while no other segment waits for a replica: those would
        # wait for it (a job's later segments, not due yet, run when a call ends).
        extend = len(urgent) == len(backlog)
        with self._lock:
            running = [(c.live(), r, c, c.unfinished()) for r, c in self._running.items() if c.joinable(extend=extend)]
        for live, replica, call, rows in sorted(running, key=lambda t: t[:2]):
            room = max(0, self.max_batch - live)
            allowed = urgent if self.planner.can_slow(rows) else [p for p in urgent if self.planner.early(p)]
            take = allowed[:room]
            if take:
                chosen = {id(p) for p in take}
                backlog[:] = [p for p in backlog if id(p) not in chosen]
                urgent = [p for p in urgent if id(p) not in chosen]
                self._join(call, replica, take, inbox)

    def _join(self, call: _Running, replica: int, group: list[Pending], inbox: Inbox) -> None:
        assert self._join_batch is not None
        with self._lock:
            call.offered += len(group)
        log.debug("offering %d segment(s) to the call running on replica %d", len(group), replica)
        answer = self._join_batch(
            group[0].spec, self._requests(group), replica, ready=functools.partial(_deliver, group),
            fragment=functools.partial(_deliver_fragment, group),
        )  # fmt: skip
        answer.add_done_callback(functools.partial(self._answered, call, group, inbox))

    def _answered(self, call: _Running, group: list[Pending], inbox: Inbox, answer: Future[bool]) -> None:
        joined = not answer.exception() and answer.result()
        with self._lock:
            call.offered -= len(group)
            if joined:
                call.joined += group
                self.joined += len(group)
            else:
                call.open = False  # it is ending: no more offers to it
        if not joined:
            for pending in group:
                inbox.put(pending)  # never started: back in line

    def _spread(self, spec: ModelSpec) -> None:
        """Share the cores among the calls running now: each gets an equal part, at least one."""
        if self._share_cores is None:
            return
        with self._lock:
            busy = sorted(self._running)
        for replica in busy:
            try:
                self._share_cores(spec, replica, max(1, self.cores // len(busy)))
            except Exception:  # sharing is an optimisation: a fault here must not fail the call
                log.exception("could not share the cores out to replica %d", replica)

    def _requests(self, group: list[Pending]) -> list[SynthesisRequest]:
        """Return the group's requests, each with how long before its listener needs it (its fragments may come
        together meanwhile, decoded at less cost) and whether its listener already plays the job."""
        now = self._clock()
        return [
            dataclasses.replace(p.request, slack_s=max(0.0, self.planner.due(p) - now), playing=self.planner.early(p))
            for p in group
        ]

    def choose(self, items: list[Pending]) -> list[Pending]:
        """Return the next batch: the earliest deadline and the similar-length segments due soonest after it."""
        return self.planner.plan(items)[0]

    def _dispatch(self, inbox: Inbox, name: str) -> None:
        # Each round waits for a free replica of the model, then plans the most urgent batch
        # from everything waiting at that moment: work is ordered as late as possible.
        # A fault in a round fails that round's segments (their tasks retry) and the next
        # round goes on: the dispatcher must outlive any bug, or every later caller would hang.
        free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for replica in range(self.replicas):
            free.put(replica)
        # Calls run on their own threads, so the dispatcher can take arrivals in while they run.
        calls = ThreadPoolExecutor(self.replicas, thread_name_prefix=f"engine-{name}")
        backlog: list[Pending] = []
        while True:
            replica = self._free_replica(free, inbox, backlog)
            items = self._collect(inbox, backlog)
            if items is None:
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
        calls: ThreadPoolExecutor,
        inbox: Inbox,
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
        calls.submit(self._run_then_free, group, replica, free, inbox)
        return backlog

    def _run_then_free(self, group: list[Pending], replica: int, free: queue.SimpleQueue[int], inbox: Inbox) -> None:
        try:
            self._run(group, replica)
        except Exception as e:  # a bug here must not leave the group's callers waiting for their timeout
            log.exception("engine call on replica %d failed outside the engine", replica)
            _fail(group, e)
        finally:
            free.put(replica)
            inbox.put(_WAKE)

    def _hold(self, inbox: Inbox, items: list[Pending]) -> bool:
        self.holds += 1
        return self._gather(inbox, items, self.timing.hold_s)

    def _run(self, group: list[Pending], replica: int = 0) -> None:
        group = [p for p in group if p.future.set_running_or_notify_cancel()]  # drop what callers gave up on
        if not group:
            return
        spec = group[0].spec
        started = time.perf_counter()
        call = _Running(group, started)
        with self._lock:
            self._running[replica] = call
        self._spread(spec)
        try:
            # A segment's caller gets its audio the moment it is made, not when the longest of its batch is.
            waves, rate = self._run_batch(
                spec, self._requests(group), replica, ready=functools.partial(_deliver, group),
                fragment=functools.partial(_deliver_fragment, group),
            )  # fmt: skip
            expect_one_per_input(waves, group, what="engine")
        except Exception as e:  # every waiting caller learns of the failure; none hangs
            self.planner.failed([p.request for p in (*group, *call.joined)])
            _fail([*group, *call.joined], e)
            return
        finally:
            with self._lock:
                self._running.pop(replica, None)
            self._spread(spec)
        elapsed = time.perf_counter() - started
        # The planner learns the call's time for what it was planned with: joiners may have kept it running.
        told = max((p.made for p in group), default=0.0)
        self.planner.ran(group, told - started if told > started else elapsed)
        made = [*group, *call.joined]
        with self._lock:
            self.batches += 1
            self.items += len(made)
        for index, wave in enumerate(waves):  # those ``ready`` was not told of (a run that never tells it)
            _deliver(group, index, wave, rate)
        # A joined segment has its waveform by now, unless its host died and the call was retried on another.
        _fail(call.joined, SynthesisError(f"the {spec.name} call it joined was lost (its model host died)"))
        if self._observe is not None:
            # How soon its segments' listeners heard them: each one's first fragment, on average (the whole call
            # when none was told of one).
            firsts = [p.first_piece - started for p in group if p.first_piece > started]
            first_s = sum(firsts) / len(firsts) if firsts else elapsed
            try:
                self._observe(spec.name, len(made), sum(len(p.request.text) for p in made), elapsed, first_s)
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

"""Choose a batch from the segments waiting for one model: the most urgent, and similar-length company."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from core.policy import BatchTiming
from core.registry import ModelSpec
from workers.engines.base import SegmentFragment, SynthesisRequest, Waveform

log = logging.getLogger(__name__)

#: A deadline in epoch seconds, or a function returning the current one.
Due = float | Callable[[], float]
#: Whether a segment continues a stream whose listener is playing, or a function saying so now.
Early = bool | Callable[[], bool]
#: Requests remembered as having been in a failed batch (oldest forgotten first).
_MAX_SUSPECTS = 4096


@dataclass
class Pending:
    """One segment waiting for an engine call, and the future its caller waits on."""

    spec: ModelSpec
    request: SynthesisRequest
    #: When the listener needs it (epoch seconds, or a function giving the current estimate, which
    #: may move as the job's first audio becomes known); its arrival time when none was given (FIFO).
    due: Due
    #: Start it ``lead`` engine calls early: it continues a stream whose listener is playing, and a late one makes
    #: that listener stall. A job's later segment before its first has arrived stalls no one yet: it is not early.
    early: Early = False
    future: Future[tuple[Waveform, int]] = field(default_factory=Future)
    #: Told its fragments (and their rate) as they are made, before its future resolves; None: nobody listens.
    fragment: SegmentFragment | None = None
    submitted: float = field(default_factory=time.monotonic)
    #: When its waveform was handed over (time.perf_counter), 0 until then.
    made: float = 0.0
    #: When its first fragment was (time.perf_counter), 0 until then.
    first_piece: float = 0.0


def compatible(a: int, b: int, *, max_ratio: float, slack: int = 8) -> bool:
    """Say whether texts of lengths ``a`` and ``b`` pad acceptably in one batch."""
    return max(a, b) <= max_ratio * min(a, b) + slack


class BatchPlanner:
    """Plan batches for the models of one worker, learning each model's call time as batches run.

    The next batch is the segment with the earliest deadline (a stream's next segment counted ``lead`` engine
    calls early, a job's first segment as early as it is late, up to ``first_priority_s``), with the segments of
    similar length (``max_ratio``) due soonest after it, up to ``max_batch`` and at most ``horizon_s`` later
    (``urgent_horizon_s`` when the head must start now).
    Segments whose batch failed run alone next time, so one poison input cannot fail its neighbours again.
    """

    def __init__(
        self, *, max_batch: int, max_ratio: float, timing: BatchTiming, clock: Callable[[], float] = time.time
    ) -> None:
        self.max_batch = max_batch
        self.max_ratio = max_ratio
        self.timing = timing
        self._clock = clock
        self._lock = threading.Lock()
        self._suspects: OrderedDict[SynthesisRequest, None] = OrderedDict()
        self._batch_s: dict[str, float] = {}  # per model: a moving average of one engine call's seconds
        self._batch_chars: dict[str, float] = {}  # ... and of its longest text's characters

    def plan(self, items: list[Pending]) -> tuple[list[Pending], float]:
        """Return the next batch and its most urgent deadline (sorting ``items`` by deadline)."""
        due = self._urgency(items)
        items.sort(key=lambda p: (due[id(p)], p.submitted))
        head = items[0]
        with self._lock:
            suspect = {id(p) for p in items if p.request in self._suspects}
        head_due = due[id(head)]
        if id(head) in suspect:
            return [head], head_due
        low = high = len(head.request.text)  # the group's shortest and longest texts
        group = [head]
        horizon = head_due + self._horizon(head, head_due, waiting=len(items))
        for p in items[1:]:
            if len(group) >= self.max_batch or due[id(p)] > horizon:
                break
            length = len(p.request.text)
            if id(p) not in suspect and compatible(min(low, length), max(high, length), max_ratio=self.max_ratio):
                group.append(p)
                low, high = min(low, length), max(high, length)
        return group, head_due

    def joinable(self, items: list[Pending]) -> list[Pending]:
        """Return the waiting segments that must start within one engine call, most urgent first.

        They would be late if they waited for a running call to end, so they join one (``Batcher``). A segment
        that was in a failed batch never joins: it runs alone. None does while more than a batch of them waits:
        the engines are behind, the next call to end starts a full batch of them anyway, and a join would only
        move some ahead of others, at the cost of a prompt pass of its own.
        """
        if not items:
            return []
        due = self._urgency(items)
        start_by = self._clock() + self._batch_s.get(items[0].spec.name, 0.0)
        with self._lock:
            urgent = [p for p in items if due[id(p)] <= start_by and p.request not in self._suspects]
        if len(urgent) > self.max_batch:
            return []
        return sorted(urgent, key=lambda p: (due[id(p)], p.submitted))

    def can_slow(self, rows: list[Pending]) -> bool:
        """Say whether a running call's unfinished ``rows`` can afford joiners, which slow every step of it: none
        continues a stream due within one engine call (a listener already playing would stall)."""
        if not rows:
            return True
        start_by = self._clock() + self._batch_s.get(rows[0].spec.name, 0.0)
        return all(self.due(p) > start_by for p in rows if self.early(p))

    def _horizon(self, head: Pending, head_due: float, *, waiting: int) -> float:
        """Return how much later than the head a segment may be due and still join its batch.

        A head that must start now (due within one engine call) takes only company that is nearly as urgent
        (``urgent_horizon_s``): a listener waits on it, and on a CPU every extra segment lengthens the call.
        Work that could wait runs in the next batch, with its own kind. Not when the engines are behind: more
        than a batch is waiting, or the head is already later than a call or the urgent horizon (beyond the
        priority a late first segment gets). Then full batches (throughput) are what shortens everyone's wait.
        (At ChatTTS's real size on 2 CPU cores every listener was tens of seconds late, and batches kept to 2 s
        of deadlines averaged 2 segments where 5 were waiting.)
        """
        call_s, timing = self._batch_s.get(head.spec.name, 0.0), self.timing
        slack = head_due - self._clock()
        behind = -slack > max(call_s, timing.urgent_horizon_s) + timing.first_priority_s
        if waiting <= self.max_batch and not behind and slack <= call_s:
            return min(timing.urgent_horizon_s, timing.horizon_s)
        return timing.horizon_s

    def _urgency(self, items: list[Pending]) -> dict[int, float]:
        """Return each item's deadline, moved earlier by the lead it deserves."""
        name = items[0].spec.name
        call_s, call_chars = self._batch_s.get(name, 0.0), self._batch_chars.get(name, 1.0)
        now, timing = self._clock(), self.timing

        def lead(p: Pending, due: float) -> float:
            # A first segment gains priority as it waits past its deadline, up to first_priority_s: under
            # overload its listener, who has nothing yet, waits first-hand; when the engines keep up it gains
            # little, and streams already playing keep theirs. (A later segment whose listener has not started
            # is due with the clock, for at most core.schedule.UNSTARTED_LIMIT_S, so it gains none before that.)
            if not self.early(p):
                return min(timing.first_priority_s, max(0.0, now - due))
            # A stream's next segment must be written by its deadline, so it starts ``lead`` calls earlier;
            # a call lasts about as long as its longest text, so a long segment's call is counted longer.
            return timing.lead * call_s * max(1.0, len(p.request.text) / call_chars)

        return {id(p): d - lead(p, d) for p, d in ((p, self.due(p)) for p in items)}

    @staticmethod
    def early(pending: Pending) -> bool:
        """Say whether a segment continues a stream whose listener is playing now."""
        return pending.early() if callable(pending.early) else pending.early

    def due(self, pending: Pending) -> float:
        """Return a segment's deadline now; one that cannot be computed (its job vanished) is due at once."""
        if not callable(pending.due):
            return pending.due
        try:
            return pending.due()
        except Exception:
            log.exception("deadline of a segment could not be computed; it is due now")
            pending.due = self._clock() - (time.monotonic() - pending.submitted)  # its arrival; logged once
            return pending.due

    def should_hold(self, group: list[Pending], items: list[Pending], head_due: float) -> bool:
        """Hold for company only when the batch is not full, all waiting work is in it, and it has slack."""
        hold_s = self.timing.hold_s
        if hold_s <= 0 or len(group) >= self.max_batch or len(items) > len(group):
            return False
        expected = self._batch_s.get(group[0].spec.name, 0.0)
        return head_due - self._clock() > expected + hold_s

    def ran(self, group: list[Pending], elapsed: float) -> None:
        """Learn from a batch that succeeded: its members are no longer suspect, and the model's call time."""
        name = group[0].spec.name
        longest = float(max(len(p.request.text) for p in group))
        with self._lock:
            for pending in group:
                self._suspects.pop(pending.request, None)
            previous = self._batch_s.get(name)
            self._batch_s[name] = elapsed if previous is None else 0.8 * previous + 0.2 * elapsed
            previous = self._batch_chars.get(name)
            self._batch_chars[name] = longest if previous is None else 0.8 * previous + 0.2 * longest

    def failed(self, requests: list[SynthesisRequest]) -> None:
        """Remember the members of a failed batch, so that each runs alone next time."""
        with self._lock:
            for request in requests:
                self._suspects[request] = None
            while len(self._suspects) > _MAX_SUSPECTS:
                self._suspects.popitem(last=False)

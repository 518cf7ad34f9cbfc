"""The scheduling policy: deadline-first or FIFO, decided once and handed to admission, submission and the batcher.

With ``scheduler="fifo"`` every deadline knob is off: segments travel in arrival order, the batcher never holds a
batch for a more urgent segment, and admission counts every outstanding segment as ahead of a new one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.lanes import LANES, Lane, Scheduler
from core.schedule import DeadlinePolicy
from core.settings import Settings, deadline_policy

__all__ = ["LANES", "BatchTiming", "Lane", "Scheduler", "SchedulingPolicy", "scheduling_policy"]


@dataclass(frozen=True)
class BatchTiming:
    """How the batcher trades a fuller batch against urgency (all zero under FIFO)."""

    hold_s: float = 0.0  # a batch may wait this long to fill while its most urgent segment has slack
    horizon_s: float = math.inf  # a batch only takes segments due within this of its most urgent one
    urgent_horizon_s: float = math.inf  # ... and within this when that one must start now (it is due within a call)
    lead: float = 0.0  # how many synthesis times ahead of its deadline a segment counts as urgent
    first_priority_s: float = 0.0  # a job's first segment is treated as due this much sooner


@dataclass(frozen=True)
class SchedulingPolicy:
    """One answer, everywhere, to "by deadline or first come, first served?", and to which lane a job takes."""

    scheduler: Scheduler = "deadline"
    deadlines: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    batch_timing: BatchTiming = field(default_factory=BatchTiming)
    batch_lane_chars: int = 2000
    window_realtime: int = 64
    window_batch: int = 4

    @property
    def by_deadline(self) -> bool:
        """Say whether segments are ordered by their listeners' playback deadlines."""
        return self.scheduler == "deadline"

    def lane_for(self, chars: int, asked: Lane | None = None) -> Lane:
        """Return the lane a job takes: the one asked for, else batch for a long text."""
        return asked or ("batch" if chars > self.batch_lane_chars else "realtime")

    def window(self, lane: Lane) -> int:
        """Return how many segments of one job may wait on the broker at once."""
        return self.window_batch if lane == "batch" else self.window_realtime

    def broker_order(self, deadlines: Sequence[float]) -> list[float] | None:
        """Return the deadlines the broker orders messages by, or None (arrival order) under FIFO."""
        return list(deadlines) if self.by_deadline else None

    def ahead_until(self, due: float) -> float:
        """Return the deadline up to which outstanding segments run before one due at ``due``."""
        return due if self.by_deadline else math.inf


def scheduling_policy(settings: Settings) -> SchedulingPolicy:
    """Return the scheduling policy the settings describe."""
    by_deadline = settings.scheduler == "deadline"  # the one place the setting is read
    timing = (
        BatchTiming(
            hold_s=settings.batch_hold_ms / 1000,
            horizon_s=settings.batch_horizon_s,
            urgent_horizon_s=settings.batch_urgent_horizon_s,
            lead=settings.deadline_lead,
            first_priority_s=settings.deadline_first_priority_s,
        )
        if by_deadline
        else BatchTiming()
    )
    return SchedulingPolicy(
        scheduler=settings.scheduler,
        deadlines=deadline_policy(settings),
        batch_timing=timing,
        batch_lane_chars=settings.batch_lane_chars,
        window_realtime=settings.enqueue_window_realtime,
        window_batch=settings.enqueue_window_batch,
    )

"""The names the scheduling policy is spelled in: lanes and schedulers, as literal types."""

from __future__ import annotations

from typing import Literal

#: Which queue a job's segments travel on: realtime listeners first, long texts on the batch lane.
Lane = Literal["realtime", "batch"]
LANES: tuple[Lane, ...] = ("realtime", "batch")
#: How work is ordered: by listeners' playback deadlines, or first come, first served.
Scheduler = Literal["deadline", "fifo"]

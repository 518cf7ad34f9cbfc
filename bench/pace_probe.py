"""How fast this machine runs right now: a fixed, short workload, timed between a benchmark's measured windows.

A shared machine's speed moves without showing as CPU steal. On 3 December 2026 the tiny engine alone made
35-40% fewer characters a second than half an hour before (batch 1: 44-53 chars/s against 80 per engine; batch
32: 322-331 against 538), while /proc/stat's steal stayed at 0%. A benchmark that compares windows run minutes
apart (bench-goodput's rates against the capacity it measured first) must say when the machine under them
changed, or a slower machine reads as a worse policy.

The workload is what the tiny model's engines spend their time on: many small tensor operations driven from
Python, on one thread. Run it while the stack is idle; its result is relative, so only ratios between probes of
one run mean anything. It is coarse: on this machine, idle, single 0.3 s timings differ by up to about 15% (the
machine's own speed moves that much from second to second) and the median of three by up to about 10%, so it shows
a drop like the one above, not a few percent.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Seconds each probe runs: long enough to smooth the scheduler's slices, short beside a measured window.
PROBE_S = 0.3
#: Operations timed together (one clock read per round).
ROUND = 50
#: Operations run untimed first.
WARM_UP = 200
#: Timings per probe, whose median it gives.
REPEATS = 3


def probe(seconds: float = PROBE_S, *, repeats: int = REPEATS) -> float:
    """Return how many rounds of small tensor work this process completes per second, on one torch thread: the
    median of ``repeats`` timings of ``seconds`` each."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            for _ in range(WARM_UP):  # the first operations pay for allocations and lazy set-up
                x = torch.tanh(x @ x * 0.05)
            return statistics.median(_rounds_per_second(x, seconds) for _ in range(repeats))
    finally:
        torch.set_num_threads(threads)


def _rounds_per_second(x: torch.Tensor, seconds: float) -> float:
    import torch

    rounds = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(ROUND):
            x = torch.tanh(x @ x * 0.05)
        rounds += 1
    return rounds / elapsed


def relative(pace: float, reference: float | None) -> float | None:
    """Return ``pace`` as a multiple of ``reference`` (None when either is unknown)."""
    if reference is None or reference <= 0 or pace <= 0:
        return None
    return pace / reference

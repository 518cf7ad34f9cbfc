"""What `make bench-store` makes of Redis's INFO: its cost per segment and per audio second, and the ceiling.

Redis runs every command on one thread, so the job store's ceiling is that thread's CPU: audio seconds written per
second of its CPU is the audio rate one full core takes. Its CPU is read from INFO (``used_cpu_*_main_thread``), not
from the drivers' pace, so that the figure holds when the drivers, not Redis, limited the rate achieved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

#: What each driver process counts, in this order, in its shared array.
COUNTS = ("segments", "audio_s", "fragments", "jobs", "refused", "errors")


@dataclass(frozen=True)
class Counters:
    """Redis's counters and the drivers': their values at a moment (Reading), or their change (Window)."""

    cpu_s: float  # Redis's main thread, user and system
    used_memory: int
    net_in: int
    net_out: int
    commands: int
    segments: float
    audio_s: float
    fragments: float
    jobs: float
    refused: float
    errors: float


@dataclass(frozen=True)
class Reading(Counters):
    """Redis's counters and the drivers' at one moment."""

    at: float  # time.monotonic()

    @classmethod
    def of(cls, info: Mapping[str, Any], counts: Sequence[float], at: float) -> Reading:
        """Read INFO's figures and the drivers' summed ``counts`` (in COUNTS order)."""
        return cls(
            at=at,
            cpu_s=float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"]),
            used_memory=int(info["used_memory"]),
            net_in=int(info["total_net_input_bytes"]),
            net_out=int(info["total_net_output_bytes"]),
            commands=int(info["total_commands_processed"]),
            **dict(zip(COUNTS, (float(c) for c in counts), strict=True)),
        )


def _per(amount: float, unit: float) -> float | None:
    return amount / unit if unit > 0 else None


@dataclass(frozen=True)
class Window(Counters):
    """What Redis and the drivers did between two readings (each counter: its change over the window)."""

    seconds: float

    @classmethod
    def between(cls, before: Reading, after: Reading) -> Window:
        """Return the change from ``before`` to ``after``."""
        changes = {f.name: getattr(after, f.name) - getattr(before, f.name) for f in fields(Counters)}
        return cls(seconds=after.at - before.at, **changes)

    @property
    def segments_per_s(self) -> float:
        """Return the segments written per second."""
        return self.segments / self.seconds

    @property
    def audio_per_s(self) -> float:
        """Return the audio seconds written per second."""
        return self.audio_s / self.seconds

    @property
    def cpu_share(self) -> float:
        """Return how busy Redis's main thread was (1.0: one full core)."""
        return self.cpu_s / self.seconds

    def per_audio_s(self, amount: float) -> float | None:
        """Return ``amount`` per audio second written (None: none was)."""
        return _per(amount, self.audio_s)

    def per_segment(self, amount: float) -> float | None:
        """Return ``amount`` per segment written (None: none was)."""
        return _per(amount, self.segments)

    @property
    def ceiling_audio_per_s(self) -> float | None:
        """Return the audio seconds a second that one full core of Redis takes, at this window's cost (None: the
        window wrote no audio, or cost nothing, and says nothing of it)."""
        return _per(self.audio_s, self.cpu_s) if self.audio_s > 0 else None

    @property
    def ceiling_segments_per_s(self) -> float | None:
        """Return the segments a second that one full core of Redis takes, at this window's cost (None: as above)."""
        return _per(self.segments, self.cpu_s) if self.segments > 0 else None


def kept_bytes(audio_per_s: float, stored_per_audio_s: float, keep_s: float) -> float:
    """Return the memory that keeping ``keep_s`` seconds' worth of audio made at ``audio_per_s`` takes."""
    return audio_per_s * keep_s * stored_per_audio_s


@dataclass(frozen=True)
class GpuRate:
    """One row of `make gpu-check`'s engine table: audio seconds a second one GPU made at a precision and batch."""

    precision: str
    batch: int
    audio_per_s: float


def gpu_rates(markdown: str) -> list[GpuRate]:
    """Return the engine rows of a published gpu_check.md (its ``| precision | batch | … | audio s/s |`` table);
    where it has a ``graphs`` column, only the rows with graphs on (what serves on a GPU)."""
    rates: list[GpuRate] = []
    header: list[str] | None = None
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            header = None
        elif header is None:
            header = cells
        elif "audio s/s" in header and "batch" in header and not set(line) <= set("|-: "):
            if "graphs" in header and cells[header.index("graphs")] != "on":
                continue
            precision = re.sub(r"\s*\(.*\)$", "", cells[0])
            audio = float(cells[header.index("audio s/s")].replace(",", ""))
            rates.append(GpuRate(precision, int(cells[header.index("batch")]), audio))
    return rates


@dataclass(frozen=True)
class CommandCost:
    """One Redis command's calls and microseconds over a window (INFO commandstats)."""

    name: str
    calls: int
    usec: int


def command_costs(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> list[CommandCost]:
    """Return each command's calls and time between two readings of INFO commandstats, the costliest first."""
    costs = [
        CommandCost(
            name.removeprefix("cmdstat_").upper(),
            int(now["calls"]) - int(before.get(name, {}).get("calls", 0)),
            int(now["usec"]) - int(before.get(name, {}).get("usec", 0)),
        )
        for name, now in after.items()
    ]
    return sorted((c for c in costs if c.calls > 0), key=lambda c: c.usec, reverse=True)

"""How busy the machine's CPUs were, and how much of that was this benchmark (Linux /proc)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How a process of ours is named in the breakdown, by the first marker found in its command line.
ROLES: tuple[tuple[str, str], ...] = (
    ("spawn_main", "model hosts"),
    ("redis-server", "redis"),
    ("gunicorn", "api"),
    ("bench.baseline_server", "baseline"),
    ("-m\0workers", "worker"),
)


@dataclass(frozen=True)
class Snapshot:
    """CPU ticks so far: the machine's total and busy ones, those of this process tree, and theirs by role."""

    total: int
    busy: int
    ours: int
    steal: int
    driver: int
    roles: dict[int, tuple[str, int]]


def _machine() -> tuple[int, int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total, total - idle, fields[7]  # steal: time the hypervisor gave another guest


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "load generator"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return "other"
    return next((role for marker, role in ROLES if marker in cmdline), "other")


def _tree_ticks(root: int) -> tuple[int, int, dict[int, tuple[str, int]]]:
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(rest[1])
        ticks[pid] = int(rest[11]) + int(rest[12])  # utime + stime
    ours = 0
    roles: dict[int, tuple[str, int]] = {}
    for pid, own in ticks.items():
        walker = pid
        while walker > 1 and walker != root:
            walker = parents.get(walker, 0)
        if walker == root:
            ours += own
            roles[pid] = (_role(pid, root), own)
    return ours, ticks.get(root, 0), roles


def snapshot() -> Snapshot:
    """Return the CPU ticks of the machine and of this process and its descendants."""
    total, busy, steal = _machine()
    ours, driver, roles = _tree_ticks(os.getpid())
    return Snapshot(total=total, busy=busy, ours=ours, driver=driver, roles=roles, steal=steal)


def by_role(first: Snapshot, last: Snapshot) -> dict[str, float]:
    """Return the CPU each role of ours used between two snapshots, in percent of one core, busiest first.

    A process that started in between counts from zero; one that ended in between is lost.
    """
    total = max(1, last.total - first.total)
    cores = os.cpu_count() or 1
    shares: dict[str, float] = {}
    for pid, (role, ticks) in last.roles.items():
        before = first.roles.get(pid, (role, 0))[1]
        shares[role] = shares.get(role, 0.0) + 100 * cores * max(0, ticks - before) / total
    return {role: round(pct, 1) for role, pct in sorted(shares.items(), key=lambda kv: -kv[1]) if pct >= 0.5}


def usage(first: Snapshot, last: Snapshot) -> dict[str, float]:
    """Return busy, ours (driver: the load generator itself), others' and stolen shares, in percent of all cores.

    Steal (time the hypervisor ran another guest on our cores) counts as busy and as others'.
    """
    total = max(1, last.total - first.total)
    busy = 100 * (last.busy - first.busy) / total
    # Ticks of processes of ours that ended in between are lost; clamp rather than go negative.
    ours = min(busy, max(0.0, 100 * (last.ours - first.ours) / total))
    driver = 100 * (last.driver - first.driver) / total
    return {
        "busy_pct": round(busy, 1),
        "ours_pct": round(ours, 1),
        "driver_pct": round(driver, 1),
        "others_pct": round(busy - ours, 1),
        "steal_pct": round(100 * (last.steal - first.steal) / total, 1),
    }


def _totals(counters: Callable[[], dict[str, float]] | None) -> dict[str, float]:
    try:
        return counters() if counters is not None else {}
    except Exception:  # a failed scrape must not stop the CPU measurement
        return {}


def _watch(
    found: dict[str, Any],
    start: float,
    end: float,
    *,
    probe: Callable[[], int] | None,
    counters: Callable[[], dict[str, float]] | None,
    every_s: float,
) -> None:
    """Wait for ``start``, then measure until ``end`` and put what was found into ``found``."""
    time.sleep(max(0.0, start - time.monotonic()))
    first, first_totals = snapshot(), _totals(counters)
    samples: list[int] = []
    while time.monotonic() < end:
        if probe is not None:
            # A failed probe must not stop the CPU measurement.
            with contextlib.suppress(Exception):
                samples.append(probe())
        time.sleep(max(0.0, min(every_s, end - time.monotonic())))
    last = snapshot()
    found.update(usage(first, last))
    found["roles"] = by_role(first, last)
    last_totals = _totals(counters)
    if first_totals and last_totals:
        found["counters"] = {k: v - first_totals.get(k, 0.0) for k, v in last_totals.items()}
    if samples:
        found["queue_mean"] = round(sum(samples) / len(samples), 1)
        found["queue_max"] = max(samples)


def meter_window(
    start: float,
    end: float,
    *,
    probe: Callable[[], int] | None = None,
    counters: Callable[[], dict[str, float]] | None = None,
    every_s: float = 0.5,
) -> Meter:
    """Start a thread that measures CPU use between monotonic times ``start`` and ``end``.

    With ``probe`` (say, the broker queue's length) it is also sampled every ``every_s`` seconds; with
    ``counters`` (say, the worker's Prometheus totals) their growth over the window is kept under
    "counters". The returned meter's ``result`` waits for the window's end and returns what it found.
    """
    found: dict[str, Any] = {}
    done = threading.Event()

    def guarded() -> None:
        try:
            _watch(found, start, end, probe=probe, counters=counters, every_s=every_s)
        finally:
            done.set()

    threading.Thread(target=guarded, daemon=True, name="cpu-meter").start()
    return Meter(found, done)


@dataclass
class Meter:
    """A window being measured: ``result`` waits for it to end (and the last readings to be taken)."""

    found: dict[str, Any]
    done: threading.Event

    def result(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Return the measurements, waiting up to ``timeout_s`` for the window's last readings."""
        self.done.wait(timeout_s)
        return self.found

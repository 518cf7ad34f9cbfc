"""How many model hosts a worker runs and how many torch threads each gets: ``auto`` picks it for the machine.

On CPUs the engines are bound by matrix maths, and a one-row step costs as long with a second host beside it as
alone (the benchmarks page, ``make bench-engine``): one one-thread host per core makes the most of the cores,
batched or not. Past ``MAX_CPU_HOSTS`` hosts, each holding its own copy of the model, memory grows faster than
throughput, so a bigger machine gets that many hosts with the cores shared out as threads. On a GPU one host
per device: batching, not more processes, fills a GPU. An explicit setting always wins.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

AUTO = "auto"
#: Most model hosts ``auto`` starts on CPUs: each loads the whole model.
MAX_CPU_HOSTS = 8
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@dataclass(frozen=True)
class Layout:
    """A worker's model hosts, the torch threads each runs (0: torch's default), and why."""

    replicas: int
    torch_threads: int
    reason: str
    #: The cores the hosts share out by what is running: while fewer hosts are busy, each busy one takes more of
    #: them (0: each keeps ``torch_threads``).
    shared_cores: int = 0
    #: The kinds of device ("cpu", "cuda") its hosts run on; the heartbeat tells the API, which refuses a mode whose
    #: model runs on none of them (core/registry.py).
    device_kinds: tuple[str, ...] = ("cpu",)

    def describe(self) -> str:
        """Return the layout in one log line."""
        threads = "torch's default threads" if self.torch_threads == 0 else f"{self.torch_threads} torch thread(s)"
        return f"{self.replicas} model host(s) per model, {threads} each ({self.reason})"


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Return the cores this process may run on: its CPU affinity, less a cgroup quota (a container's limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text(encoding="ascii").split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota here
    return max(1, cores)


def gpu_devices(device: str, visible: list[str]) -> int:
    """Return how many GPUs the device setting gives a worker's hosts (0: it runs on CPUs).

    ``visible`` are the GPUs this machine shows, which ``auto`` takes; a listed device counts once each."""
    listed = _listed(device)
    if all(d == AUTO for d in listed):
        return 1 if visible else 0
    return sum(1 for d in listed if d.startswith("cuda") or (d == AUTO and visible))


def device_kinds(device: str, visible: list[str]) -> tuple[str, ...]:
    """Return the kinds of device ("cpu", "cuda") the device setting gives a worker's hosts (``auto``: a GPU when
    ``visible`` shows one)."""
    return tuple(
        sorted({("cuda" if visible else "cpu") if d == AUTO else d.partition(":")[0] for d in _listed(device)})
    )


def _listed(device: str) -> list[str]:
    """Return the devices of a device setting ("auto", "cpu", "cuda:0,cuda:1"): ``auto`` when it lists none."""
    return [d.strip() for d in device.split(",") if d.strip()] or [AUTO]


def resolve_layout(replicas: int | str, torch_threads: int | str, *, gpus: int, cores: int) -> Layout:
    """Return the layout the two settings give on a machine with ``gpus`` GPUs for the worker and ``cores`` cores.

    ``auto`` in either is chosen for the machine; a number is kept as it is.
    """
    hosts_auto, threads_auto = replicas == AUTO, torch_threads == AUTO
    if not hosts_auto and not threads_auto:
        return Layout(int(replicas), int(torch_threads), "as set")
    if gpus:
        hosts = gpus if hosts_auto else int(replicas)
        threads = max(1, cores // hosts) if threads_auto else int(torch_threads)
        why = f"{gpus} GPU(s): one host per GPU, the CPU cores shared among the hosts"
    elif hosts_auto and threads_auto:
        hosts = min(MAX_CPU_HOSTS, cores)
        threads = cores // hosts  # one, unless there are more cores than hosts: then they are shared out
        why = (f"{cores} CPU core(s): one host per core, one thread each, at most {MAX_CPU_HOSTS} hosts; a call "
               "running alone takes the idle hosts' cores")  # fmt: skip
        return Layout(hosts, threads, "auto: " + why, shared_cores=hosts * threads if hosts > 1 else 0)
    elif hosts_auto:
        threads = int(torch_threads)
        # torch's default (0) takes every core: one host then
        hosts = max(1, min(MAX_CPU_HOSTS, cores // threads)) if threads else 1
        why = f"{cores} CPU core(s) shared among hosts of the threads set"
    else:
        hosts = int(replicas)
        threads = max(1, cores // hosts)
        why = f"{cores} CPU core(s) shared among the {hosts} host(s) set"
    return Layout(hosts, threads, "auto: " + why)


def machine_layout(replicas: int | str, torch_threads: int | str, device: str, visible: list[str]) -> Layout:
    """Return the layout for this machine (``visible``: the GPUs it shows), and log what ``auto`` chose."""
    layout = resolve_layout(replicas, torch_threads, gpus=gpu_devices(device, visible), cores=usable_cores())
    layout = replace(layout, device_kinds=device_kinds(device, visible))
    log.info("layout: %s; TTS_MODEL_REPLICAS and TTS_TORCH_THREADS override it", layout.describe())
    return layout

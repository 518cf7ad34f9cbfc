"""Start one worker per visible GPU, each pinned with CUDA_VISIBLE_DEVICES; one CPU worker without a GPU.

    python -m workers.launch                 # detect GPUs
    python -m workers.launch --devices 0,2   # only these GPUs
    python -m workers.launch --layout one    # one worker with a model host on each GPU (TTS_WORKER_LAYOUT=one)
    python -m workers.launch --fake-devices 3  # three CPU workers standing in for three GPUs (tests)

A worker batches only the segments it took from the broker; one worker holding a host on every GPU batches
from all of them, and so makes fuller calls (`make bench-workers` compares the two layouts).

A worker that exits is restarted in its own slot (same GPU, same environment) after a backoff
that doubles from 1 s to 30 s; there is never more than one worker per slot. SIGTERM or Ctrl-C
is passed on to every worker, which finishes its segments (warm shutdown), and nothing is
restarted while stopping. Workers die with the launcher, so a restarted launcher cannot put a
second worker on a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BASE_METRICS_PORT_ENV = "TTS_METRICS_PORT"
REPLICAS_ENV = "TTS_MODEL_REPLICAS"
LAYOUT_ENV = "TTS_WORKER_LAYOUT"
LAYOUTS = ("per-device", "one")
WORKER_COMMAND: tuple[str, ...] = (sys.executable, "-m", "workers")
#: glibc malloc settings for workers, unless the environment sets its own. A worker's task threads each get a
#: malloc arena, and segment-sized buffers freed in one and allocated in another fragment them: two arenas, and
#: large buffers mapped on their own (no adaptive threshold), keep a worker's resident memory from creeping up
#: under load (`make soak` measures it; workers/memory.py trims the rest).
ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# A worker that stayed up this long was healthy: its next crash starts the backoff afresh.
STABLE_AFTER_S = 60.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1


def visible_gpus() -> list[str]:
    """Return the GPU indexes this machine shows (honouring CUDA_VISIBLE_DEVICES), without importing torch."""
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    if pinned is not None:
        return [d for d in pinned.split(",") if d.strip()]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU ")]


def one_worker_environment(devices: Sequence[str], *, fake: bool, base_port: int) -> dict[str, str]:
    """Return the environment of one worker driving every device: a model host on each of them in turn, and as
    many hosts as devices unless TTS_MODEL_REPLICAS says otherwise."""
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(devices),
        # Inside the worker the visible GPUs are cuda:0 … cuda:N-1.
        "TTS_DEVICE": ",".join("cpu" if fake else f"cuda:{i}" for i in range(len(devices))),
        BASE_METRICS_PORT_ENV: str(base_port) if base_port else "0",
    }
    if REPLICAS_ENV not in os.environ:
        env[REPLICAS_ENV] = str(len(devices))
    return env


def worker_environments(devices: Sequence[str], *, fake: bool, base_port: int) -> list[dict[str, str]]:
    """Return the environment of each worker: its pinned device, and its own metrics port."""
    if not devices:
        return [{"TTS_DEVICE": os.environ.get("TTS_DEVICE", "cpu"), BASE_METRICS_PORT_ENV: str(base_port)}]
    return [
        {
            "CUDA_VISIBLE_DEVICES": device,
            # Inside a pinned process its one GPU is cuda:0.
            "TTS_DEVICE": "cpu" if fake else "cuda:0",
            BASE_METRICS_PORT_ENV: str(base_port + i) if base_port else "0",
        }
        for i, device in enumerate(devices)
    ]


def next_backoff(previous_s: float, uptime_s: float) -> float:
    """Return how long to wait before restarting a worker that ran for uptime_s after waiting previous_s."""
    if previous_s <= 0 or uptime_s >= STABLE_AFTER_S:
        return BACKOFF_FIRST_S
    return min(previous_s * 2, BACKOFF_MAX_S)


def describe_exit(returncode: int) -> str:
    """Return how a child ended, in words: its exit status or the signal that killed it."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def die_with_parent() -> Callable[[], None] | None:
    """Return a preexec function that makes the child get SIGKILL when this process dies (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    # Loaded before the fork: the child should only make the one system call.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # The launcher may have died between fork and prctl; then nobody would send the signal.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass
class Slot:
    """One device's place for exactly one worker, and its restart state."""

    name: str
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    told_to_stop: bool = False
    backoff_s: float = 0.0
    restart_at: float = 0.0


class Launcher:
    """Keep one worker running in every slot until told to stop."""

    def __init__(self, slots: list[Slot], command: Sequence[str]) -> None:
        self.slots = slots
        self.command = list(command)
        self.stopping = False
        self.stop_codes: list[int] = []
        self.preexec = die_with_parent()

    def start(self, slot: Slot) -> None:
        """Start the slot's worker."""
        # The launcher runs no threads, so preexec_fn is safe here.
        env = {**ALLOCATOR_ENV, **os.environ, **slot.env}
        slot.process = subprocess.Popen(self.command, env=env, preexec_fn=self.preexec)  # noqa: PLW1509
        slot.started_at = time.monotonic()
        slot.told_to_stop = False

    def stop(self, _signum: int = signal.SIGTERM, _frame: object = None) -> None:
        """Ask every worker to finish and restart none from now on."""
        self.stopping = True
        self.forward_stop()

    def forward_stop(self) -> None:
        """Send SIGTERM once to every worker not yet told to stop."""
        for slot in self.slots:
            if slot.process is not None and not slot.told_to_stop:
                slot.told_to_stop = True
                slot.process.send_signal(signal.SIGTERM)

    def reap(self, slot: Slot, returncode: int) -> None:
        """Forget the slot's ended worker; unless stopping, log it and schedule its restart."""
        assert slot.process is not None
        pid, slot.process = slot.process.pid, None
        if self.stopping:
            self.stop_codes.append(returncode)
            return
        now = time.monotonic()
        slot.backoff_s = next_backoff(slot.backoff_s, now - slot.started_at)
        slot.restart_at = now + slot.backoff_s
        print(
            f"worker in slot {slot.name} (pid {pid}) {describe_exit(returncode)}; "
            f"restarting it in {slot.backoff_s:g} s",
            flush=True,
        )

    def step(self) -> float:
        """Reap ended workers, start those whose backoff is over, and return how long to sleep."""
        if self.stopping:
            # A worker started while the signal was being handled has not been told yet.
            self.forward_stop()
        now = time.monotonic()
        delay = POLL_S
        for slot in self.slots:
            if slot.process is not None and (code := slot.process.poll()) is not None:
                self.reap(slot, code)
            if slot.process is None and not self.stopping:
                if slot.restart_at <= now:
                    self.start(slot)
                    assert slot.process is not None
                    print(f"worker in slot {slot.name} restarted as pid {slot.process.pid}", flush=True)
                else:
                    delay = min(delay, slot.restart_at - now)
        return max(delay, 0.0)

    def running(self) -> bool:
        """Say whether any worker is still alive or, unless stopping, is due to be restarted."""
        return not self.stopping or any(slot.process is not None for slot in self.slots)

    def exit_status(self) -> int:
        """Return 0 if every worker exited 0 on the stop, else the first failure as a shell status."""
        failed = [code for code in self.stop_codes if code != 0]
        if not failed:
            return 0
        return failed[0] if failed[0] > 0 else 128 - failed[0]

    def run(self) -> int:
        """Start every slot's worker, keep them running until stopped, and return the exit status."""
        for slot in self.slots:
            self.start(slot)
        names = ", ".join(slot.name for slot in self.slots)
        print(f"started {len(self.slots)} worker(s) on {names}", flush=True)
        while self.running():
            time.sleep(self.step())
        return self.exit_status()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", help="comma-separated GPU indexes (default: all visible)")
    parser.add_argument("--fake-devices", type=int, default=0, help="start N CPU workers pinned to fake indexes")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=os.environ.get(LAYOUT_ENV) or LAYOUTS[0],
        help=f"a worker per device, or one worker with a model host on each (default: ${LAYOUT_ENV} or per-device)",
    )
    # Tests run a stand-in child instead of a real worker (a shell-quoted command line).
    parser.add_argument("--worker-command", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def metrics_port() -> int:
    """Return the first worker's metrics port (TTS_METRICS_PORT, 9310; 0: none); exit saying why on a bad one."""
    raw = os.environ.get(BASE_METRICS_PORT_ENV, "9310")
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise SystemExit(f"{BASE_METRICS_PORT_ENV}: {raw!r} is not a port number (0 to 65535; 0: no metrics port)")
    return port


def build_slots(args: argparse.Namespace) -> list[Slot]:
    """Return one slot per device the arguments (or this machine) name, one slot for all of them (the ``one``
    layout), one slot for the devices TTS_DEVICE names, or one CPU slot."""
    fake = args.fake_devices > 0
    base_port = metrics_port()
    chosen = os.environ.get("TTS_DEVICE", "").strip()
    if not fake and not args.devices and chosen not in ("", "auto"):
        # The operator named the devices (TTS_DEVICE=cpu on a GPU machine, say): one worker uses exactly those,
        # unpinned, rather than a worker per GPU found.
        return [Slot(name=chosen, env={"TTS_DEVICE": chosen, BASE_METRICS_PORT_ENV: str(base_port)})]
    devices = [str(i) for i in range(args.fake_devices)] if fake else (
        args.devices.split(",") if args.devices else visible_gpus()
    )  # fmt: skip
    if args.layout == "one" and devices:
        return [Slot(name=",".join(devices), env=one_worker_environment(devices, fake=fake, base_port=base_port))]
    envs = worker_environments(devices, fake=fake, base_port=base_port)
    names = devices or ["cpu"]
    return [Slot(name=name, env=env) for name, env in zip(names, envs, strict=True)]


def main(argv: Sequence[str] | None = None, command: Sequence[str] = WORKER_COMMAND) -> int:
    """Start the workers, restart any that dies, and stop them all when told to."""
    args = parse_args(argv)
    launcher = Launcher(build_slots(args), shlex.split(args.worker_command) if args.worker_command else command)
    signal.signal(signal.SIGTERM, launcher.stop)
    signal.signal(signal.SIGINT, launcher.stop)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())

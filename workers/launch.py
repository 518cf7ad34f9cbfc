"""Start one worker per visible GPU, each pinned with CUDA_VISIBLE_DEVICES; one CPU worker without a GPU.

    python -m workers.launch                 # detect GPUs
    python -m workers.launch --devices 0,2   # only these GPUs
    python -m workers.launch --fake-devices 3  # three CPU workers standing in for three GPUs (tests)

SIGTERM or Ctrl-C is passed on to every worker, which finishes its segments (warm shutdown).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

BASE_METRICS_PORT_ENV = "TTS_METRICS_PORT"


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


def main(argv: Sequence[str] | None = None) -> int:
    """Start the workers and wait for them; stop them all when told to."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", help="comma-separated GPU indexes (default: all visible)")
    parser.add_argument("--fake-devices", type=int, default=0, help="start N CPU workers pinned to fake indexes")
    args = parser.parse_args(argv)
    fake = args.fake_devices > 0
    devices = [str(i) for i in range(args.fake_devices)] if fake else (
        args.devices.split(",") if args.devices else visible_gpus()
    )  # fmt: skip
    base_port = int(os.environ.get(BASE_METRICS_PORT_ENV, "9310"))
    children = [
        subprocess.Popen([sys.executable, "-m", "workers"], env={**os.environ, **env})
        for env in worker_environments(devices, fake=fake, base_port=base_port)
    ]
    print(f"started {len(children)} worker(s) on {', '.join(devices) if devices else 'cpu'}", flush=True)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(child.poll() is None for child in children):
        time.sleep(0.5)
    return max((child.returncode or 0) for child in children)


if __name__ == "__main__":
    sys.exit(main())

"""Answer Kubernetes' probes of the worker in this container: ``python -m workers.probe started|live``.

A worker takes no inbound traffic, so what shows it works is the heartbeat its own thread writes to Redis every
``TTS_HEARTBEAT_S`` (workers/runtime.py): the same one the other workers' janitors and the API's /readyz read.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache.connect import redis_client as store_client
from cache.workers import WorkerRegistry
from core.settings import load_settings

#: An upkeep pass (janitor, reconciler, idle models) ends every TTS_HEARTBEAT_S or so, longer
#: when a pass has much to hand on; none for this long means its thread is stuck while the heartbeat goes on.
UPKEEP_STUCK_S = 180.0


def redis_client(url: str) -> redis.Redis:
    """Return a client that tries each command once, briefly: the probe must answer within the kubelet's timeout."""
    # redis-py retries a refused connection 10 times with a growing backoff by default: seconds past that timeout,
    # and a probe that times out counts as failed, even the liveness probe that passes when Redis cannot be reached.
    return store_client(url, socket_connect_timeout=3, socket_timeout=3, retry=Retry(NoBackoff(), 0))


def started_at(pid: int) -> float | None:
    """Return when process ``pid`` started, in seconds since the epoch, or None if no such process runs here."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:  # comm is any bytes
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat", encoding="ascii") as f:
            booted_at = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return booted_at + ticks / os.sysconf("SC_CLK_TCK")


def own_beats(workers: WorkerRegistry, *, host: str) -> list[dict[str, Any]]:
    """Return the live heartbeats written by a process running here: of this host, and newer than their writer.

    A restarted container keeps its pod's hostname, and its worker often gets the same pid: a beat that the worker
    before it wrote just before dying names both, but is older than the process that has the pid now.
    """
    beats = []
    for beat in workers.alive():
        begun = started_at(int(beat.get("pid", 0)))
        if str(beat.get("hostname", "")).endswith(f"@{host}") and begun is not None and beat["seen_at"] >= begun:
            beats.append(beat)
    return beats


def started(workers: WorkerRegistry, *, host: str) -> tuple[bool, str]:
    """Say whether this container's worker has started: it beats, and the models it preloads are loaded."""
    try:
        beats = own_beats(workers, host=host)
    except redis.RedisError as e:
        return False, f"Redis cannot be reached: {e}"
    if not beats:
        return False, "no heartbeat from this container's worker yet"
    loading = sorted({str(model) for beat in beats for model in beat.get("loading", [])})
    if loading:
        return False, f"still loading {', '.join(loading)}"
    return True, "started: beating, models loaded"


def live(workers: WorkerRegistry, *, host: str) -> tuple[bool, str]:
    """Say whether this container's worker is alive: its last beat is fresh, or Redis cannot be reached to tell."""
    try:
        beats = own_beats(workers, host=host)
    except redis.RedisError as e:
        # Not the worker's fault, and a restart would not reach Redis sooner: failing here would restart every
        # worker at once, each reloading its models, for an outage the workers ride out on their own.
        return True, f"alive as far as can be told: Redis cannot be reached ({e})"
    if not beats:
        dead_after = workers.ttl_ms / 1000
        return False, f"no heartbeat for over {dead_after:g} s while Redis answers: the worker counts as dead"
    now = time.time()
    since = now - min(float(beat.get("upkeep_at", now)) for beat in beats)  # the oldest upkeep of this container's
    if since > UPKEEP_STUCK_S:
        return False, (
            f"beating, but its last upkeep pass ended {since:.0f} s ago (over {UPKEEP_STUCK_S:g} s): "
            "its janitor and reconciler are stuck"
        )
    return True, "alive: beating, upkeep running"


def main(argv: list[str] | None = None) -> int:
    """Run one probe, print why it passes or fails, and return its exit status (0: passes)."""
    parser = argparse.ArgumentParser(prog="python -m workers.probe", description=__doc__)
    parser.add_argument("probe", choices=("started", "live"))
    args = parser.parse_args(argv)
    settings = load_settings()
    client = redis_client(settings.redis_url)
    workers = WorkerRegistry(client, ttl_s=settings.worker_dead_after_s)
    try:
        ok, why = (started if args.probe == "started" else live)(workers, host=socket.gethostname())
    finally:
        client.close()
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

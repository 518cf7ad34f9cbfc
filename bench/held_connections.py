"""Benchmark held connections: /healthz and POST /v1/jobs latency while 1,000 event streams stay open.

Run with ``python -m bench.held_connections`` (``make bench-held``); the table goes to
``bench/results/held_connections.md``. It starts `make run` itself (scripts/run.sh, with a temporary
TTS_RUN_DIR and free ports: supervisord, Redis, the worker launcher with espeak, gunicorn with two gevent
processes, all at their default settings). It writes long-running jobs straight into the job store (their
segments all wait in the pending list, so nothing makes them and their streams stay open), then holds 1,000
server-sent event streams on them from one asyncio process, spread over 20 callers (20 loopback source
addresses, 50 streams each: under the default per-caller limit of 100). It times 200 `GET /healthz` and 200
`POST /v1/jobs` one after another, each on a fresh connection as a probe or a new client would: before the
streams open, with them held idle, and with a segment written to every held job every 5 s (every stream then
sends an event as often, 200 events a second in all; ``--event-interval 1`` for 1,000).
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.held_streams import Feeder, HeldStreams
from bench.report import median, p99, write_result
from cache.jobstore import JobRequest, JobStore
from devstack.local import ROOT
from devstack.processes import children, wait_for
from devstack.run_script import RunScript, readyz

TARGETS_MS = {"GET /healthz": 100.0, "POST /v1/jobs": 300.0}
CALLERS = 20
JOBS = 50
SEGMENTS = 600  # per held job: more than the feeder writes while the measurement lasts
#: How often each held stream gets a segment event in the active phase: a segment is a few seconds of audio.
EVENT_INTERVAL_S = 5.0
API_PROCESSES = 2  # make run's default


def timed(requests: int, call: Callable[[], int]) -> list[float]:
    """Run ``call`` ``requests`` times one after another; return each latency in ms (failing on a bad status)."""
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        status = call()
        latencies.append((time.perf_counter() - started) * 1000)
        if status >= 400:
            raise RuntimeError(f"request answered {status}")
    return latencies


def probe(port: int, method: str, path: str, body: dict[str, object] | None = None) -> Callable[[], int]:
    """Return a call that sends one request on a fresh connection and returns its status."""
    payload = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}

    def call() -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    return call


def api_rss_mb(run: RunScript) -> float:
    """Return the resident memory of the gunicorn processes serving the API, in MB."""
    master = run.pid_of("api")
    total_kb = 0
    for pid in [master, *children(master)]:
        status = Path(f"/proc/{pid}/status").read_text()
        total_kb += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return total_kb / 1024


def measure(port: int, requests: int) -> dict[str, list[float]]:
    """Time /healthz and POST /v1/jobs, ``requests`` of each."""
    body = {"text": "Hello there.", "model": "espeak-en", "cache": False}
    return {
        "GET /healthz": timed(requests, probe(port, "GET", "/healthz")),
        "POST /v1/jobs": timed(requests, probe(port, "POST", "/v1/jobs", body)),
    }


def redis_clients(client: redis.Redis) -> tuple[int, int]:
    """Return Redis's connected clients and how many of them are blocked in XREAD now."""
    found = client.client_list()
    return len(found), sum(1 for c in found if c.get("cmd") == "xread" and "b" in c.get("flags", ""))


@dataclass
class Measured:
    """What the phases of one run found: latencies and API memory per phase, and how the held streams fared."""

    phases: dict[str, dict[str, list[float]]]
    rss: dict[str, float]
    opened: int
    opened_s: float
    still_open: int
    event_rate: float
    clients: int
    blocked: int


def raise_file_limit(streams: int) -> None:
    """Allow this process (and scripts/run.sh's programs, which inherit the limit) a descriptor per stream."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < streams + 1000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, streams + 4000), hard))


def held_jobs(store: JobStore) -> list[str]:
    """Write JOBS long-running jobs whose segments all wait in the pending list, so nothing makes them."""
    request = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                         priority="batch", seed=None)  # fmt: skip
    return [store.create(request, ["held"] * SEGMENTS, pending=list(range(SEGMENTS))) for _ in range(JOBS)]


def measure_phases(run: RunScript, streams: int, requests: int, interval_s: float) -> Measured:
    """Measure with no stream, with the streams held idle, then with an event on every stream each interval."""
    client = redis.Redis(port=run.redis_port)
    store = JobStore(client, ttl=3600)
    jobs = held_jobs(store)
    phases = {"none": measure(run.api_port, requests)}
    rss = {"none": api_rss_mb(run)}
    paths = [f"/v1/jobs/{jobs[n % JOBS]}/events" for n in range(streams)]
    held = HeldStreams(run.api_port, paths, [f"127.0.0.{2 + n}" for n in range(CALLERS)])
    started = time.perf_counter()
    held.start()
    opened_s = time.perf_counter() - started
    clients, blocked = redis_clients(client)
    idle = f"{streams}, idle"
    phases[idle] = measure(run.api_port, requests)
    rss[idle] = api_rss_mb(run)
    active = f"{streams}, an event every {interval_s:g} s each"
    events_before, started = held.events, time.perf_counter()
    with Feeder(store, jobs, interval_s=interval_s):
        phases[active] = measure(run.api_port, requests)
        rss[active] = api_rss_mb(run)
    event_rate = (held.events - events_before) / (time.perf_counter() - started)
    still_open = held.open - held.ended
    held.close()
    for job_id in jobs:
        store.cancel(job_id)
    return Measured(phases, rss, held.open, opened_s, still_open, event_rate, clients, blocked)


def run_bench(streams: int, requests: int, out_dir: Path, *, interval_s: float = EVENT_INTERVAL_S) -> str:
    """Start `make run`, hold the streams, measure; return the markdown report."""
    raise_file_limit(streams)
    run = RunScript(
        out_dir / "run", ROOT / ".venv" / "bin" / "supervisorctl", env={"TTS_API_PROCESSES": str(API_PROCESSES)}
    )
    try:
        wait_for(lambda: readyz(run.api_port), 180, "make run ready", 0.5)
        found = measure_phases(run, streams, requests, interval_s)
    finally:
        run.close()
    return report(found, streams, requests, interval_s)


def report(found: Measured, streams: int, requests: int, interval_s: float) -> str:
    """Return the markdown report of one run."""
    rows = []
    for name, target in TARGETS_MS.items():
        for label, times in found.phases.items():
            verdict = "" if label == "none" else ("met" if p99(times[name]) < target else "**missed**")
            rows.append(f"| {name} | {label} | {median(times[name]):.1f} | {p99(times[name]):.1f} | "
                        f"{max(times[name]):.1f} | < {target:.0f} | {verdict} |")  # fmt: skip
    memory = ", ".join(f"{mb:.0f} MB ({label})" for label, mb in found.rss.items())
    opened, opened_s, still_open, event_rate = found.opened, found.opened_s, found.still_open, found.event_rate
    clients, blocked = found.clients, found.blocked
    return f"""# Held connections: the API answers while {streams} event streams stay open

`python -m bench.held_connections` (`make bench-held`): `make run` itself (scripts/run.sh: gunicorn with
api/gunicorn_conf.py, {API_PROCESSES} gevent processes; Redis; the worker launcher with espeak), default
settings. {streams} server-sent event streams held on {JOBS} long-running jobs from one asyncio process,
{CALLERS} callers (loopback source addresses) of {streams // CALLERS} streams each, under the default limit of
100 per caller: first idle (a keep-alive every 15 s), then with a segment written to every job every
{interval_s:g} s (each stream sends an event as often: about the pace at which a listener plays segments).
{requests} requests of each kind, one after another, each on a fresh connection; 2 shared CPU cores.

| request | streams held | p50 ms | p99 ms | max ms | target p99 | |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- {opened} of {streams} streams opened in {opened_s:.1f} s; {still_open} still open after the measurements;
  {event_rate:.0f} segment events a second reached the clients while the segments were written.
- Redis while the streams were held: {clients} connections in all, {blocked} blocked in XREAD (one waiter loop
  per API process, not one connection per stream).
- API memory (gunicorn master and workers, resident): {memory}.
- Before (gthread, 2 x 32 threads, as measured in issue 14): 80 streams on one job left /healthz timing out after
  20 s on one of the two processes.
"""


def main() -> None:
    """Run the benchmark and write its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--event-interval", type=float, default=EVENT_INTERVAL_S, help="seconds between events")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-held-") as tmp:
        report = run_bench(args.streams, args.requests, Path(tmp), interval_s=args.event_interval)
    write_result("held_connections", report)


if __name__ == "__main__":
    main()

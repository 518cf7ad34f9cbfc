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
import asyncio
import http.client
import json
import resource
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from bench.cache import median, p99, write_result
from cache.jobstore import JobRequest, JobStore
from tests.support.processes import children, wait_for
from tests.support.run_script import RunScript, readyz
from tests.support.servers import ROOT

TARGETS_MS = {"GET /healthz": 100.0, "POST /v1/jobs": 300.0}
CALLERS = 20
JOBS = 50
SEGMENTS = 600  # per held job: more than the feeder writes while the measurement lasts
#: How often each held stream gets a segment event in the active phase: a segment is a few seconds of audio.
EVENT_INTERVAL_S = 5.0
API_PROCESSES = 2  # make run's default


class HeldStreams:
    """Event streams held open from one asyncio loop in a thread of its own."""

    def __init__(self, port: int, paths: list[str], sources: list[str]) -> None:
        self.port = port
        self.paths = paths
        self.sources = sources
        self.open = 0
        self.failed: list[str] = []
        self.ended = 0
        self.events = 0
        self.loop = asyncio.new_event_loop()
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout_s: float = 120) -> None:
        """Open every stream; return once each has had its first event."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"only {self.open} of {len(self.paths)} streams opened in {timeout_s} s")
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} streams refused, e.g. {self.failed[0]}")

    def _run(self) -> None:
        self.loop.run_until_complete(self._open_all())
        self._ready.set()
        self.loop.run_forever()

    async def _open_all(self) -> None:
        limit = asyncio.Semaphore(100)

        async def one(n: int) -> None:
            async with limit:
                await self._open(self.paths[n], self.sources[n % len(self.sources)])

        await asyncio.gather(*(one(n) for n in range(len(self.paths))))

    async def _open(self, path: str, source: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            self.failed.append(head.decode(errors="replace").split("\r\n", 1)[0])
            writer.close()
            return
        await reader.readuntil(b"retry: 1000")
        self._writers.append(writer)
        self.open += 1
        self._tasks.append(self.loop.create_task(self._drain(reader)))

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(65536):  # events and keep-alives, until the server ends the stream
            self.events += data.count(b"event: segment")
        self.ended += 1

    def close(self) -> None:
        """Close every stream and stop the loop."""

        async def close_all() -> None:
            for writer in self._writers:
                writer.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


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


class Feeder:
    """Write one segment of every held job each ``interval_s``, so that every stream carries an event as often."""

    def __init__(self, store: JobStore, jobs: list[str], *, interval_s: float) -> None:
        self.store = store
        self.jobs = jobs
        self.interval_s = interval_s
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pcm = bytes(2 * 2205)  # 0.1 s of silence at 22,050 Hz
        step = self.interval_s / len(self.jobs)  # the jobs take turns: segments finish spread out, not at once
        while not self._stop.wait(step if self.written else 0):
            job_id = self.jobs[self.written % len(self.jobs)]
            index = self.written // len(self.jobs)
            self.store.write_segment(job_id, index, pcm, sample_rate=22050, meta={"duration_s": 0.1})
            self.written += 1

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def run_bench(streams: int, requests: int, out_dir: Path, *, interval_s: float = EVENT_INTERVAL_S) -> str:
    """Start `make run`, hold the streams, measure; return the markdown report."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < streams + 1000:  # one descriptor per stream here, and scripts/run.sh's programs inherit the limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, streams + 4000), hard))
    run = RunScript(
        out_dir / "run", ROOT / ".venv" / "bin" / "supervisorctl", env={"TTS_API_PROCESSES": str(API_PROCESSES)}
    )
    try:
        wait_for(lambda: readyz(run.api_port), 180, "make run ready", 0.5)
        client = redis.Redis(port=run.redis_port)
        store = JobStore(client, ttl=3600)
        request = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                             priority="batch", seed=None)  # fmt: skip
        jobs = [store.create(request, ["held"] * SEGMENTS, pending=list(range(SEGMENTS))) for _ in range(JOBS)]
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
    finally:
        run.close()
    rows = []
    for name, target in TARGETS_MS.items():
        for label, found in phases.items():
            verdict = "" if label == "none" else ("met" if p99(found[name]) < target else "**missed**")
            rows.append(f"| {name} | {label} | {median(found[name]):.1f} | {p99(found[name]):.1f} | "
                        f"{max(found[name]):.1f} | < {target:.0f} | {verdict} |")  # fmt: skip
    memory = ", ".join(f"{mb:.0f} MB ({label})" for label, mb in rss.items())
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

- {held.open} of {streams} streams opened in {opened_s:.1f} s; {still_open} still open after the measurements;
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

"""`make soak`: drive a `make run` stack at saturation for a long while and watch what grows.

Closed-loop callers submit a mix of short, paragraph-length and a few book-length jobs (most follow their
job's event stream, some download the whole audio), backing off as admission says. Every sample interval it
prints Redis's used memory against its budget, the API's and the workers' resident memory (every process of
each, model hosts included), jobs finished per second, admission answers and errors. At the
end it waits for every accepted job to end and says whether the targets held:

- Redis memory levels off below its budget;
- API and worker RSS grow less than 5% after warm-up (the first third of the run), read from a least-squares line
  through the samples after it (RSS saws by ±10 MB as buffers come and go);
- no errors other than deliberate admission answers (429/503), and every accepted job is done.

    python -m bench.soak [--minutes 30] [--callers 24] [--sample-s 30]

It runs scripts/run.sh exactly as `make run` does (default model, Redis maxmemory, two API processes), in
var/soak/ on ports of its own. Results go to bench/results/soak.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support.processes import descendants
from tests.support.run_script import RunScript, readyz
from tests.support.servers import ROOT

RESULTS = ROOT / "bench" / "results" / "soak.md"
SENTENCES = [line.strip() for line in (ROOT / "bench" / "corpus_zh.txt").read_text().splitlines() if line.strip()]


def text_of(kind: str, rng: random.Random) -> str:
    """Return a text of the kind: short (1–2 sentences), paragraph (~400 chars) or book (~12,000 chars)."""
    target = {"short": 30, "paragraph": 400, "book": 12_000}[kind]
    parts: list[str] = []
    while sum(map(len, parts)) < target:
        parts.append(rng.choice(SENTENCES))
        if kind == "book" and rng.random() < 0.15:
            parts.append("\n\n")
    return "".join(parts)


def rss_mb(pids: list[int], field: str = "VmRSS") -> float:
    """Return the summed resident memory of these processes in MB (gone ones count 0).

    ``VmRSS`` is all of it; ``RssAnon`` only private memory (heaps, stacks, buffers: where a leak would show),
    without the pages of shared libraries and files, which come and go with the page cache."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Tally:
    """What the callers saw, counted under a lock."""

    accepted: int = 0
    admission: int = 0  # 429 and 503: deliberate answers
    errors: list[str] = field(default_factory=list)
    done: int = 0
    downloads: int = 0
    open_jobs: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


class Caller:
    """One closed-loop caller: submit, follow (events) or poll, sometimes download, repeat."""

    def __init__(self, port: int, tally: Tally, seed: int, stop: threading.Event, *, books: bool) -> None:
        self.port, self.tally, self.stop, self.books = port, tally, stop, books
        self.rng = random.Random(seed)

    def request(
        self, method: str, path: str, body: dict[str, object] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.one()
            except (OSError, http.client.HTTPException) as e:
                self.tally.error(f"connection: {e!r}")
                self.stop.wait(1)

    def one(self) -> None:
        kind = "book" if self.books else ("short" if self.rng.random() < 0.65 else "paragraph")
        status, headers, data = self.request("POST", "/v1/jobs", {"text": text_of(kind, self.rng)})
        if status in (429, 503):
            with self.tally.lock:
                self.tally.admission += 1
            self.stop.wait(min(10.0, float(headers.get("Retry-After", "1"))))
            return
        if status != 202:
            self.tally.error(f"submit {status}: {data[:200]!r}")
            return
        job_id = json.loads(data)["id"]
        with self.tally.lock:
            self.tally.accepted += 1
            self.tally.open_jobs.add(job_id)
        view = self.follow(job_id) if kind != "book" else self.poll(job_id)
        if view is None:
            return
        if view["status"] != "done":
            self.tally.error(f"job {job_id} ended {view['status']}: {view.get('error')}")
        elif kind == "book" or self.rng.random() < 0.3:
            status, _, audio = self.request("GET", f"/v1/jobs/{job_id}/audio")
            if status != 200 or not audio:
                self.tally.error(f"audio {status} for {job_id}")
            with self.tally.lock:
                self.tally.downloads += 1
        with self.tally.lock:
            self.tally.open_jobs.discard(job_id)
            if view["status"] == "done":
                self.tally.done += 1

    def follow(self, job_id: str) -> dict[str, object] | None:
        """Read the job's event stream to its end, then return the job."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", f"/v1/jobs/{job_id}/events")
            response = conn.getresponse()
            if response.status != 200:
                self.tally.error(f"events {response.status} for {job_id}")
                return None
            for raw in response:
                if raw.startswith(b"event: ") and raw.strip() not in (b"event: segment",):
                    break
        finally:
            conn.close()
        return self.poll(job_id)

    def poll(self, job_id: str) -> dict[str, object] | None:
        """Poll the job until it ends (books: every 2 s)."""
        while True:
            status, _, data = self.request("GET", f"/v1/jobs/{job_id}")
            if status != 200:
                self.tally.error(f"poll {status} for {job_id}")
                return None
            view: dict[str, object] = json.loads(data)
            if view["status"] in ("done", "failed", "canceled"):
                return view
            time.sleep(2)


@dataclass
class Sample:
    minute: float
    redis_mb: float
    budget_mb: float
    kept_jobs: int
    api_mb: float
    worker_mb: float
    api_anon_mb: float
    worker_anon_mb: float
    jobs_s: float
    accepted: int
    admission: int
    errors: int


def sample(stack: RunScript, store: redis.Redis, tally: Tally, started: float, last: tuple[float, int]) -> Sample:
    info = store.info("memory")
    now = time.monotonic()
    with tally.lock:
        done, accepted, admission, errors = tally.done, tally.accepted, tally.admission, len(tally.errors)
    api, worker = stack.pid_of("api"), stack.pid_of("worker")
    api_pids = [api, *descendants(api)] if api else []
    worker_pids = [worker, *descendants(worker)] if worker else []
    return Sample(
        minute=(now - started) / 60,
        redis_mb=int(info["used_memory"]) / 2**20,
        budget_mb=int(info["maxmemory"]) / 2**20,
        kept_jobs=int(store.zcard("tts:audio:kept")),
        api_mb=rss_mb(api_pids),
        worker_mb=rss_mb(worker_pids),
        api_anon_mb=rss_mb(api_pids, "RssAnon"),
        worker_anon_mb=rss_mb(worker_pids, "RssAnon"),
        jobs_s=(done - last[1]) / max(1e-9, now - last[0]),
        accepted=accepted,
        admission=admission,
        errors=errors,
    )


HEADER = (
    "| min | Redis used MB | budget MB | jobs with audio kept | API RSS MB (private) | worker RSS MB (private) "
    "| jobs/s | accepted | 429/503 | errors |"
)
SEPARATOR = "|---" * (HEADER.count("|") - 1) + "|"


def row(s: Sample) -> str:
    return (f"| {s.minute:5.1f} | {s.redis_mb:8.1f} | {s.budget_mb:6.0f} | {s.kept_jobs} | {s.api_mb:6.1f} "
            f"({s.api_anon_mb:5.1f}) | {s.worker_mb:6.1f} ({s.worker_anon_mb:5.1f}) | {s.jobs_s:5.2f} | {s.accepted} "
            f"| {s.admission} | {s.errors} |")  # fmt: skip


def fitted(samples: list[Sample], value: Callable[[Sample], float]) -> tuple[float, float]:
    """Return a least-squares line's values at the first and the last sample.

    RSS saws as buffers come and go (±10 MB on a worker): two single samples say more about where each saw stood
    than about growth, so growth is read from the line through all of them."""
    if len(samples) < 2:
        only = value(samples[0]) if samples else 0.0
        return only, only
    slope, intercept = statistics.linear_regression([s.minute for s in samples], [value(s) for s in samples])
    return intercept + slope * samples[0].minute, intercept + slope * samples[-1].minute


def _change(fit: tuple[float, float]) -> float:
    return fit[1] / fit[0] - 1 if fit[0] else 0.0


def private_growth(samples: list[Sample]) -> str:
    """Say how private memory (RssAnon: no shared-library or file pages) moved after warm-up, as a figure."""
    warm = [s for s in samples if s.minute >= samples[-1].minute / 3] or samples
    api, worker = fitted(warm, lambda s: s.api_anon_mb), fitted(warm, lambda s: s.worker_anon_mb)
    return (f"private memory (RssAnon) after warm-up, least-squares line: API {api[0]:.0f} → {api[1]:.0f} MB "
            f"({_change(api):+.1%}), worker {worker[0]:.0f} → {worker[1]:.0f} MB ({_change(worker):+.1%})")  # fmt: skip


def verdicts(samples: list[Sample], tally: Tally, drained: bool) -> list[tuple[str, bool, str]]:
    """Return (target, held, figures) for each target."""
    warm = [s for s in samples if s.minute >= samples[-1].minute / 3] or samples
    end = samples[-1].minute
    middle_third = [s.redis_mb for s in samples if end / 3 <= s.minute < 2 * end / 3] or [samples[0].redis_mb]
    last_third = [s.redis_mb for s in samples if s.minute >= 2 * end / 3] or [samples[-1].redis_mb]
    budget = samples[-1].budget_mb
    peak = max(s.redis_mb for s in samples)
    api_fit, worker_fit = fitted(warm, lambda s: s.api_mb), fitted(warm, lambda s: s.worker_mb)
    growth = [(api_fit[1] / api_fit[0] - 1) if api_fit[0] else 0.0,
              (worker_fit[1] / worker_fit[0] - 1) if worker_fit[0] else 0.0]  # fmt: skip
    # Trimming saws between 70% and 80% of the budget: level means no trend between the thirds' means.
    trend = statistics.mean(last_third) - statistics.mean(middle_third)
    return [
        ("Redis memory below its budget", bool(budget) and peak < budget, f"peak {peak:.0f} MB of {budget:.0f} MB"),
        ("Redis memory levels off (last third's mean within 5% of the budget of the middle third's)",
         bool(budget) and abs(trend) < 0.05 * budget,
         f"middle third {statistics.mean(middle_third):.0f} MB, last third {statistics.mean(last_third):.0f} MB "
         f"({trend:+.0f} MB), range {min(last_third):.0f}–{max(last_third):.0f} MB"),
        ("API RSS grows < 5% after warm-up (least-squares line)", growth[0] < 0.05,
         f"{api_fit[0]:.0f} → {api_fit[1]:.0f} MB ({growth[0]:+.1%}); samples {warm[0].api_mb:.0f} → "
         f"{warm[-1].api_mb:.0f} MB"),
        ("worker RSS grows < 5% after warm-up (least-squares line)", growth[1] < 0.05,
         f"{worker_fit[0]:.0f} → {worker_fit[1]:.0f} MB ({growth[1]:+.1%}); samples {warm[0].worker_mb:.0f} → "
         f"{warm[-1].worker_mb:.0f} MB"),

        ("no errors besides admission answers", not tally.errors,
         f"{len(tally.errors)} errors, {tally.admission} admission answers"),
        ("every accepted job done", drained and tally.done == tally.accepted,
         f"{tally.done} of {tally.accepted} done"),
    ]  # fmt: skip


def stored_ratio(store: redis.Redis, jobs: int = 200) -> tuple[float, float]:
    """Return the store's bytes per second of kept audio (MEMORY USAGE of the audio hashes) and its share of raw
    PCM, over up to ``jobs`` of the newest finished jobs."""
    used = raw = seconds = 0.0
    newest: Any = store.zrange("tts:audio:kept", -jobs, -1)
    for member in newest:
        job = member.decode()
        size = store.memory_usage(f"tts:job:{{{job}}}:audio", samples=0)
        rate = store.hget(f"tts:job:{{{job}}}:record", "sample_rate")
        if not size or rate is None:
            continue
        duration = sum(json.loads(m).get("duration_s", 0.0) for m in store.hvals(f"tts:job:{{{job}}}:segmeta"))
        used += size
        seconds += duration
        raw += duration * int(rate) * 2
    return (used / seconds if seconds else 0.0), (used / raw if raw else 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "30")))
    parser.add_argument("--callers", type=int, default=24)
    parser.add_argument("--books", type=int, default=2, help="callers that submit only book-length jobs")
    parser.add_argument("--sample-s", type=float, default=30.0)
    args = parser.parse_args()

    run_dir = ROOT / "var" / "soak"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh Redis: the soak measures growth from nothing
    stack = RunScript(run_dir, ROOT / ".venv" / "bin" / "supervisorctl",
                      env={"TTS_DEFAULT_MODEL": os.environ.get("TTS_DEFAULT_MODEL", "espeak-cmn"),
                           "TTS_API_PROCESSES": os.environ.get("TTS_API_PROCESSES", "2")})  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while "==> ready" not in stack.text:
            if time.monotonic() > deadline or stack.process.poll() is not None:
                print(stack.text)
                return 1
            time.sleep(0.5)
        assert readyz(stack.api_port) is not None
        store = redis.Redis(port=stack.redis_port)
        tally, stop = Tally(), threading.Event()
        callers = [Caller(stack.api_port, tally, seed, stop, books=seed < args.books) for seed in range(args.callers)]
        threads = [threading.Thread(target=c.run, daemon=True) for c in callers]
        started = time.monotonic()
        for t in threads:
            t.start()
        print(f"soak: {args.callers} callers ({args.books} of them books) for {args.minutes:g} min on `make run`\n")
        print(HEADER)
        print(SEPARATOR)
        samples: list[Sample] = []
        last = (started, 0)
        while time.monotonic() - started < args.minutes * 60:
            stop.wait(args.sample_s)
            samples.append(sample(stack, store, tally, started, last))
            last = (time.monotonic(), tally.done)
            print(row(samples[-1]), flush=True)
        stop.set()
        drain_until = time.monotonic() + 600
        for t in threads:
            t.join(max(0.0, drain_until - time.monotonic()))
        drained = not any(t.is_alive() for t in threads)
        samples.append(sample(stack, store, tally, started, last))
        print(row(samples[-1]) + " (drained)")
        results = verdicts(samples, tally, drained)
        per_second, share = stored_ratio(store)
        stored = f"{per_second / 1024:.1f} KB per audio second stored, {share:.0%} of raw 16-bit PCM"
        print()
        for target, held, figures in results:
            print(f"{'PASS' if held else 'FAIL'}  {target}: {figures}")
        print(f"      {stored} (TTS_AUDIO_STORE_CODEC; lossless FLAC cannot reach half, see README)")
        print(f"      {private_growth(samples)}")
        for error in tally.errors[:10]:
            print("  error:", error)
        write_results(args, samples, results, tally, stored)
        return 0 if all(held for _, held, _ in results) else 1
    finally:
        stack.close()


def write_results(args: argparse.Namespace, samples: list[Sample], results: list[tuple[str, bool, str]],
                  tally: Tally, stored: str) -> None:  # fmt: skip
    lines = [
        "# Soak (`make soak`)",
        "",
        f"{args.callers} closed-loop callers ({args.books} submitting book-length jobs) for {args.minutes:g} min on "
        "`make run` at its defaults. Generated by `python -m bench.soak`.",
        "",
        HEADER,
        SEPARATOR,
        *[row(s) for s in samples],
        "",
        *[f"- {'PASS' if held else 'FAIL'} {target}: {figures}" for target, held, figures in results],
        f"- {stored} (TTS_AUDIO_STORE_CODEC; lossless FLAC cannot reach half, see README)",
        f"- {private_growth(samples)}",
        f"- median jobs/s over the run: {statistics.median(s.jobs_s for s in samples[:-1] or samples):.2f}; "
        f"{tally.downloads} whole-audio downloads",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark the sentence cache over HTTP: hit versus miss latency, and re-rendering an edited story.

Run with ``python -m bench.cache`` (``make bench-cache``). It starts a real stack (Redis on a free port,
``python -m workers`` serving the tiny ChatTTS, the API under gunicorn), drives it with ``requests`` and
writes its table to ``bench/results/cache.md``. This module also holds the helpers the other benches share.
"""

from __future__ import annotations

import codecs
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import redis
import requests

from cache.workers import WorkerRegistry
from celery_config import QUEUES, queue_keys
from tests.support.servers import ROOT, ApiProcess, RedisServer, WorkerProcess

T = TypeVar("T")

RESULTS = ROOT / "bench" / "results"
STORY = ROOT / "bench" / "story_zh.txt"
MODEL = "chattts-tiny"
#: Torch threads per model host. One, not two: on 2 shared cores a second OpenMP thread that loses its core
#: stalls every one of the tiny model's many small ops (NOTES-batch-cache-stream.md has the figures).
HEARTBEAT_S = 1.0
TORCH_THREADS = int(os.environ.get("BENCH_TORCH_THREADS", "1"))


def ensure_tiny_model() -> Path:
    """Build the tiny ChatTTS into models/chattts-tiny unless it is complete, and return its folder."""
    # In a child process: importing the builder imports torch, which would inflate this process's memory.
    out_dir = Path(os.environ.get("TTS_TINY_MODEL_DIR", ROOT / "models" / "chattts-tiny")).resolve()
    subprocess.run([sys.executable, "-m", "workers.engines.chattts_tiny", str(out_dir)], cwd=ROOT, check=True)
    return out_dir


def write_result(name: str, markdown: str) -> Path:
    """Print a bench's markdown and write it to bench/results/<name>.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"(written to {path.relative_to(ROOT)})")
    return path


def median(values: list[float]) -> float:
    """Return the median of ``values``."""
    return statistics.median(values)


def p99(values: list[float]) -> float:
    """Return the 99th percentile of ``values`` (linear interpolation)."""
    return float(np.percentile(values, 99))


def in_threads(count: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` for i < count in as many threads, released together; return results in order."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as e:  # re-raised below, in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@dataclass
class Stack:
    """A running Redis, worker and API, and how to reach them."""

    url: str
    redis: redis.Redis
    worker: WorkerProcess

    def submit(self, session: requests.Session, **body: Any) -> dict[str, Any]:
        """POST a job and return its JSON; fail loudly on anything but 202."""
        response = session.post(f"{self.url}/v1/jobs", json={"model": MODEL, **body}, timeout=60)
        if response.status_code != 202:
            raise RuntimeError(f"submit answered {response.status_code}: {response.text[:300]}")
        job: dict[str, Any] = response.json()
        return job

    def job(self, session: requests.Session, job_id: str) -> dict[str, Any]:
        """Return a job's JSON."""
        response = session.get(f"{self.url}/v1/jobs/{job_id}", timeout=30)
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        return job

    def segment(self, session: requests.Session, job_id: str, index: int, wait: float = 30) -> bytes:
        """Long-poll one segment's audio and return all of its bytes."""
        response = session.get(f"{self.url}/v1/jobs/{job_id}/segments/{index}", params={"wait": wait}, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"segment {index} answered {response.status_code}: {response.text[:300]}")
        return response.content

    def workers(self) -> list[dict[str, Any]]:
        """Return the live workers' heartbeats."""
        return WorkerRegistry(self.redis, ttl_s=3 * HEARTBEAT_S).alive()

    def backlog(self) -> int:
        """Count segment tasks queued or held unacknowledged by the worker (0: the worker is idle)."""
        queued = sum(int(self.redis.llen(key)) for lane in QUEUES for key in queue_keys(lane))
        return queued + int(self.redis.hlen("unacked"))

    def wait_idle(self, timeout: float = 120) -> None:
        """Wait until no segment task is queued or running."""
        deadline = time.monotonic() + timeout
        while self.backlog():
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker still busy after {timeout}s:\n{self.worker.log_tail()}")
            time.sleep(0.05)


def sse_events(session: requests.Session, url: str) -> Generator[tuple[str, dict[str, Any]], None, None]:
    """Yield (event name, data) from a server-sent event stream as each event arrives."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with session.get(url, stream=True, timeout=120) as response:
        response.raise_for_status()
        buffer = ""
        for chunk in response.iter_content(chunk_size=None):
            buffer += decoder.decode(chunk)
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                if "event" in fields:
                    yield fields["event"], json.loads(fields.get("data", "{}"))


def wait_done(stack: Stack, session: requests.Session, job_id: str) -> str:
    """Follow a job's events until it ends and return how it ended."""
    with closing(sse_events(session, f"{stack.url}/v1/jobs/{job_id}/events")) as events:
        for name, _ in events:
            if name != "segment":
                return name
    raise RuntimeError(f"event stream of job {job_id} ended without a final status")


@contextmanager
def running_stack(name: str, **env: str) -> Iterator[Stack]:
    """Start Redis, one worker serving the tiny ChatTTS on the CPU, and the API; stop them afterwards."""
    model_dir = ensure_tiny_model()
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = {part: RESULTS / f"{name}-{part}.log" for part in ("worker", "api")}
    for path in logs.values():
        path.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        settings = {
            "REDIS_URL": server.url,
            "TTS_DEFAULT_MODEL": MODEL,
            "TTS_TINY_MODEL_DIR": str(model_dir),
            "TTS_DEVICE": "cpu",
            "TTS_TORCH_THREADS": str(TORCH_THREADS),
            "TTS_HEARTBEAT_S": str(HEARTBEAT_S),
            "TTS_LOG_LEVEL": "INFO",
            "TTS_METRICS_PORT": "0",  # the default port may be another worker's on a shared machine
            **env,
        }
        worker = WorkerProcess(settings, logs["worker"])
        api = ApiProcess(settings, logs["api"])
        client = redis.Redis.from_url(server.url)
        try:
            worker.start()
            api.start()
            worker.wait_ready(client, timeout=240)
            yield Stack(api.url, client, worker)
        finally:
            api.stop()
            worker.stop()
            server.stop()


# --- the cache bench ---------------------------------------------------------------------------

CALLERS = 50
ROUNDS = 3
SENTENCE = "镇上的人说，石湾的雾是有脾气的，它高兴的时候只在水面上停一停。"
HIT_SEED = 7
#: (paragraph, old, new): three kinds of edit to one paragraph: a word, a new opening clause, a last sentence.
EDITS = [
    (3, "老式的钟", "老式的挂钟"),
    (6, "晓月原本只打算住两天，", "那年夏天，晓月原本只打算住两天，"),
    (9, "慢慢地靠近岸边。", "一点一点地靠近了岸边。"),
]


def first_segment_latency(stack: Stack, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Submit a job and long-poll its segment 0; return the seconds until its bytes arrived, and the job."""
    with requests.Session() as session:
        started = time.perf_counter()
        job = stack.submit(session, **body)
        audio = stack.segment(session, job["id"], 0)
        elapsed = time.perf_counter() - started
    if len(audio) < 100:
        raise RuntimeError(f"segment 0 of job {job['id']} has only {len(audio)} bytes")
    return elapsed, job


def hits_versus_misses(stack: Stack) -> list[str]:
    """Alternate rounds of 50 concurrent misses (fresh seeds) and 50 concurrent hits (one rendered request)."""
    with requests.Session() as session:
        job = stack.submit(session, text=SENTENCE, seed=HIT_SEED)
        wait_done(stack, session, job["id"])
    latencies: dict[str, list[float]] = {"miss": [], "hit": []}
    served_from_cache: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        for kind in ("miss", "hit"):
            seeds = [HIT_SEED] * CALLERS if kind == "hit" else [1000 * (round_no + 1) + i for i in range(CALLERS)]

            def caller(i: int, seeds: list[int] = seeds) -> tuple[float, dict[str, Any]]:
                return first_segment_latency(stack, {"text": SENTENCE, "seed": seeds[i]})

            results = in_threads(CALLERS, caller)
            latencies[kind] += [elapsed for elapsed, _ in results]
            served_from_cache[kind] += sum(job["cached_segments"] == job["segments_total"] for _, job in results)
            stack.wait_idle()
            print(f"  round {round_no + 1} {kind}: median {median([e for e, _ in results]):.3f}s", flush=True)
    miss, hit = latencies["miss"], latencies["hit"]
    return [
        f"### Same request at {CALLERS} concurrent callers: submit → segment 0 bytes received",
        "",
        f"{ROUNDS} rounds of each, alternated; {len(SENTENCE)}-character sentence, one segment; "
        "misses use a fresh seed per caller.",
        "",
        "| kind | samples | all cached at submit | median s | p99 s | max s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {kind} | {len(values)} | {served_from_cache[kind]} | {median(values):.3f} | {p99(values):.3f} "
            f"| {max(values):.3f} |"
            for kind, values in (("miss", miss), ("hit", hit))
        ),
        "",
        f"**hit p99 / miss p99 = {p99(hit) / p99(miss):.1%}** (target ≤ 5%)",
        "",
    ]


def edited(story: str, paragraph: int, old: str, new: str) -> str:
    """Return the story with ``old`` replaced by ``new`` in one paragraph."""
    paragraphs = story.split("\n\n")
    if old not in paragraphs[paragraph]:
        raise ValueError(f"paragraph {paragraph} has no {old!r}")
    paragraphs[paragraph] = paragraphs[paragraph].replace(old, new, 1)
    return "\n\n".join(paragraphs)


def planned(text: str) -> list[str]:
    """Plan ``text`` as the API does."""
    from core.settings import load_settings
    from core.text import plan_segments

    settings = load_settings()
    return plan_segments(
        text,
        max_chars=settings.segment_max_chars,
        first_max_chars=settings.first_segment_max_chars,
        language="zh",
    )


def render(stack: Stack, text: str, seed: int) -> tuple[float, dict[str, Any]]:
    """Submit a text, follow it until done; return the wall seconds and the final job."""
    with requests.Session() as session:
        started = time.perf_counter()
        job = stack.submit(session, text=text, seed=seed)
        ended = wait_done(stack, session, job["id"])
        elapsed = time.perf_counter() - started
        final = stack.job(session, job["id"])
    if ended != "done":
        raise RuntimeError(f"job {job['id']} ended {ended}: {final.get('error')}")
    return elapsed, final


def edited_story(stack: Stack) -> list[str]:
    """Render the story, then three versions with one paragraph changed; count what was synthesised again."""
    story = STORY.read_text(encoding="utf-8").strip()
    seed = 4242
    first_s, first = render(stack, story, seed)
    print(f"  first render: {first['segments_total']} segments in {first_s:.1f}s", flush=True)
    rows = [
        f"| whole story, first time | {first['segments_total']} | {first['segments_total'] - first['cached_segments']} "
        f"| – | – | {first_s:.2f} | 100% |"
    ]
    ratios = []
    before = planned(story)
    for paragraph, old, new in EDITS:
        text = edited(story, paragraph, old, new)
        after = planned(text)
        changed = sum((Counter(after) - Counter(before)).values())
        in_paragraph = len(planned_paragraph(text, paragraph))
        wall, job = render(stack, text, seed)
        made = job["segments_total"] - job["cached_segments"]
        ratios.append(wall / first_s)
        rows.append(
            f"| paragraph {paragraph + 1} edited ({old}→{new}) | {job['segments_total']} | {made} | {in_paragraph} "
            f"| {changed} | {wall:.2f} | {wall / first_s:.1%} |"
        )
        print(f"  edit of paragraph {paragraph + 1}: {made} synthesised in {wall:.2f}s", flush=True)
    return [
        f"### A {len(story)}-character story ({len(story.split(chr(10) * 2))} paragraphs), then one paragraph edited",
        "",
        "Same seed each time, so unchanged segments hit the sentence cache. Wall time: submit → `done` event.",
        "",
        "| render | segments | synthesised | segments in the edited paragraph | changed segments (by plan) "
        "| wall s | of first |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"**re-render wall time, median of {len(EDITS)} edits: {median(ratios):.1%} of the first render** "
        "(target ≤ 20%); synthesised should equal the changed segments.",
        "",
    ]


def planned_paragraph(text: str, paragraph: int) -> list[str]:
    """Plan one paragraph of ``text`` as it is planned inside the whole text (not the first: no short cap)."""
    from core.settings import load_settings
    from core.text import plan_segments

    cap = load_settings().segment_max_chars
    return plan_segments(text.split("\n\n")[paragraph], max_chars=cap, first_max_chars=cap, language="zh")


def main() -> None:
    """Run both parts of the cache bench against one stack and write the table."""
    started = time.perf_counter()
    # Admission would refuse part of the 50-caller miss burst (503): its wait estimate comes from recent
    # throughput, which a warm-up at batch size 1 understates. This bench measures the cache, not admission.
    with running_stack("cache", TTS_ADMISSION_REALTIME_WAIT_S="3600") as stack:
        print("hits versus misses …", flush=True)
        lines = hits_versus_misses(stack)
        print("edited story …", flush=True)
        lines += edited_story(stack)
        time.sleep(2 * HEARTBEAT_S)  # let the heartbeat catch up with the last batch
        lines.append(
            f"Worker's mean batch size over the run (heartbeat): {[w.get('mean_batch_size') for w in stack.workers()]}"
        )
    header = [
        "## bench-cache: sentence cache over HTTP (tiny ChatTTS, CPU, one worker)",
        "",
        f"{os.cpu_count()} CPU cores, torch threads per model host {TORCH_THREADS}; "
        f"ran {time.perf_counter() - started:.0f}s.",
        "",
    ]
    write_result("cache", "\n".join(header + lines))


if __name__ == "__main__":
    main()

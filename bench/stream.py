"""Benchmark time to first audio: a one-sentence text versus a ~3,000-character story, over HTTP.

Run with ``python -m bench.stream`` (``make bench-stream``); the table goes to ``bench/results/stream.md``.
Three texts: one short sentence, one sentence as long as the story's first segment, and the story.
Each job is submitted with ``cache: false`` and its own seed, then followed two ways at once: the events
endpoint (first ``segment`` event, then that segment's bytes) and the growing audio stream (first audio byte
after the WAV header). The texts take turns; a long job is canceled once its first audio arrived,
and the next job waits until the worker is idle.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import closing

import requests

from bench.http_stack import Stack, running_stack, sse_events
from bench.report import median, write_result
from bench.stack_args import default_layout
from bench.texts import STORY, planned
from bench.threads import in_threads
from cache import keys

SHORT = "灯塔的光穿过了雾，照亮了回家的路。"
REPS = 6
WAV_HEADER = 44
#: The short text, a one-segment text as long as the story's first segment (it isolates what the story's
#: other segments cost its first audio from what the first segment's own length costs), and the story.
KINDS = ("short", "first-sized", "long")


def by_events(stack: Stack, job_id: str, started: float, marks: dict[str, float]) -> None:
    """Mark the job's first `segment` event and the moment that segment's bytes were in hand."""
    with requests.Session() as own, closing(sse_events(own, f"{stack.url}/v1/jobs/{job_id}/events")) as events:
        for name, data in events:
            if name == "segment":
                marks["event"] = time.perf_counter() - started
                audio = own.get(f"{stack.url}{data['url']}", timeout=60)
                audio.raise_for_status()
                marks["event_bytes"] = time.perf_counter() - started
                return
            raise RuntimeError(f"job {job_id} ended {name} before any segment: {data}")


def by_stream(stack: Stack, job_id: str, started: float, marks: dict[str, float]) -> None:
    """Mark the first audio byte after the WAV header of the job's growing audio stream."""
    with requests.Session() as own:
        url = f"{stack.url}/v1/jobs/{job_id}/audio"
        with own.get(url, stream=True, timeout=60) as response:
            response.raise_for_status()
            received = 0
            for chunk in response.iter_content(chunk_size=None):
                received += len(chunk)
                if received > WAV_HEADER:
                    marks["stream"] = time.perf_counter() - started
                    return


def first_audio(stack: Stack, text: str, seed: int) -> dict[str, float]:
    """Submit one uncached job and time its first audio through both endpoints; cancel what is left."""
    marks: dict[str, float] = {}
    with requests.Session() as session:
        started = time.perf_counter()
        job = stack.submit(session, text=text, seed=seed, cache=False, format="wav")
        marks["accepted"] = time.perf_counter() - started
        job_id = job["id"]
        follows = (by_events, by_stream)
        in_threads(len(follows), lambda i: follows[i](stack, job_id, started, marks))  # both at once
        final = stack.job(session, job_id)
        if final["status"] not in ("done", "failed", "canceled"):
            session.delete(f"{stack.url}/v1/jobs/{job_id}", timeout=30).raise_for_status()
    meta = json.loads(stack.redis.hget(keys.segment_meta(job_id), "0") or "{}")
    marks["pickup"] = (final["started_at"] or final["created_at"]) - final["created_at"]
    marks["synth0"] = float(meta.get("synth_s", float("nan")))
    marks["segments"] = final["segments_total"]
    marks["done_at_first"] = final["segments_done"]
    stack.wait_idle()
    return marks


def collect(stack: Stack, texts: dict[str, str]) -> dict[str, list[dict[str, float]]]:
    """Time every text's first audio REPS times, the texts taking turns in rotating order, after a warm-up."""
    samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    first_audio(stack, SHORT, seed=1)  # warm-up, not counted
    for rep in range(REPS):
        for kind in KINDS[rep % len(KINDS) :] + KINDS[: rep % len(KINDS)]:  # rotate the order
            marks = first_audio(stack, texts[kind], seed=10 * rep + KINDS.index(kind) + 2)
            samples[kind].append(marks)
            print(
                f"  {kind:11} rep {rep + 1}: event {marks['event']:.2f}s, stream {marks['stream']:.2f}s, "
                f"segment 0 synthesised in {marks['synth0']:.2f}s",
                flush=True,
            )
    return samples


COLUMNS = [
    ("accepted", "202 received"),
    ("event", "first `segment` event"),
    ("event_bytes", "…its bytes received"),
    ("stream", "first audio byte of /audio"),
    ("pickup", "job created → first task started"),
    ("synth0", "segment 0: batcher + engine"),
]


def table(texts: dict[str, str], samples: dict[str, list[dict[str, float]]], started: float, batch: object) -> str:
    """Return the bench's markdown: medians per text and column, the ratios, every sample."""

    def med(kind: str, name: str) -> float:
        return median([m[name] for m in samples[kind]])

    def every(kind: str) -> str:
        return ", ".join(f"{m['event']:.2f}" for m in samples[kind])

    lines = [
        "## bench-stream: time to first audio (tiny ChatTTS, CPU, one worker)",
        "",
        f"{os.cpu_count()} CPU cores, {default_layout().describe()}; ran "
        f"{time.perf_counter() - started:.0f}s. Uncached jobs (`cache: false`, a seed each), the three texts in "
        f"rotating order, {REPS} of each; both endpoints followed at once on the same job. Medians, seconds from "
        "just before `POST /v1/jobs`; the last two columns come from the job record and segment 0's metadata.",
        "",
        "| text | characters | segments | segment 0 chars | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|---|---|---|" + "---|" * len(COLUMNS),
        *(
            f"| {kind} | {len(texts[kind])} | {samples[kind][0]['segments']:.0f} | {len(planned(texts[kind])[0])} | "
            + " | ".join(f"{med(kind, name):.3f}" for name, _ in COLUMNS)
            + " |"
            for kind in KINDS
        ),
        "",
        f"- long / short, first segment event: **{med('long', 'event') / med('short', 'event'):.2f}×**; "
        f"its bytes: **{med('long', 'event_bytes') / med('short', 'event_bytes'):.2f}×**; "
        f"audio stream: **{med('long', 'stream') / med('short', 'stream'):.2f}×** (target ≤ 1.5×)",
        f"- long / first-sized, first segment event: **{med('long', 'event') / med('first-sized', 'event'):.2f}×** "
        f"(what the story's other {samples['long'][0]['segments'] - 1:.0f} segments add to its first audio)",
        *(f"- every sample, seconds to the first `segment` event, {kind}: {every(kind)}" for kind in KINDS),
        f"- worker's mean batch size over the run (heartbeat): {batch}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Alternate short and long jobs, time their first audio, and write the table."""
    started = time.perf_counter()
    story = STORY.read_text(encoding="utf-8").strip()
    texts = {"short": SHORT, "first-sized": planned(story)[0], "long": story}
    with running_stack("stream") as stack:
        samples = collect(stack, texts)
        time.sleep(2)  # let the heartbeat catch up with the last batch
        batch = [w.get("mean_batch_size") for w in stack.workers()]
    write_result("stream", table(texts, samples, started, batch))


if __name__ == "__main__":
    main()

"""Benchmark the sentence cache over HTTP: hit versus miss latency, and re-rendering an edited story.

Run with ``python -m bench.cache`` (``make bench-cache``). It starts a real stack (Redis on a free port,
``python -m workers`` serving the tiny ChatTTS, the API under gunicorn), drives it with ``requests`` and
writes its table to ``bench/results/cache.md``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import requests

from bench.http_stack import HEARTBEAT_S, Stack, first_segment_latency, running_stack, wait_done
from bench.report import machine_header, median, p99, write_result
from bench.stack_args import default_layout
from bench.texts import STORY, planned, planned_paragraph
from bench.threads import in_threads

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


#: Admission would refuse part of the 50-caller miss burst (503): its estimates come from recent throughput, which a
#: warm-up at batch size 1 understates. This bench measures the cache, not admission, so it turns admission off.
ADMISSION_OFF = {"TTS_ADMISSION_REALTIME_WAIT_S": "3600", "TTS_ADMISSION_LATENESS_S": "0",
                 "TTS_ADMISSION_FIRST_AUDIO_S": "0"}  # fmt: skip


def main() -> None:
    """Run both parts of the cache bench against one stack and write the table."""
    started = time.perf_counter()
    with running_stack("cache", **ADMISSION_OFF) as stack:
        print("hits versus misses …", flush=True)
        lines = hits_versus_misses(stack)
        print("edited story …", flush=True)
        lines += edited_story(stack)
        time.sleep(2 * HEARTBEAT_S)  # let the heartbeat catch up with the last batch
        lines.append(
            f"Worker's mean batch size over the run (heartbeat): {[w.get('mean_batch_size') for w in stack.workers()]}"
        )
    changed = ", ".join(f"{name}={value}" for name, value in ADMISSION_OFF.items())
    title = f"bench-cache: sentence cache over HTTP (tiny ChatTTS, CPU, one worker; settings changed: {changed})"
    write_result("cache", "\n".join(machine_header(title, started, default_layout().torch_threads) + lines))


if __name__ == "__main__":
    main()

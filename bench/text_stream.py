"""Speak while the text is still being written: text streams fed at an LLM's pace, against whole jobs.

Run with ``python -m bench.text_stream [--levels 1,10] [--transports pieces,client,websocket]``
(``make bench-textstream``, every level and transport); the table goes to
``bench/results/text-stream.md``. One stack (Redis, one worker with the tiny ChatTTS on the CPU, the API); the
worker runs at `make run`'s defaults (its ``auto`` layout: one model host per core on a CPU).
At 1 and then 10 concurrent callers, each caller in turn:

- **streams**: opens a text stream and sends a text from the corpus one character per piece (one character
  per token, Chinese) at ``TOKENS_PER_S``, then the final piece, while a follower long-polls every segment;
- **client streams**: the same through ``TTSClient``'s ``TextStream.write``, a character a call, which joins the
  tokens of up to ``JOIN_S`` into one piece and sends a sentence end (and the space after one) at once;
- **whole jobs**: submits each sentence of the same texts as a job of its own and long-polls its segment 0, for
  ``WHOLE_SECONDS`` just before each transport's streams, so that each ratio is between adjacent windows.

A segment is ready to be planned at the piece after which the job's ``segments_total`` counts it; its latency
runs from just before that piece was sent to the moment its bytes were in hand. The reference is a whole job's
first audio for the same sentence, at the same concurrency, in the window just before (this shared machine's
speed drifts by a third within minutes; bench/pace_probe.py). A listener starts at the stream's first audio and
plays each segment for its duration; a stall is a gap over 100 ms while the segment's text had been complete for at
least a whole job's p95 first audio (time enough to make it); gaps whose text came later are counted apart.
Callers start spread over the first ``RAMP_S`` seconds of each level.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from simple_websocket import Client, ConnectionClosed

from bench.headline_cpu import by_role, snapshot
from bench.http_clients import Http
from bench.http_stack import Stack, first_segment_latency, running_stack
from bench.pace_probe import probe, relative
from bench.report import median, percentile, write_result
from bench.stack_args import default_layout
from bench.threads import in_threads
from bench.tiny_model import MODEL
from cache import keys
from client import TTSClient
from client.text_stream import JOIN_S, SENTENCE_ENDS
from devstack.local import ROOT

TOKENS_PER_S = 30.0
LEVELS = (1, 10)
SECONDS_PER_LEVEL = 60.0
#: The whole-job window run just before each transport's streams, as their reference.
WHOLE_SECONDS = 30.0
SENTENCES_PER_TEXT = 4
STALL_S = 0.1
#: Callers start this far apart in all over the first RAMP_S (a fleet of agents never starts in one instant);
#: whole jobs and streams alike.
RAMP_S = 2.0
CORPUS = ROOT / "bench" / "corpus_zh.txt"
T = TypeVar("T")


@dataclass
class StreamRun:
    """What one text stream measured."""

    planned_at: dict[int, float] = field(default_factory=dict)  # segment → just before the piece that planned it
    arrived_at: dict[int, float] = field(default_factory=dict)  # segment → its bytes in hand
    final_at: float = 0.0
    durations: dict[int, float] = field(default_factory=dict)
    synth_s: dict[int, float] = field(default_factory=dict)
    made_at: dict[int, float] = field(default_factory=dict)  # segment → its audio was made, just before its write
    status: str = ""
    #: time.time() − time.perf_counter() when the run began: turns the worker's wall-clock stamps into this clock.
    wall_offset: float = field(default_factory=lambda: time.time() - time.perf_counter())

    def latencies(self) -> list[float]:
        return [self.arrived_at[i] - self.planned_at[i] for i in sorted(self.arrived_at) if i in self.planned_at]

    def stalls(self, lead_s: float = 0.0) -> tuple[int, float]:
        """Return the listener's gaps over STALL_S whose segment's text was complete at least ``lead_s`` before the
        listener needed it, and their seconds.

        With ``lead_s`` a whole job's p95 first audio, these are the stalls the service owes: its text came in time
        to be made. A gap whose text came later than that is the writer's pace, not the service's."""
        order = sorted(self.arrived_at)
        if not order:
            return 0, 0.0
        clock, count, total = self.arrived_at[order[0]], 0, 0.0
        for previous, index in itertools.pairwise(order):
            clock += self.durations.get(previous, 0.0)
            arrived = self.arrived_at[index]
            if arrived > clock + STALL_S and self.planned_at.get(index, clock) + lead_s <= clock:
                count += 1
                total += arrived - clock
            clock = max(clock, arrived)
        return count, total


def _texts() -> list[str]:
    lines = [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return ["".join(lines[i : i + SENTENCES_PER_TEXT]) for i in range(0, len(lines), SENTENCES_PER_TEXT)]


def _json(http: Http, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    payload = None if body is None else json.dumps(body, ensure_ascii=False).encode()
    status, _, data, _ = http.exchange(method, path, payload, {"Content-Type": "application/json"})
    return status, json.loads(data)


def _follow(stack: Stack, job_id: str, run: StreamRun, done: threading.Event) -> None:
    """Long-poll each segment in order (an open stream's next one too, before it is planned) until the job is over
    and every segment is in hand."""
    http = Http(stack.url, timeout_s=60)
    try:
        index = 0
        while True:
            status, headers, _, _ = http.exchange("GET", f"/v1/jobs/{job_id}/segments/{index}?wait=30")
            if status == 200:
                run.arrived_at[index] = time.perf_counter()
                run.durations[index] = float(headers.get("X-Segment-Duration", 0))
                index += 1
                continue
            status, job = _json(http, "GET", f"/v1/jobs/{job_id}")  # past a closed stream's end (404), or over
            if status != 200:
                raise RuntimeError(f"job {job_id} answered {status}: {job}")
            if job["status"] in ("failed", "canceled") or (job["status"] == "done" and index >= job["segments_total"]):
                run.status = job["status"]
                done.set()
                return
    finally:
        http.close()


def http_stream(stack: Stack, text: str, seed: int) -> StreamRun:
    """Feed one text over HTTP at TOKENS_PER_S, a character a piece, then the final piece; follow its segments.

    The writer keeps one keep-alive connection (``http.client``: the load generator shares the machine's cores
    with the service: at ten streams ``requests`` took 26-28% of a core, this 10%)."""
    run, done = StreamRun(), threading.Event()
    http = _writer(stack)
    body = {"model": MODEL, "text": "", "text_stream": True, "seed": seed, "cache": False, "format": "wav"}
    status, job = _json(http, "POST", "/v1/jobs", body)
    if status != 202:
        raise RuntimeError(f"submit answered {status}: {job}")
    job_id, planned = job["id"], 0
    follower = threading.Thread(target=_follow, args=(stack, job_id, run, done), daemon=True)
    follower.start()
    start = time.perf_counter()
    pieces = [*text, ""]
    for seq, piece in enumerate(pieces):
        time.sleep(max(0.0, start + seq / TOKENS_PER_S - time.perf_counter()))  # the writer's own pace
        sent = time.perf_counter()
        final = seq == len(pieces) - 1
        if final:
            run.final_at = sent
        status, answer = _json(http, "POST", f"/v1/jobs/{job_id}/text", {"seq": seq, "text": piece, "final": final})
        if status != 200:
            raise RuntimeError(f"piece {seq} of {job_id} answered {status}: {answer}")
        for index in range(planned, answer["segments_total"]):
            run.planned_at[index] = sent
        planned = answer["segments_total"]
    if not done.wait(120):
        raise RuntimeError(f"text stream {job_id} did not end within 120 s of its final piece")
    return _with_synthesis(stack, job_id, run)


_writers: dict[str, Http] = {}


def _writer(stack: Stack) -> Http:
    """Return the stack's writer client: one keep-alive connection per calling thread, kept across its streams."""
    return _writers.setdefault(stack.url, Http(stack.url, timeout_s=30))


def client_stream(stack: Stack, text: str, seed: int) -> StreamRun:
    """Feed one text through ``TTSClient``'s ``TextStream.write`` at TOKENS_PER_S, a character a call (it joins
    tokens for up to ``JOIN_S`` and sends a sentence end at once); follow its segments as ``http_stream`` does."""
    run, done = StreamRun(), threading.Event()
    with TTSClient(stack.url) as client:
        stream = client.open_stream(model=MODEL, seed=seed, cache=False, format="wav")
        follower = threading.Thread(target=_follow, args=(stack, stream.job_id, run, done), daemon=True)
        follower.start()
        start = previous = time.perf_counter()
        planned = 0
        for seq, token in enumerate(text):
            time.sleep(max(0.0, start + seq / TOKENS_PER_S - time.perf_counter()))  # the writer's own pace
            sent = time.perf_counter()
            stream.write(token)
            # A sentence end is sent within this call; anything else may have gone with a timed send since
            # the previous call: counted from then, which can only make its latency look longer.
            at = sent if token in SENTENCE_ENDS else previous
            for index in range(planned, stream.segments_total):
                run.planned_at[index] = at
            planned, previous = max(planned, stream.segments_total), sent
        run.final_at = time.perf_counter()
        stream.finish()
        for index in range(planned, stream.segments_total):
            run.planned_at[index] = run.final_at
        if not done.wait(120):
            raise RuntimeError(f"text stream {stream.job_id} did not end within 120 s of its final piece")
    return _with_synthesis(stack, stream.job_id, run)


def _with_synthesis(stack: Stack, job_id: str, run: StreamRun) -> StreamRun:
    for index in run.arrived_at:
        raw = stack.redis.hget(keys.segment_meta(job_id), str(index))
        if raw:
            meta = json.loads(raw)
            run.synth_s[index] = float(meta.get("synth_s", 0.0))
            if meta.get("finished_at"):
                run.made_at[index] = float(meta["finished_at"]) - run.wall_offset
    return run


def ws_stream(stack: Stack, text: str, seed: int) -> StreamRun:
    """Feed one text over the WebSocket at TOKENS_PER_S, a character a message; take the audio on the same one."""
    run, sent_at = StreamRun(), dict[int, float]()
    ws = Client.connect(stack.url.replace("http://", "ws://") + "/v1/jobs/stream")
    try:
        ws.send(json.dumps({"text": "", "seed": seed, "cache": False, "format": "wav", "model": MODEL}))
        job_id = json.loads(ws.receive(timeout=30))["id"]
        ended = threading.Event()

        def receive() -> None:
            planned, index = 0, 0
            while not ended.is_set():
                message = ws.receive(timeout=120)
                if message is None:
                    return
                if isinstance(message, bytes):
                    run.arrived_at[index] = time.perf_counter()
                    index += 1
                    continue
                event = json.loads(message)
                if event["type"] == "planned":
                    for i in range(planned, event["segments_total"]):
                        run.planned_at[i] = sent_at[event["seq"]]
                    planned = event["segments_total"]
                elif event["type"] == "segment":
                    run.durations[event["index"]] = float(event["duration_s"] or 0.0)
                else:
                    run.status = event["type"]
                    ended.set()

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        start = time.perf_counter()
        for seq, piece in enumerate(text):
            time.sleep(max(0.0, start + seq / TOKENS_PER_S - time.perf_counter()))  # the writer's own pace
            sent_at[seq] = time.perf_counter()
            ws.send(json.dumps({"text": piece}))
        sent_at[len(text)] = run.final_at = time.perf_counter()
        ws.send(json.dumps({"final": True}))
        if not ended.wait(120):
            raise RuntimeError(f"text stream {job_id} did not end within 120 s of its final piece")
    finally:
        with contextlib.suppress(ConnectionClosed, OSError):  # the server may have closed it first
            ws.close()
    return _with_synthesis(stack, job_id, run)


def closed_loop(
    stack: Stack, callers: int, work: Callable[[int, int], T], seconds: float = SECONDS_PER_LEVEL
) -> list[T]:
    """Run ``callers`` closed-loop callers of ``work(caller, turn)`` for ``seconds``; return every result."""
    found: list[T] = []
    lock = threading.Lock()
    until = time.perf_counter() + seconds

    def caller(number: int) -> None:
        time.sleep(number * RAMP_S / callers)  # the caller's start in the ramp, not a wait for anything
        turn = 0
        while time.perf_counter() < until:
            result = work(number, turn)
            turn += 1
            with lock:
                found.append(result)

    in_threads(callers, caller)
    stack.wait_idle()
    return found


def streams_at(stack: Stack, callers: int, stream: Callable[[Stack, str, int], StreamRun]) -> list[StreamRun]:
    """Closed-loop stream writers, each text of the corpus in turn; return every stream they ran."""
    texts = _texts()
    return closed_loop(stack, callers, lambda n, turn: stream(stack, texts[(n * 7 + turn) % len(texts)],
                                                              1000 * n + turn))  # fmt: skip


def whole_jobs_at(stack: Stack, callers: int) -> list[float]:
    """Closed-loop callers of one-sentence whole jobs; return their first-audio seconds."""
    sentences = [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]

    def whole(n: int, turn: int) -> float:
        body = {"text": sentences[(n * 13 + turn) % len(sentences)], "seed": 5000 + 100 * n + turn,
                "cache": False, "format": "wav"}  # fmt: skip
        return first_segment_latency(stack, body)[0]

    return closed_loop(stack, callers, whole, WHOLE_SECONDS)


TRANSPORTS: dict[str, Callable[[Stack, str, int], StreamRun]] = {
    "HTTP pieces": http_stream,
    "HTTP, TTSClient.write": client_stream,
    "WebSocket": ws_stream,
}


#: The transports by the names ``--transports`` takes.
BY_SHORT_NAME = dict(zip(("pieces", "client", "websocket"), TRANSPORTS, strict=True))


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _cpu(shares: dict[str, float]) -> str:
    return " / ".join(f"{shares.get(role, 0.0):.0f}" for role in ("model hosts", "api", "load generator"))


def _paces(paces: tuple[float | None, float | None] | None) -> str:
    return "–" if paces is None else " / ".join(f"{_fmt(p)}×" for p in paces)


def table(rows: list[dict[str, Any]], started: float) -> str:
    """Return the bench's markdown."""
    lines = [
        "## bench-textstream: speaking while the text is written (tiny ChatTTS, CPU, one worker)",
        "",
        f"{os.cpu_count()} CPU cores, {default_layout().describe()}; ran "
        f"{time.perf_counter() - started:.0f} s; {SECONDS_PER_LEVEL:g} s of streams per level and way in, each "
        f"just after {WHOLE_SECONDS:g} s of whole jobs at the same concurrency, its reference. Text arrives at "
        f"{TOKENS_PER_S:g} tokens/s, one character per token, {SENTENCES_PER_TEXT} corpus sentences per stream; "
        f'callers start spread over the first {RAMP_S:g} s. "HTTP pieces" sends a POST per token; '
        f'"TTSClient.write" joins the tokens of up to {JOIN_S:g} s into one piece and sends a sentence end at once. '
        "Service settings: `make run`'s defaults. Machine pace: how fast a fixed "
        "single-thread workload ran just before the window, with the stack idle, as a multiple of its pace before "
        "the stack started (a shared machine slows without showing steal; bench/pace_probe.py): a ratio between two "
        "windows is fair only when their paces match.",
        "",
        "| streams | pieces over | streams run | segments | end of text → audio, first segment p50 / p95 (s) | "
        "every segment p50 / p95 (s) | whole job's first audio, the window before, p50 / p95 (s) | "
        "first segment ÷ whole job, p50 / p95 | "
        "final → last audio p50 (s) | last segment's synthesis p50 (s) | final → last audio beyond that segment's "
        "synthesis, per stream p50 / p95 (s) | of which waiting behind an earlier segment, p50 / p95 (s) | "
        "and its own delivery, p50 / p95 (s) | final → last audio beyond the longest synthesis still under way at "
        "the final piece, p50 / p95 (s) | next segment made first (of pairs) | stalls: gap > 100 ms, text there a "
        "whole job's p95 first audio before needed | gaps > 100 ms whose text came later than that | failed | "
        "CPU, % of one core: model hosts / API / load generator | machine pace before the window, whole jobs / "
        "these streams |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:

        def pair(low: str, high: str, row: dict[str, Any] = row) -> str:
            return f"{_fmt(row[low])} / {_fmt(row[high])}"

        cells = [row["callers"], row["transport"], row["streams"], row["segments"], pair("first_p50", "first_p95"),
                 pair("all_p50", "all_p95"), pair("whole_p50", "whole_p95"),
                 f"{_fmt(row['ratio_p50'])}× / {_fmt(row['ratio'])}×",
                 _fmt(row["final_p50"]), _fmt(row["synth_last_p50"]), pair("beyond_p50", "beyond_p95"),
                 pair("behind_p50", "behind_p95"), pair("delivery_p50", "delivery_p95"),
                 pair("beyond_any_p50", "beyond_any_p95"),
                 f"{row.get('made_out_of_order', 0)} of {row.get('made_pairs', 0)}", row["stalls"],
                 row["late_text_gaps"], row["failed"],
                 _cpu(row.get("cpu", {})), _paces(row.get("pace"))]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "Targets: end of a sentence's text → its first audio ≤ 1.2× a whole job's first audio for the same sentence "
        "(p50 and p95); the last audio at most one segment's synthesis after the final piece (per stream: its "
        "synthesis is the time from its submission to the batcher to its waveform, which includes any wait the "
        "deadline scheduler gives it while its listener still has audio to play; the last audio waits for every "
        "segment still being made at the final piece, so the slowest of those is the one segment the target "
        "allows); no stalls at 10 streams, given a pace the engine keeps up with (a stall counts when its text "
        "was complete a whole job's p95 first audio before its listener needed it; gaps whose text came later are "
        "counted beside them). Later "
        "segments of a stream are due only when its listener reaches them, so the deadline scheduler makes them "
        "later on purpose: the first segment is the one a listener waits for.",
        "",
    ]
    return "\n".join(lines)


def _over(part: float | None, whole: float | None) -> float | None:
    return part / whole if part and whole else None


def summarize(callers: int, runs: list[StreamRun], whole: list[float]) -> dict[str, Any]:
    """Return one row of the table."""
    firsts = [r.arrived_at[0] - r.planned_at[0] for r in runs if 0 in r.arrived_at and 0 in r.planned_at]
    every = [s for r in runs for s in r.latencies()]
    finals = [r.arrived_at[max(r.arrived_at)] - r.final_at for r in runs if r.arrived_at]
    synth_last = [r.synth_s.get(max(r.arrived_at), 0.0) for r in runs if r.arrived_at]
    # Per stream: how much later than its own synthesis (its wait for a batch and the engine call) the last
    # audio came after the final piece; what is left is planning, the broker, waiting behind an earlier segment and
    # the delivery.
    beyond = [f - s for f, s in zip(finals, synth_last, strict=True)]
    # ... and of that, from its being made to its bytes in the caller's hands: the time it waited behind an earlier
    # segment still on its way (audio comes in order; a longer one before it, in a longer call, can be made later
    # and still be on time), and its own delivery after that (the write, events, the GET or the frame).
    last = [(r, max(r.arrived_at)) for r in runs if r.arrived_at]
    behind, delivery = [], []
    for r, i in last:
        if i in r.made_at:
            ready = max(r.made_at[i], r.arrived_at.get(i - 1, r.made_at[i]))
            behind.append(ready - r.made_at[i])
            delivery.append(r.arrived_at[i] - ready)
    # ... and beyond the longest synthesis among the segments still being made when the final piece came (the last
    # audio waits for each of them: "one segment's synthesis" is the slowest of those, not always the last one).
    beyond_any = [
        r.arrived_at[max(r.arrived_at)]
        - r.final_at
        - max((r.synth_s.get(i, 0.0) for i, at in r.made_at.items() if at > r.final_at), default=0.0)
        for r in runs
        if r.arrived_at
    ]
    pairs = [(r, i) for r in runs for i in r.made_at if i + 1 in r.made_at]
    out_of_order = sum(1 for r, i in pairs if r.made_at[i + 1] < r.made_at[i])
    first_p95, whole_p95 = percentile(firsts, 95), percentile(whole, 95)
    # A stall is the service's when its text was complete a whole job's p95 first audio before it was needed.
    stalls = sum(r.stalls(whole_p95 or 0.0)[0] for r in runs)
    gaps = sum(r.stalls()[0] for r in runs)
    first_p50, whole_p50 = percentile(firsts, 50), percentile(whole, 50)
    return {
        "callers": callers,
        "streams": len(runs),
        "segments": sum(len(r.arrived_at) for r in runs),
        "first_p50": first_p50,
        "first_p95": first_p95,
        "all_p50": percentile(every, 50),
        "all_p95": percentile(every, 95),
        "whole_p50": whole_p50,
        "whole_p95": whole_p95,
        "ratio": _over(first_p95, whole_p95),
        "ratio_p50": _over(first_p50, whole_p50),
        "final_p50": percentile(finals, 50),
        "synth_last_p50": median(synth_last) if synth_last else None,
        "beyond_p50": percentile(beyond, 50),
        "beyond_p95": percentile(beyond, 95),
        "beyond_any_p50": percentile(beyond_any, 50),
        "beyond_any_p95": percentile(beyond_any, 95),
        "behind_p50": percentile(behind, 50),
        "behind_p95": percentile(behind, 95),
        "delivery_p50": percentile(delivery, 50),
        "delivery_p95": percentile(delivery, 95),
        "made_out_of_order": out_of_order,
        "made_pairs": len(pairs),
        "stalls": stalls,
        "late_text_gaps": gaps - stalls,
        "failed": sum(r.status != "done" for r in runs),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the levels and transports to run (all of them by default, which the README's table is)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent streams per level")
    parser.add_argument(
        "--transports", default=",".join(BY_SHORT_NAME), help=f"which ways in: {', '.join(BY_SHORT_NAME)}"
    )
    args = parser.parse_args(argv)
    args.levels = [int(n) for n in args.levels.split(",")]
    asked = [name.strip() for name in args.transports.split(",")]
    unknown = sorted(set(asked) - set(BY_SHORT_NAME))
    if unknown:
        parser.error(f"unknown transport(s) {unknown}; choose from {', '.join(BY_SHORT_NAME)}")
    args.transports = [BY_SHORT_NAME[name] for name in asked]
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the transports asked at each level and write the table."""
    args = parse_args(argv)
    started = time.perf_counter()
    reference = probe()  # before the stack runs: the machine's pace that each window's is read against
    rows: list[dict[str, Any]] = []
    with running_stack("text-stream") as stack:
        http_stream(stack, _texts()[0], seed=1)  # warm-up, not counted
        for callers in args.levels:
            for transport in args.transports:
                stream = TRANSPORTS[transport]
                stack.wait_idle()
                whole_pace = relative(probe(), reference)
                whole = whole_jobs_at(stack, callers)  # the reference, in the window just before these streams
                stack.wait_idle()
                pace = relative(probe(), reference)
                before = snapshot()
                runs = streams_at(stack, callers, stream)
                cpu = by_role(before, snapshot())  # % of one core; the load generator shares the machine
                rows.append({"transport": transport, **summarize(callers, runs, whole), "cpu": cpu,
                             "pace": (whole_pace, pace)})  # fmt: skip
                print(rows[-1], flush=True)
    write_result("text-stream", table(rows, started))


if __name__ == "__main__":
    main()

"""Goodput: the highest open-loop arrival rate at which no admitted listener stalls (``make bench-goodput``).

``python -m bench.goodput [--rates 0.25,0.5,…] [--window S] [--seeds N] [--schedulers deadline,fifo]``

1. Starts two stacks (Redis, one worker, the API) at the settings users get, differing only in ``TTS_SCHEDULER``.
2. Measures the service's capacity first, on a stack of its own that refuses nothing at the door: the
   characters/s that 50 closed-loop callers complete.
3. At each rate (a multiple of that capacity, in characters offered) and seed, sends Poisson arrivals to each
   stack in turn for the window: corpus texts on the realtime lane and a few long texts (story excerpts) on the
   batch lane. Every job is followed as a listener; a refused one resends the same request once, after its
   Retry-After.
4. Listeners play as the web page does (``bench.fragments.PlayerClient``). Prints, per rate and scheduler:
   offered, admitted and refused jobs, first audio (playback's start) of admitted realtime jobs,
   underruns (a playback gap over 100 ms after the first audio), end to end, audio s/s, and the goodput: the
   highest rate at which admitted realtime jobs have no underrun and p95 first audio ≤ 1.5 s, in every seed.

Settings changed from the defaults: only ``TTS_MAX_STREAMS_PER_CALLER``: every listener here is one caller (no API
keys), where real listeners are many. The admission checks under test run at their defaults.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.fragments import PlayerClient
from bench.headline_cpu import meter_window
from bench.headline_levels import progress, run_level, worker_view
from bench.headline_stack import ServiceStack
from bench.loadgen import Client, JobResult
from bench.openloop import LEAD_S, UNDERRUN_S, Arrival, OpenRun, gaps, run_open_loop, waits
from bench.pace_probe import probe, relative
from bench.report import RESULTS, cell, percentile, write_run
from bench.stack_args import Plan, corpus_texts, resolve_stack_arguments, service_env, settings_line
from bench.texts import STORY
from core.text import split_sentences

SCHEDULERS = ("deadline", "fifo")
RATES = "0.25,0.5,0.75,0.85,1,1.25,1.5"
#: Goodput's gate on first audio (p95 of admitted realtime jobs, seconds).
FIRST_AUDIO_GATE_S = 1.5
#: The capacity's own stack turns the admission checks off: it refuses nothing at the door.
ADMISSION_OFF = {"TTS_ADMISSION_LATENESS_S": "0", "TTS_ADMISSION_FIRST_AUDIO_S": "0"}
#: The share of arrivals that are long texts on the batch lane, and their length (characters).
BATCH_SHARE = 0.02
BATCH_CHARS = 600


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", default="chattts-tiny")
    parser.add_argument("--rates", default=RATES, help="arrival rates as multiples of the measured capacity")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of arrivals per rate")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds a rate's jobs may take after it")
    parser.add_argument("--seeds", type=int, default=1, help="runs per rate and scheduler, each its own arrivals")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--capacity", type=float, default=None,
                        help="characters/s the engines complete, instead of measuring it")  # fmt: skip
    parser.add_argument("--service-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.service_env.append("TTS_MAX_STREAMS_PER_CALLER=5000")  # one caller plays every listener
    args.real_size, args.max_chars, args.device, args.replicas, args.torch_threads = False, None, None, None, None
    return resolve_stack_arguments(args)


def batch_texts() -> list[tuple[str, int]]:
    """Return story excerpts of about BATCH_CHARS characters, whole sentences, with their lengths."""
    sentences = split_sentences(STORY.read_text(encoding="utf-8"))
    excerpts, current = [], ""
    for sentence in sentences:
        current += sentence
        if len(current) >= BATCH_CHARS:
            excerpts.append((current, len(current)))
            current = ""
    return excerpts


def measure_capacity(env: dict[str, str], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Return the closed loop's summary at 50 callers on a stack that refuses nothing at the door (deadline
    scheduling, both admission checks off): the characters/s it completes are the service's capacity.

    In characters, not jobs: the engines' work follows the text's length, a closed loop completes more of the
    short texts than it was given (a long one still running at the window's end is not counted), and the open
    loop adds the batch lane's long texts. Offering a multiple of the closed loop's jobs/s offered about 1.7
    times that multiple in work (measured); a multiple of its characters/s offers what it says.
    """
    plan = Plan(20, 4, 60, "", 0, 0, 0)
    (out / "capacity").mkdir(exist_ok=True)
    stack = ServiceStack({**env, **ADMISSION_OFF}, out / "capacity", api_processes=2)
    try:
        stack.start()
        summary = run_level(PlayerClient(stack.api.url, model=args.model), corpus_texts(args.model), 50, plan,
                            window_s=plan.window_s, seed=7, probe=stack.queued,
                            counters=stack.worker_totals)  # fmt: skip
    finally:
        stack.stop()
        shutil.rmtree(out / "capacity" / "redis", ignore_errors=True)
    progress("capacity", summary)
    return summary


def summarize(run: OpenRun) -> dict[str, Any]:
    """Return one rate's figures: the door, the listeners and the throughput.

    Rates are per second of the arrival window and count every admitted job, however long after the window it
    ended (within the drain); first audio and end to end are from the POST that was admitted.
    """
    window = run.window_end - run.window_start
    realtime = [a for a in run.arrivals if a.lane == "realtime"]
    batch = [a for a in run.arrivals if a.lane == "batch"]
    refusals: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    with_retry_after = 0
    for arrival in run.arrivals:
        for attempt in (arrival.first, arrival.retry):
            if attempt is not None and attempt.refused is not None:
                refusals[str(attempt.refused)] += 1
                checks[attempt.refused_by or "other"] += 1
                with_retry_after += attempt.retry_after is not None
    admitted = [a.admitted for a in realtime if a.admitted is not None]
    played = [r for r in admitted if r.ok]
    first_audio = [r.first_audio - r.submitted for r in played if r.first_audio is not None]
    # A caller who was refused and let in on the retry waited from its first try: Retry-After as well.
    from_first_try = [
        r.first_audio - a.first.submitted
        for a in realtime
        if a.first is not None and (r := a.admitted) is not None and r.ok and r.first_audio is not None
    ]
    job_gaps = [gaps(r) for r in played]
    heard = [any(x > UNDERRUN_S for x in g) for g in job_gaps]  # per played job: did its listener hear a gap
    underran = sum(heard) + len(admitted) - len(played)
    retried = [a for a in run.arrivals if a.retry is not None]
    served = [r for a in run.arrivals if (r := a.admitted) is not None and r.ok]
    batch_done = [r for a in batch if (r := a.admitted) is not None and r.ok]
    offered_chars = sum(a.chars for a in run.arrivals)
    return {
        "rate": run.rate,
        "offered_per_s": len(run.arrivals) / window,
        # The work offered, in characters (what the engines spend their time on): a batch-lane text is many jobs'.
        "offered_chars_per_s": offered_chars / window,
        "batch_chars_share": sum(a.chars for a in batch) / offered_chars if offered_chars else 0.0,
        "offered": len(run.arrivals),
        "realtime_offered": len(realtime),
        "realtime_admitted": len(admitted),
        "refused": dict(refusals),
        "refused_by": dict(checks),
        "refusals_with_retry_after": with_retry_after,
        "retried": len(retried),
        "retried_admitted": sum(1 for a in retried if a.retry is not None and a.retry.refused is None),
        "first_audio_p50": percentile(first_audio, 50),
        "first_audio_p95": percentile(first_audio, 95),
        "first_audio_p99": percentile(first_audio, 99),
        "first_audio_from_first_try_p95": percentile(from_first_try, 95),
        # A job admitted but not played to its end counts as an underrun: its listener stopped hearing it.
        "underrun_share": underran / len(admitted) if admitted else None,
        "gap_p99_s": percentile([sum(g) for g in job_gaps], 99),
        "done_p95": percentile([r.done - r.submitted for r in played if r.done is not None], 95),
        "completed_per_s": len(played) / window,
        "completed_chars_per_s": sum(r.chars for r in played) / window,
        # Every lane's: the capacity is the engines' work, and the batch lane's long texts are a share of it.
        "completed_all_chars_per_s": sum(r.chars for r in served) / window,
        "good_per_s": heard.count(False) / window,
        "audio_s_per_s": sum(sum(d for _, d in r.segments) for r in served) / window,
        "admitted_failed": failures(admitted),
        "batch_offered": len(batch),
        "batch_admitted": sum(1 for a in batch if a.admitted is not None),
        "batch_done_p95": percentile([r.done - r.submitted for r in batch_done if r.done is not None], 95),
        "unfinished": run.unfinished + sum(1 for a in run.arrivals if a.first is None),
        "underran_jobs": [trace(r) for r, gap in zip(played, heard, strict=True) if gap],
        # Admitted listeners whose first audio came after the gate, with the service's own estimate of its start.
        "slow_first_jobs": [trace(r) for r in played if (r.first_audio or 0.0) - r.submitted > FIRST_AUDIO_GATE_S],
        # Every realtime arrival at the door, to see which jobs are refused and whether their retries get in.
        "door": [door(a, run.window_start) for a in realtime],
    }


def door(arrival: Arrival, window_start: float) -> dict[str, Any]:
    """Return what one realtime arrival met at the door: its time in the window, its length, and how each of its
    tries was answered ("admitted", or the check that refused it) with the Retry-After it was given."""

    def answer(attempt: JobResult | None) -> str | None:
        if attempt is None:
            return None
        return "admitted" if attempt.refused is None else attempt.refused_by or str(attempt.refused)

    return {"at_s": round(arrival.at - window_start, 3), "chars": arrival.chars, "first": answer(arrival.first),
            "retry_after_s": arrival.first.retry_after if arrival.first is not None else None,
            "retry": answer(arrival.retry)}  # fmt: skip


def trace(result: JobResult) -> dict[str, Any]:
    """Return what a listener saw (one who underran, or waited past the gate for the first audio), to find its job
    in the worker's log: each segment's arrival and duration (seconds from the first audio) and the wait before it,
    and the service's estimate, when it admitted the job, of its start."""
    start = result.first_audio if result.first_audio is not None else result.submitted
    segments = [
        {"ready_s": round(ready - start, 3), "duration_s": round(duration, 3), "wait_s": round(wait, 3)}
        for (ready, duration), wait in zip(result.segments, waits(result), strict=True)
    ]
    return {"job_id": result.job_id, "chars": result.chars, "first_audio_s": round(start - result.submitted, 3),
            "start_estimate_s": result.start_estimate_s, "segments": segments}  # fmt: skip


def engines(meter: dict[str, Any], window_s: float, replicas: int) -> dict[str, Any]:
    """Return what the engines did during the arrival window, and the machine under them: the share of the
    engines' time in calls (those ending in the window), the audio made, the mean batch, how busy the CPUs
    were, and the share the hypervisor gave other guests (steal).

    A window with many refusals and busy engines is an overload refused at the door; one with idle engines
    refused work they could have done.
    """
    view = worker_view(meter.get("counters", {}), window_s)
    busy = view.get("engine_busy")
    return {
        "busy_share": busy / replicas if busy is not None else None,
        "audio_made_per_s": view.get("audio_made_per_s"),
        "mean_batch_size": view.get("mean_batch_size"),
        "cpu_busy_pct": meter.get("busy_pct"),
        "steal_pct": meter.get("steal_pct"),
    }


def failures(results: list[JobResult]) -> dict[str, int]:
    """Return the admitted jobs that did not finish, by what went wrong."""
    return dict(Counter(r.error or "unfinished" for r in results if not r.ok))


def good(summary: dict[str, Any]) -> bool:
    """Say whether a rate is within goodput: every admitted realtime listener played to the end without an
    underrun, p95 first audio in the gate, and no job left unfinished."""
    p95 = summary["first_audio_p95"]
    whole = summary["underrun_share"] == 0 and not summary.get("unfinished")
    return whole and p95 is not None and p95 <= FIRST_AUDIO_GATE_S


def table(rows: list[dict[str, Any]]) -> str:
    """Return one markdown row per rate, scheduler and seed."""
    lines = [
        "| rate (× capacity) | scheduler | seed | offered/s | offered chars/s (batch lane's share) "
        "| realtime admitted / offered | refused (status: n; by check) "
        "| retried → admitted | p50 / p95 / p99 first audio (s) | p95 first audio from the first try (s) "
        "| admitted with a gap > 100 ms | p99 total gap (s) "
        "| p95 end to end (s) | completed jobs/s (chars/s: realtime / both lanes) | good jobs/s | audio s/s "
        "| batch admitted / offered, p95 done (s) | failed | engines busy in the window (mean batch) | CPU steal "
        "| machine pace |",
        "|" + "---|" * 21,
    ]
    for row in rows:
        s = row["summary"]
        e = s.get("engines") or {}
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(s["refused"].items())) or "0"
        if s.get("refused_by"):
            refused += " (" + ", ".join(f"{k} {v}" for k, v in sorted(s["refused_by"].items())) + ")"
        lines.append(
            f"| {row['multiple']:g} | {row['scheduler']} | {row['seed']} | {s['offered_per_s']:.1f} | "
            f"{s['offered_chars_per_s']:.0f} ({s['batch_chars_share']:.0%}) | "
            f"{s['realtime_admitted']} / {s['realtime_offered']} | {refused} | "
            f"{s['retried_admitted']} / {s['retried']} | {cell(s['first_audio_p50'])} / {cell(s['first_audio_p95'])} / "
            f"{cell(s['first_audio_p99'])} | {cell(s.get('first_audio_from_first_try_p95'))} | "
            f"{cell(s['underrun_share'], '.1%')} | {cell(s['gap_p99_s'])} | "
            f"{cell(s['done_p95'])} | {s['completed_per_s']:.1f} ({s['completed_chars_per_s']:.0f} / "
            f"{s['completed_all_chars_per_s']:.0f}) | {s['good_per_s']:.1f} | {s['audio_s_per_s']:.1f} | "
            f"{s['batch_admitted']} / {s['batch_offered']}, {cell(s['batch_done_p95'], '.1f')} | "
            f"{sum(s['admitted_failed'].values()) + s['unfinished']} | {cell(e.get('busy_share'), '.0%')} "
            f"({cell(e.get('mean_batch_size'), '.1f')}) | {cell(e.get('steal_pct'), '.0f')}% | "
            f"{cell(e.get('machine_pace'))}× |"
        )
    return "\n".join(lines)


def goodput(rows: list[dict[str, Any]], scheduler: str) -> float | None:
    """Return the highest rate (× capacity) that is good in every seed and below which every rate is too."""
    best = None
    for multiple in sorted({r["multiple"] for r in rows}):
        runs = [r for r in rows if r["multiple"] == multiple and r["scheduler"] == scheduler]
        if not runs:
            continue
        if not all(good(r["summary"]) for r in runs):
            break
        best = multiple
    return best


def verdicts(rows: list[dict[str, Any]], capacity: float, schedulers: list[str]) -> list[str]:
    """Return issue 17's targets, per scheduler."""
    out = []
    for name in schedulers:
        share = goodput(rows, name) or 0.0
        out.append(f"- {name}: goodput {share:.2f}× capacity = {share * capacity:.0f} chars/s offered "
                   f"(target ≥ 0.85×): {'met' if share >= 0.85 else 'NOT met'}")  # fmt: skip
        served = max((r["summary"]["good_per_s"] for r in rows if r["scheduler"] == name), default=0.0)
        out.append(f"  - most jobs played to the end without an underrun, at any rate: {served:.1f}/s")
        top = [
            r["summary"] for r in rows if r["scheduler"] == name and r["multiple"] == max(x["multiple"] for x in rows)
        ]
        for s in top:
            refusals = sum(s["refused"].values())
            checks = [
                ("no underrun among admitted realtime jobs", s["underrun_share"] == 0),
                (
                    f"p95 first audio {cell(s['first_audio_p95'])} s ≤ {FIRST_AUDIO_GATE_S:g} s",
                    s["first_audio_p95"] is not None and s["first_audio_p95"] <= FIRST_AUDIO_GATE_S,
                ),
                (
                    f"completed work {s['completed_all_chars_per_s']:.0f} chars/s, both lanes (realtime "
                    f"{s['completed_chars_per_s']:.0f} chars/s, {s['completed_per_s']:.1f} jobs/s) ≥ 0.9× capacity",
                    s["completed_all_chars_per_s"] >= 0.9 * capacity,
                ),
                (
                    f"{s['refusals_with_retry_after']} of {refusals} refusals a 429/503 with Retry-After",
                    s["refusals_with_retry_after"] == refusals,
                ),
            ]
            for text, met in checks:
                out.append(
                    f"  - at {max(x['multiple'] for x in rows):g}× capacity: {text}: {'met' if met else 'NOT met'}"
                )
    return out


def offered_chars_per_arrival(texts: dict[str, list[tuple[str, int]]]) -> float:
    """Return the mean characters an arrival brings: a corpus text, or now and then a batch-lane excerpt."""
    mean = {lane: sum(n for _, n in found) / len(found) for lane, found in texts.items()}
    return (1 - BATCH_SHARE) * mean["realtime"] + BATCH_SHARE * mean["batch"]


def drive(
    stacks: dict[str, ServiceStack], args: argparse.Namespace, capacity: float, *, reference: float | None = None
) -> list[dict[str, Any]]:
    """Run every rate and seed against each stack, alternating which goes first; before each window, with every
    stack idle, probe the machine's pace (relative to ``reference``, the run's first probe)."""
    realtime = corpus_texts(args.model)
    texts = {"realtime": realtime, "batch": batch_texts()}
    per_arrival = offered_chars_per_arrival(texts)
    rows: list[dict[str, Any]] = []
    multiples = [float(x) for x in args.rates.split(",")]
    for n, multiple in enumerate(multiples):
        for seed in range(args.seeds):
            order = list(stacks) if (n + seed) % 2 == 0 else list(stacks)[::-1]
            for name in order:
                for stack in stacks.values():
                    stack.wait_idle()
                pace = relative(probe(), reference)
                url = stacks[name].api.url
                clients: dict[str, Client] = {
                    lane: PlayerClient(url, model=args.model, retry=False, priority=lane, timeout_s=120)
                    for lane in ("realtime", "batch")
                }
                start = time.monotonic() + LEAD_S  # when run_open_loop starts its window
                metering = meter_window(start, start + args.window, counters=stacks[name].worker_totals)
                run = run_open_loop(clients, texts, rate=multiple * capacity / per_arrival, window_s=args.window,
                                    drain_s=args.drain, seed=100 * n + seed, batch_share=BATCH_SHARE)  # fmt: skip
                summary = summarize(run)
                summary["engines"] = {**engines(metering.result(), args.window, args.replicas), "machine_pace": pace}
                rows.append({"multiple": multiple, "scheduler": name, "seed": seed, "summary": summary})
                print(f"  {multiple:g}× {name} seed {seed}: offered {summary['offered_per_s']:.1f}/s, admitted "
                      f"{summary['realtime_admitted']}/{summary['realtime_offered']}, p95 first audio "
                      f"{cell(summary['first_audio_p95'])} s, underruns {cell(summary['underrun_share'], '.1%')}, "
                      f"completed {summary['completed_per_s']:.1f}/s, engines busy "
                      f"{cell(summary['engines']['busy_share'], '.0%')}, steal "
                      f"{cell(summary['engines']['steal_pct'], '.0f')}%, machine pace {cell(pace)}×",
                      flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    """Start the stacks, measure the capacity, run every rate, print and write the table."""
    args = parse_args(argv)
    out = args.out / f"goodput-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    env = service_env(args, out)
    schedulers = args.schedulers.split(",")
    load = os.getloadavg()[0]
    print(f"goodput benchmark: {args.model}, {os.cpu_count()} CPUs, load {load:.2f}, rates {args.rates}× capacity, "
          f"{args.window:g}s each, {args.seeds} seed(s); results in {out}", flush=True)  # fmt: skip
    started = time.monotonic()
    reference = probe()  # before any stack runs: the machine's pace that every window's is read against
    closed = None
    if args.capacity:
        capacity = args.capacity
    else:
        closed = measure_capacity(env, out, args)
        capacity = closed["chars_per_s"]
    if capacity <= 0:
        sys.exit(f"the capacity run completed no job; see {out}/capacity")
    stacks = {}
    for name in schedulers:
        (out / name).mkdir(exist_ok=True)
        stacks[name] = ServiceStack({**env, "TTS_SCHEDULER": name}, out / name, api_processes=2)
    try:
        for stack in stacks.values():
            stack.start()
        rows = drive(stacks, args, capacity, reference=reference)
    finally:
        for stack in stacks.values():
            stack.stop()
        for name in schedulers:
            shutil.rmtree(out / name / "redis", ignore_errors=True)
    text = document(args, capacity, rows, schedulers, closed=closed,
                    footer=f"Whole run: {time.monotonic() - started:.0f}s. Files: {out}")  # fmt: skip
    write_run(out, "goodput", text, {"capacity": capacity, "closed_loop": closed, "rows": rows,
                                     "pace_probe_reference": reference})  # fmt: skip
    print()
    print(text)
    return 0


def document(args: argparse.Namespace, capacity: float, rows: list[dict[str, Any]], schedulers: list[str],
             *, footer: str, closed: dict[str, Any] | None = None) -> str:  # fmt: skip
    """Return the markdown: what ran, the table, the goodput and targets, and ``footer``."""
    return "\n".join(
        [
            f"## Goodput: {args.model}, {os.cpu_count()} CPUs, {args.replicas} model host(s), open-loop Poisson "
            f"arrivals, {args.window:g}s per rate, {args.seeds} seed(s), {time.strftime('%Y-%m-%d %H:%M')}",
            "",
            f"Capacity (characters/s completed by 50 closed-loop callers on realtime corpus texts, deadline "
            f"scheduling, nothing refused at the door): {capacity:.0f} chars/s"
            + (f" ({closed['jobs_per_s']:.1f} jobs/s)" if closed else "")
            + ". A rate is a multiple of it in characters offered, the batch lane's long texts included (an arrival "
            "brings their mean); its jobs/s are in the offered column. Per-second figures count every admitted "
            "realtime job of the window, "
            "finished within the drain; first audio and end to end run from the admitted POST; good jobs/s are "
            "those played to the end without an underrun. "
            f"Arrivals: corpus texts on the realtime lane, {BATCH_SHARE:.0%} story excerpts of about {BATCH_CHARS} "
            "characters on the batch lane; a refused job resends the same request once, after its Retry-After. "
            f"Service: {settings_line(args)} (one caller plays every listener). "
            "Listeners play as the web page does: the job's fragments, starting once two are in hand (or one "
            "that ends its segment). An underrun is a playback gap over 100 ms after the first audio; first audio "
            "is when playback starts, from the POST that was admitted, and for a refused caller let in on its "
            "retry also from its first try, Retry-After included. Engines busy: the share of "
            "the model hosts' time spent in engine calls during the arrival window (low while refusing means the "
            "door turned away work the engines could have done); CPU steal: the machine's time the hypervisor gave "
            "other guests in that window; machine pace: how fast a fixed single-thread workload of small tensor "
            "operations ran just before the window, with the stacks idle, as a multiple of its pace before the "
            "capacity run (a shared machine slows without showing steal; bench/pace_probe.py).",
            "",
            table(rows),
            "",
            *verdicts(rows, capacity, schedulers),
            "",
            footer,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())

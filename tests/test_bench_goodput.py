"""The goodput benchmark's arithmetic: Poisson arrivals, playback gaps, and which rates count as good."""

from __future__ import annotations

import itertools
import random
import statistics
from typing import Any

import pytest

from bench.goodput import door, engines, goodput, summarize, table, trace
from bench.http_clients import refusing_check
from bench.loadgen import JobResult
from bench.openloop import Arrival, OpenRun, arrival_times, gaps, lanes, run_open_loop


def test_poisson_arrivals_come_at_exactly_the_asked_rate_with_exponential_gaps() -> None:
    times = arrival_times(20.0, 500.0, random.Random(1))
    assert len(times) == 10_000, "every window offers the rate asked"
    intervals = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(intervals) == pytest.approx(0.05, rel=0.05)
    assert statistics.stdev(intervals) == pytest.approx(0.05, rel=0.1), "exponential: the spread equals the mean"
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 500.0


def test_a_gap_is_a_wait_for_a_segment_after_playback_began_and_none_when_segments_come_in_time() -> None:
    on_time = JobResult(chars=10, submitted=0.0, first_audio=1.0, segments=[(1.0, 2.0), (2.5, 2.0), (4.9, 1.0)])
    assert gaps(on_time) == []
    late = JobResult(chars=10, submitted=0.0, first_audio=1.0, segments=[(1.0, 2.0), (3.25, 1.0), (4.25, 1.0)])
    assert gaps(late) == [0.25], "the second arrives 0.25 s after the first ends; the third is then on time"
    assert gaps(JobResult(chars=1, submitted=0.0)) == []


def test_a_listener_who_underran_is_traced_by_job_with_each_segments_arrival_and_the_wait_before_it() -> None:
    late = JobResult(chars=10, submitted=0.0, first_audio=1.0, segments=[(1.0, 2.0), (3.25, 1.0), (4.25, 1.0)])
    late.job_id = "j1"
    run = OpenRun(rate=1.0, window_start=0.0, window_end=10.0)
    run.arrivals = [Arrival(0.0, "realtime", 10, first=late)]
    late.done = 5.0
    traced = summarize(run)["underran_jobs"]
    assert traced == [trace(late)]
    assert traced[0]["job_id"] == "j1" and traced[0]["first_audio_s"] == 1.0
    assert [s["wait_s"] for s in traced[0]["segments"]] == [0.0, 0.25, 0.0], "the waits gaps() finds"
    assert [s["ready_s"] for s in traced[0]["segments"]] == [0.0, 2.25, 3.25]


def _row(multiple: float, rate: float, *, underruns: float, p95: float, scheduler: str = "deadline") -> dict[str, Any]:
    summary = {"rate": rate, "underrun_share": underruns, "first_audio_p95": p95}
    return {"multiple": multiple, "scheduler": scheduler, "seed": 0, "summary": summary}


def test_goodput_is_the_highest_rate_below_which_every_rate_has_no_underrun_and_first_audio_in_the_gate() -> None:
    rows = [
        _row(0.5, 10.0, underruns=0.0, p95=0.3),
        _row(1.0, 20.0, underruns=0.0, p95=1.2),
        _row(1.25, 25.0, underruns=0.01, p95=1.0),  # one listener stalled: not good
        _row(1.5, 30.0, underruns=0.0, p95=1.4),  # good again, but above a bad rate: does not count
    ]
    assert goodput(rows, "deadline") == 1.0
    assert goodput([*rows, _row(0.25, 5.0, underruns=0.0, p95=1.6)], "deadline") is None, "first audio too late"
    assert goodput(rows, "fifo") is None


def test_the_work_offered_is_counted_in_characters_with_the_batch_lanes_share() -> None:
    run = OpenRun(rate=2.0, window_start=0.0, window_end=10.0)
    run.arrivals = [Arrival(1.0, "realtime", 40), Arrival(2.0, "realtime", 40), Arrival(3.0, "batch", 600)]
    summary = summarize(run)
    assert summary["offered_per_s"] == pytest.approx(0.3), "three jobs in ten seconds"
    assert summary["offered_chars_per_s"] == pytest.approx(68.0), "one long text is most of the work"
    assert summary["batch_chars_share"] == pytest.approx(600 / 680)


def test_completed_work_counts_both_lanes_since_the_capacity_is_all_the_engines_work() -> None:
    run = OpenRun(rate=2.0, window_start=0.0, window_end=10.0)
    done = [JobResult(chars=n, submitted=0.0, first_audio=1.0, done=2.0, segments=[(1.0, 1.0)]) for n in (40, 600)]
    run.arrivals = [Arrival(1.0, "realtime", 40, first=done[0]), Arrival(3.0, "batch", 600, first=done[1])]
    summary = summarize(run)
    assert summary["completed_chars_per_s"] == pytest.approx(4.0), "realtime alone"
    assert summary["completed_all_chars_per_s"] == pytest.approx(64.0)


def test_the_batch_lanes_arrivals_are_spread_evenly_so_every_window_carries_its_share() -> None:
    for seed in range(20):
        chosen = lanes(200, 0.02, random.Random(seed))
        at = [n for n, lane in enumerate(chosen) if lane == "batch"]
        assert len(at) == 4 and all(b - a == 50 for a, b in itertools.pairwise(at)), f"seed {seed}: {at}"
    assert lanes(10, 0.0, random.Random(0)) == ["realtime"] * 10


def test_refusals_are_counted_by_the_admission_check_that_made_them() -> None:
    first_audio = b'{"error": {"code": "unavailable", "estimated_first_audio_s": 1.8}}'
    deadlines = b'{"error": {"code": "unavailable", "estimated_excess_s": 0.4}}'
    assert refusing_check(first_audio) == "first audio" and refusing_check(deadlines) == "deadlines"
    assert refusing_check(b"<html>busy</html>") is None and refusing_check(b"[]") is None
    run = OpenRun(rate=1.0, window_start=0.0, window_end=10.0)
    refused = [JobResult(chars=5, submitted=0.0, refused=503, retry_after=2.0, refused_by=by)
               for by in ("first audio", "first audio", "deadlines", None)]  # fmt: skip
    run.arrivals = [Arrival(0.0, "realtime", 5, first=r) for r in refused]
    summary = summarize(run)
    assert summary["refused"] == {"503": 4}
    assert summary["refused_by"] == {"first audio": 2, "deadlines": 1, "other": 1}


def test_a_windows_engine_figures_give_the_busy_share_of_all_replicas_and_the_machines_steal() -> None:
    meter = {
        "counters": {
            "tts_synthesis_seconds_sum": 30.0,
            "tts_batch_size_sum": 60.0,
            "tts_batch_size_count": 20.0,
            "tts_audio_seconds_total": 400.0,
        },
        "busy_pct": 99.0,
        "steal_pct": 12.5,
    }
    found = engines(meter, window_s=20.0, replicas=2)
    assert found["busy_share"] == 0.75, "30 s of calls in 20 s on 2 replicas"
    assert found["mean_batch_size"] == 3.0 and found["audio_made_per_s"] == 20.0
    assert found["steal_pct"] == 12.5
    assert engines({}, window_s=20.0, replicas=2)["busy_share"] is None, "a failed scrape says nothing, not 0"


def test_a_caller_let_in_on_its_retry_has_its_first_audio_counted_from_its_first_try_as_well() -> None:
    refused = JobResult(chars=10, submitted=0.0, refused=503, retry_after=2.0)
    retry = JobResult(chars=10, submitted=2.0, first_audio=2.5, segments=[(2.5, 1.0)], done=2.6)
    run = OpenRun(rate=1.0, window_start=0.0, window_end=10.0)
    run.arrivals = [Arrival(0.0, "realtime", 10, first=refused, retry=retry)]
    summary = summarize(run)
    assert summary["first_audio_p95"] == pytest.approx(0.5), "from the POST that was admitted"
    assert summary["first_audio_from_first_try_p95"] == pytest.approx(2.5), "the caller waited Retry-After too"


def test_each_windows_row_gives_the_machines_pace_against_the_probe_before_the_capacity_run() -> None:
    played = JobResult(chars=10, submitted=0.0, first_audio=0.4, segments=[(0.4, 1.0)], done=0.5)
    run = OpenRun(rate=1.0, window_start=0.0, window_end=10.0)
    run.arrivals = [Arrival(0.0, "realtime", 10, first=played)]
    summary = summarize(run)
    summary["engines"] = {"busy_share": 0.9, "mean_batch_size": 4.0, "steal_pct": 0.0, "machine_pace": 0.62}
    header, rule, row = table([{"multiple": 1.0, "scheduler": "deadline", "seed": 0, "summary": summary}]).split("\n")
    assert header.endswith("| machine pace |")
    assert row.endswith("| 0.62× |"), "a window on a machine running at 62% of its pace at the start says so"
    assert header.count("|") == rule.count("|") == row.count("|")


def test_the_door_record_gives_each_realtime_arrivals_length_answers_and_retry_after() -> None:
    refused = JobResult(chars=40, submitted=11.0, refused=503, retry_after=2.0, refused_by="deadlines")
    let_in = JobResult(chars=40, submitted=13.0, done=14.0, first_audio=13.5)
    arrival = Arrival(at=11.0, lane="realtime", chars=40, first=refused, retry=let_in)
    assert door(arrival, window_start=10.0) == {
        "at_s": 1.0, "chars": 40, "first": "deadlines", "retry_after_s": 2.0, "retry": "admitted"
    }  # fmt: skip
    run = OpenRun(rate=1.0, window_start=10.0, window_end=20.0, arrivals=[arrival, Arrival(12.0, "batch", 900)])
    assert [d["chars"] for d in summarize(run)["door"]] == [40], "realtime jobs only"


class _DoorOnce:
    """A stand-in for the HTTP client at the load generator's boundary: refuses each request's first send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None]] = []

    def run_job(self, text: str, chars: int, seed: int | None = None) -> JobResult:
        self.sent.append((text, seed))
        if self.sent.count((text, seed)) == 1:
            return JobResult(chars=chars, submitted=0.0, refused=503, retry_after=0.01, refused_by="deadlines")
        return JobResult(chars=chars, submitted=0.0, first_audio=0.1, segments=[(0.1, 1.0)], done=0.2)

    def abandon_all(self) -> None:
        """Nothing is in flight."""


def test_a_refused_arrival_resends_the_same_request_after_its_retry_after_so_the_service_knows_it_for_a_retry() -> None:
    client = _DoorOnce()
    run = run_open_loop({"realtime": client, "batch": client}, {"realtime": [("Hello there.", 12)], "batch": []},
                        rate=50.0, window_s=0.2, drain_s=5.0, seed=3, batch_share=0.0)  # fmt: skip
    assert run.arrivals and all(a.retry is not None and a.retry.refused is None for a in run.arrivals)
    assert len(set(client.sent)) == len(run.arrivals), "each arrival its own request"
    assert all(client.sent.count(sent) == 2 for sent in client.sent), "each sent twice, unchanged"

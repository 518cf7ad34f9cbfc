"""The text-stream benchmark's command line (which levels and ways in it runs) and its table."""

from __future__ import annotations

import pytest

from bench.report import percentile
from bench.text_stream import TRANSPORTS, StreamRun, parse_args, summarize, table


def test_by_default_every_level_and_way_in_runs_as_in_the_readme_table() -> None:
    args = parse_args([])
    assert args.levels == [1, 10] and args.transports == list(TRANSPORTS)


def test_levels_and_ways_in_can_be_narrowed_by_their_short_names() -> None:
    args = parse_args(["--levels", "10", "--transports", "pieces,websocket"])
    assert args.levels == [10] and args.transports == ["HTTP pieces", "WebSocket"]


def test_help_and_an_unknown_way_in_exit_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as shown:
        parse_args(["--help"])
    assert shown.value.code == 0 and "--transports" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        parse_args(["--transports", "pieces,carrier-pigeon"])
    assert refused.value.code == 2 and "carrier-pigeon" in capsys.readouterr().err


def test_each_row_gives_the_machines_pace_before_the_whole_jobs_and_before_its_own_streams() -> None:
    row = {"transport": "WebSocket", **summarize(10, [], []), "cpu": {}, "pace": (0.95, 0.62)}
    lines = table([row], started=0.0).split("\n")
    header, rule, line = (next(n for n in lines if n.startswith(p)) for p in ("| streams", "|---", "| 10 |"))
    assert line.endswith("| 0.95× / 0.62× |"), "a ratio between windows a third apart in speed says so"
    assert header.count("|") == rule.count("|") == line.count("|")


def test_a_row_gives_the_first_segments_p50_and_p95_each_against_the_whole_jobs_run_just_before() -> None:
    run = StreamRun(planned_at={0: 0.0}, arrived_at={0: 0.6})
    row = summarize(10, [run] * 20, [0.5] * 19 + [2.0])
    whole_p95 = percentile([0.5] * 19 + [2.0], 95)
    assert whole_p95 is not None
    assert row["ratio_p50"] == pytest.approx(0.6 / 0.5) and row["ratio"] == pytest.approx(0.6 / whole_p95)
    line = next(
        n
        for n in table([{"transport": "WebSocket", **row, "cpu": {}}], started=0.0).split("\n")
        if n.startswith("| 10 |")
    )
    assert f"| {row['ratio_p50']:.2f}× / {row['ratio']:.2f}× |" in line


def test_the_last_segments_time_after_it_was_made_is_split_into_waiting_behind_an_earlier_one_and_its_delivery() -> (
    None
):
    # Segment 1 was made at 2.75 but segment 0, a longer one in a longer call, only reached the caller at 2.9:
    # audio comes in order, so 1 waited 0.15 s behind it, then took 0.1 s itself.
    # Segment 0 took 0.9 s to make and was still being made at the final piece: the last audio, 1.0 s after the
    # final piece, is 0.1 s beyond that slowest synthesis the last audio had to wait for.
    run = StreamRun(planned_at={0: 0.0}, arrived_at={0: 2.9, 1: 3.0}, final_at=2.0, synth_s={0: 0.9, 1: 0.5})
    run.made_at = {0: 2.8, 1: 2.75}
    row = summarize(1, [run], [0.5])
    assert row["beyond_p50"] == pytest.approx(0.5) and row["beyond_any_p50"] == pytest.approx(0.1)
    assert row["behind_p50"] == pytest.approx(0.15) and row["delivery_p50"] == pytest.approx(0.1)
    assert (row["made_out_of_order"], row["made_pairs"]) == (1, 1)
    line = next(
        n
        for n in table([{"transport": "WebSocket", **row, "cpu": {}}], started=0.0).split("\n")
        if n.startswith("| 1 |")
    )
    assert "| 0.50 / 0.50 | 0.15 / 0.15 | 0.10 / 0.10 | 0.10 / 0.10 | 1 of 1 |" in line


def test_a_last_segment_made_after_the_one_before_arrived_waits_behind_nothing() -> None:
    run = StreamRun(planned_at={0: 0.0}, arrived_at={0: 1.0, 1: 3.0}, final_at=2.0, synth_s={1: 0.5})
    run.made_at = {0: 0.9, 1: 2.75}
    row = summarize(1, [run], [0.5])
    assert row["behind_p50"] == 0.0 and row["delivery_p50"] == pytest.approx(0.25) and row["made_out_of_order"] == 0


def test_a_last_audio_with_nothing_left_to_make_at_the_final_piece_is_measured_beyond_no_synthesis() -> None:
    run = StreamRun(planned_at={0: 0.0}, arrived_at={0: 1.0, 1: 2.1}, final_at=2.0, synth_s={0: 0.4, 1: 0.5})
    run.made_at = {0: 0.9, 1: 1.95}
    assert summarize(1, [run], [0.5])["beyond_any_p50"] == pytest.approx(0.1)


def test_a_gap_counts_as_a_stall_only_when_its_text_came_a_whole_jobs_p95_first_audio_before_it_was_needed() -> None:
    # Segment 0 plays 1.0 s from 1.0, so segment 1 is needed at 2.0 and arrives at 2.5 (a gap of 0.5 s). Its text was
    # complete at 1.7 in one stream (0.3 s before it was needed, less than the 0.5 s a whole job takes: the writer's
    # pace) and at 1.2 in the other (0.8 s before: the service's stall).
    late = StreamRun(planned_at={0: 0.0, 1: 1.7}, arrived_at={0: 1.0, 1: 2.5}, durations={0: 1.0})
    early = StreamRun(planned_at={0: 0.0, 1: 1.2}, arrived_at={0: 1.0, 1: 2.5}, durations={0: 1.0})
    assert late.stalls() == (1, pytest.approx(0.5)) and late.stalls(0.5) == (0, 0.0)
    assert early.stalls(0.5) == (1, pytest.approx(0.5))
    row = summarize(10, [late, early], [0.5] * 20)
    assert (row["stalls"], row["late_text_gaps"]) == (1, 1)

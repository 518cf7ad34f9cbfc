"""The headline benchmark's arithmetic: engines measured side by side, and the batch size the service gets."""

from __future__ import annotations

from typing import Any

from bench.headline_engine import combine_engines
from bench.headline_levels import mix_view
from bench.headline_report import _errors, engine_table, level_table, reference_note, targets


def _engine(rates: dict[int, float]) -> dict[str, Any]:
    rows = [
        {"batch": b, "chars_per_s": r, "segments_per_s": r / 20, "audio_s_per_s": r / 8, "segments": 10, "seconds": 1.0}
        for b, r in rates.items()
    ]
    return {"model": "m", "rows": rows}


def test_engines_side_by_side_add_up_batch_size_by_batch_size() -> None:
    combined = combine_engines([_engine({1: 50, 8: 150, 16: 155}), _engine({1: 48, 8: 160, 16: 150})])
    assert combined["replicas"] == 2
    assert [r["chars_per_s"] for r in combined["rows"]] == [98, 310, 305]
    assert combined["best_batch"] == 8 and combined["best_chars_per_s"] == 310


def test_the_service_gets_the_largest_batch_within_a_tenth_of_the_engines_best() -> None:
    assert combine_engines([_engine({1: 50, 8: 150, 16: 155, 32: 140})])["service_batch"] == 32
    assert combine_engines([_engine({1: 50, 8: 150, 16: 155, 32: 139})])["service_batch"] == 16
    assert combine_engines([_engine({1: 50, 8: 160, 16: 130})])["service_batch"] == 8


def test_the_efficiency_line_splits_into_the_hosts_cpu_share_and_their_audio_per_cpu_second() -> None:
    engine = combine_engines([_engine({1: 50, 8: 160}), _engine({1: 50, 8: 160})])  # 40 audio s/s at batch 8
    after = {"chars_per_s": 240.0, "audio_made_per_s": 30.0, "cpu_roles": {"model hosts": 150.0, "api": 20.0}}
    table = engine_table(engine, [{"callers": 50, "after": after}])
    assert "engine efficiency 0.75" in table
    assert "30.0 of 40.0 s/s = 0.75" in table
    # 30 s/s from 1.5 cores against 20 s/s per core: exactly the limit's audio per CPU second.
    assert "got 150% of a core of the 200%" in table and "made 1.00× the limit's audio per CPU second" in table


def test_jobs_per_second_at_the_corpus_mix_does_not_reward_a_side_that_drew_short_texts() -> None:
    texts = [("a" * 20, 20), ("b" * 60, 60)]  # a mean of 40 characters a text
    short: dict[str, Any] = {
        "jobs_per_s": 2.0,
        "chars_per_s": 50.0,
        "errors": {},
        "admissions": 0,
    }  # its finished jobs were 25 characters long on average
    long: dict[str, Any] = {"jobs_per_s": 1.0, "chars_per_s": 55.0, "errors": {}, "admissions": 0}
    short.update(mix_view(short, texts))
    long.update(mix_view(long, texts))
    assert short["mean_chars_done"] == 25.0 and long["mean_chars_done"] == 55.0
    assert short["jobs_per_s_at_mix"] == 1.25 and long["jobs_per_s_at_mix"] == 1.375
    table = level_table([{"callers": 50, "after": long, "before": short}])
    row = next(line for line in table.splitlines() if line.startswith("| jobs/s at the corpus's mean length"))
    assert row.endswith("| 1.38 | 1.25 | 1.10× |"), row


def _level50(jobs_per_s: float, stall_share: float) -> dict[str, Any]:
    return {"callers": 50, "after": {"jobs_per_s": jobs_per_s, "stall_share": stall_share, "errors": {}}}


def test_the_defaults_are_held_to_the_hand_tuned_reference_in_jobs_and_in_gaps() -> None:
    reference = {"callers": 50, "jobs_per_s": 10.0, "changes": {"TTS_ADMISSION_LATENESS_S": "0"}}
    met = targets([_level50(9.6, 0.01)], None, reference)
    assert met[0] == ("50 callers: jobs/s ≥ 0.95× the hand-tuned reference", "0.96× vs ≥ 0.95×", True)
    assert met[1] == ("50 callers: listeners with a gap ≤ 2%", "1.0% vs ≤ 2.0%", True)
    short = targets([_level50(9.4, 0.03)], None, reference)
    assert [row[2] for row in short[:2]] == [False, False]


def test_without_a_reference_run_no_reference_target_is_claimed() -> None:
    assert not any("reference" in name for name, _, _ in targets([_level50(9.6, 0.0)], None, None))


def test_the_reference_line_says_what_it_changed_and_how_the_defaults_compare() -> None:
    reference = {"callers": 50, "jobs_per_s": 10.0, "first_audio_p50": 0.5, "first_audio_p99": 1.5,
                 "stall_share": 0.002, "changes": {"TTS_MODEL_REPLICAS": "2", "TTS_TORCH_THREADS": "1"}}  # fmt: skip
    line = reference_note({"jobs_per_s": 9.0, "stall_share": 0.0}, reference)[1]
    assert "TTS_MODEL_REPLICAS=2, TTS_TORCH_THREADS=1" in line
    assert "10.00 jobs/s" in line and "at the defaults: 9.00 jobs/s (0.90×)" in line


def test_the_refusals_a_level_waited_out_are_shown_by_check() -> None:
    summary = {"errors": {}, "admissions": 7, "refused_by": {"deadlines": 5, "first audio": 2}}
    assert _errors(summary) == "0 (+7 admission; retried over the level: deadlines 5, first audio 2)"

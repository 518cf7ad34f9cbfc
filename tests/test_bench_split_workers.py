"""The split-workers benchmark: the same model hosts in one worker or over two, and its verdict on stalls."""

from __future__ import annotations

from typing import Any

from bench.headline_levels import engine_view
from bench.split_workers import parse_args, stack_env, table, verdicts
from cache.stats import Window


def _summary(stall_share: float | None) -> dict[str, Any]:
    return {"jobs_per_s": 5.0, "first_audio_p50": 0.5, "first_audio_p99": 1.5, "stall_share": stall_share,
            "stall_p99_s": 0.8, "errors": {}, "jobs_measured": 200, "mean_batch_size": 5.62,
            "chars_per_busy_s": 151.4}  # fmt: skip


def test_both_layouts_run_two_model_hosts_one_worker_with_both_or_two_workers_with_one_each() -> None:
    args = parse_args(["--duration", "5"])
    assert stack_env({"X": "1"}, "one") == {"X": "1", "TTS_MODEL_REPLICAS": "2"}
    assert stack_env({"X": "1"}, "split") == {"X": "1", "TTS_MODEL_REPLICAS": "1"}
    assert "TTS_BATCH_MAX_SIZE=8" in args.service_env and args.device == "cpu"


def test_split_workers_meet_the_verdict_only_when_at_most_one_job_in_a_hundred_stalls_at_ten_callers() -> None:
    level = {"callers": 10, "one": _summary(0.0), "split": _summary(0.01)}
    assert verdicts([level]) == ["- 10 callers, jobs without a stall on 2 workers: 99.0% (target ≥ 99%): met"]
    level["split"] = _summary(0.07)
    assert verdicts([level])[0].endswith("93.0% (target ≥ 99%): NOT met")
    assert verdicts([{"callers": 20, "one": _summary(0.0), "split": _summary(0.5)}]) == [], "no verdict without 10"
    rows = table([level]).splitlines()[2:]
    assert rows[0].startswith("| 10 | one worker × 2 | 5.00 | 0.50 / 1.50 | 0.0% | 0.80 | 5.6 | 151 | 0 | 200 |")
    assert rows[1].startswith("| 10 | 2 workers × 1 | 5.00 | 0.50 / 1.50 | 7.0% |")


def test_the_engine_view_of_a_window_gives_its_mean_batch_busy_share_and_speed_while_busy() -> None:
    view = engine_view(Window(chars=3000.0, busy_s=45.0, segments=120.0, calls=20.0), 30.0)
    assert view == {"mean_batch_size": 6.0, "engine_busy": 1.5, "chars_per_busy_s": 3000.0 / 45.0}
    assert engine_view(Window(), 30.0) == {"mean_batch_size": None, "engine_busy": 0.0, "chars_per_busy_s": None}

"""The job store bench: its ceiling is INFO's arithmetic, its stand-in cuts audio as ChatTTS does, and it runs."""

from __future__ import annotations

import inspect

import numpy as np
import numpy.typing as npt
import pytest
import torch

from bench.engine_limit import read_corpus
from bench.store import Setup, Timing, Work, run_row
from bench.store_engine import (
    DECODE_SHORTFALL,
    FIRST_LOOKAHEAD,
    LOOKAHEAD,
    SAMPLE_RATE,
    SAMPLES_PER_TOKEN,
    fragment_tokens,
)
from bench.store_figures import COUNTS, Reading, Window, command_costs, gpu_rates, kept_bytes
from bench.store_table import table_line
from core.fragments import NO_FRAGMENTS, FragmentSchedule
from devstack.redis_server import RedisServer
from workers.engines import fragments as chattts_fragments
from workers.engines.chattts import ChatTTSEngine

#: The fragment window ChatTTSEngine decodes with unless models.json says otherwise: its constructor's defaults.
ENGINE = {name: p.default for name, p in inspect.signature(ChatTTSEngine).parameters.items()}


def _info(cpu_s: float, memory: int, net_in: int, net_out: int, commands: int) -> dict[str, float]:
    return {
        "used_cpu_sys_main_thread": cpu_s / 4,
        "used_cpu_user_main_thread": 3 * cpu_s / 4,
        "used_memory": memory,
        "total_net_input_bytes": net_in,
        "total_net_output_bytes": net_out,
        "total_commands_processed": commands,
    }


def _counts(segments: float, audio_s: float) -> list[float]:
    return [{"segments": segments, "audio_s": audio_s}.get(name, 0.0) for name in COUNTS]


def test_the_ceiling_is_the_audio_one_full_core_of_redis_takes_at_the_windows_cost() -> None:
    before = Reading.of(_info(10.0, 1_000, 0, 0, 0), _counts(0, 0), at=100.0)
    after = Reading.of(_info(12.0, 3_001_000, 9_000_000, 3_000_000, 40_000), _counts(200, 800), at=110.0)
    window = Window.between(before, after)
    assert window.seconds == 10.0 and window.cpu_s == pytest.approx(2.0)
    assert (window.segments_per_s, window.audio_per_s) == (20.0, 80.0)
    assert window.cpu_share == pytest.approx(0.2), "2 s of the main thread in 10 s: a fifth of one core"
    assert window.per_audio_s(1000 * window.cpu_s) == pytest.approx(2.5), "ms of Redis CPU per audio second"
    assert window.ceiling_audio_per_s == pytest.approx(400.0), "80 audio s/s at a fifth of a core: 400 at a whole"
    assert window.ceiling_segments_per_s == pytest.approx(100.0)
    assert window.per_segment(window.commands) == 200.0
    assert (window.per_audio_s(window.net_in), window.per_audio_s(window.used_memory)) == (11_250.0, 3_750.0)


def test_a_window_that_wrote_no_audio_or_cost_no_cpu_implies_no_ceiling() -> None:
    still = Reading.of(_info(1.0, 0, 0, 0, 0), _counts(0, 0), at=0.0)
    assert Window.between(still, Reading.of(_info(1.5, 0, 0, 0, 0), _counts(0, 0), at=1.0)).ceiling_audio_per_s is None
    assert Window.between(still, Reading.of(_info(1.0, 0, 0, 0, 0), _counts(5, 20), at=1.0)).ceiling_audio_per_s is None


def test_keeping_an_hour_of_audio_takes_the_rate_times_the_hour_times_the_bytes_per_audio_second() -> None:
    assert kept_bytes(100.0, 30_000.0, 3600.0) == 100 * 3600 * 30_000


def test_the_gpu_rates_are_read_from_the_published_engine_table() -> None:
    markdown = "\n".join([
        "*Latest run: 2026-12-04 UTC.*", "",
        "| precision (Llama ran in) | batch | seconds | tokens/s | audio s/s | RTF | × batch 1 |",
        "|---|---|---|---|---|---|---|",
        "| fp16 (float16) | 16 | 6.17 | 519 | 11.1 | 1.45 | 9.8× |",
        "| fp16 (float16) | 64 | 4.24 | 3,019 | 1,064.4 | 0.99 | 57× |", "",
        "| other | table |", "|---|---|", "| 1 | 2 |",
    ])  # fmt: skip
    rates = [(r.precision, r.batch, r.audio_per_s) for r in gpu_rates(markdown)]
    assert rates == [("fp16", 16, 11.1), ("fp16", 64, 1064.4)]


def test_of_a_table_with_graphs_off_and_on_the_gpu_rates_are_those_with_graphs_on() -> None:
    markdown = "\n".join([
        "| precision (Llama ran in) | batch | graphs | ms a step | tokens/s | audio s/s | × eager |",
        "|---|---|---|---|---|---|---|",
        "| fp16 (float16) | 64 | off | 20.1 | 3,184 | 67.92 | 1.00× |",
        "| fp16 (float16) | 64 | on | 5.2 | 12,307 | 262.55 | 3.87× |",
    ])  # fmt: skip
    assert [(r.precision, r.batch, r.audio_per_s) for r in gpu_rates(markdown)] == [("fp16", 64, 262.55)]


def test_each_commands_cost_is_its_calls_and_time_over_the_window_costliest_first() -> None:
    before = {"cmdstat_evalsha": {"calls": 10, "usec": 1000}, "cmdstat_get": {"calls": 5, "usec": 50}}
    after = {**before, "cmdstat_evalsha": {"calls": 30, "usec": 5000}, "cmdstat_hset": {"calls": 4, "usec": 40}}
    costs = [(c.name, c.calls, c.usec) for c in command_costs(before, after)]
    assert costs == [("EVALSHA", 20, 4000), ("HSET", 4, 40)], "a command not called in the window is left out"


def _chattts_cut(tokens: int, opening: bool) -> list[int]:
    """Return the samples of each fragment ChatTTS's own cutter makes of ``tokens``, told them one at a time."""
    sizes = FragmentSchedule().in_tokens(1000 * SAMPLES_PER_TOKEN / SAMPLE_RATE)

    def decode(hidden: torch.Tensor) -> npt.NDArray[np.float32]:
        return np.zeros(len(hidden) * SAMPLES_PER_TOKEN - DECODE_SHORTFALL, dtype=np.float32)

    window = chattts_fragments.Window(
        lookahead=ENGINE["fragment_lookahead"], first_lookahead=ENGINE["fragment_first_lookahead"]
    )
    cutter = chattts_fragments.TokenFragments(sizes, window, decode, slack_s=0.0 if opening else 5.0)
    hidden = torch.zeros((tokens, 2))
    pieces = [p for t in range(1, tokens + 1) for p in cutter.grown(hidden[:t])] + cutter.ended(hidden)
    return [len(p) for p in pieces]


@pytest.mark.parametrize("opening", [True, False])
def test_the_stand_in_cuts_a_segment_into_the_fragments_chattts_would(opening: bool) -> None:
    sizes = FragmentSchedule().in_tokens(1000 * SAMPLES_PER_TOKEN / SAMPLE_RATE)
    for tokens in range(1, 600, 7):
        samples = [n * SAMPLES_PER_TOKEN for n in fragment_tokens(tokens, sizes, opening=opening)]
        samples[-1] -= DECODE_SHORTFALL
        assert samples == _chattts_cut(tokens, opening), f"{tokens} tokens"
    assert fragment_tokens(188, NO_FRAGMENTS.in_tokens(21.3), opening=True) == [188], "off: the segment whole"
    copied = (SAMPLES_PER_TOKEN, DECODE_SHORTFALL, LOOKAHEAD, FIRST_LOOKAHEAD)
    originals = (chattts_fragments.SAMPLES_PER_TOKEN, chattts_fragments.DECODE_SHORTFALL,
                 ENGINE["fragment_lookahead"], ENGINE["fragment_first_lookahead"])  # fmt: skip
    assert copied == originals, "the stand-in's copies of ChatTTS's constants are ChatTTS's"


@pytest.mark.slow
def test_a_short_run_writes_segments_in_fragments_through_one_redis_and_prices_them(redis_server: RedisServer) -> None:
    del redis_server  # only its check that redis-server is installed: the bench starts Redis servers of its own
    noise = np.random.default_rng(1).uniform(-0.3, 0.3, 10 * SAMPLE_RATE).astype(np.float32)
    row = run_row(
        Setup(1), Timing(callers=2, idle_s=0.2, warmup_s=0.5, window_s=1.5), Work(read_corpus(), noise.tobytes())
    )
    load = row.load
    assert load.segments > 0 and load.errors == 0
    fragments = load.per_segment(load.fragments)
    assert fragments is not None and fragments > 1, "cut into fragments, at the default schedule"
    assert 0 < load.cpu_share < 1 and load.commands > 0
    per_audio_in = load.per_audio_s(load.net_in)
    assert per_audio_in is not None and per_audio_in > SAMPLE_RATE, "at least the fragments' raw PCM came in"
    assert load.ceiling_audio_per_s is not None and load.ceiling_audio_per_s > load.audio_per_s
    assert table_line(row).startswith("| 1 | 2 | 150,400 | 0 |")

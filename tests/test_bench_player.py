"""The benchmarks' listener plays as the web page does: fragments, from two in hand or a segment's last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.fragments import PREFETCH, FragmentClient, PlayerClient
from bench.loadgen import JobResult
from bench.openloop import gaps


def _fragment(samples: int, *, last: bool = False) -> dict[str, Any]:
    return {"samples": samples, "sample_rate": 24000, "last": last}


@pytest.fixture
def player() -> PlayerClient:
    return PlayerClient("http://127.0.0.1:9", model="chattts-tiny")


def test_the_web_page_and_the_benchmarks_prefetch_alike() -> None:
    script = (Path(__file__).parents[1] / "api" / "static" / "app.js").read_text()
    assert f"const PREFETCH = {PREFETCH};" in script


def test_playback_starts_once_two_fragments_are_in_hand(player: PlayerClient) -> None:
    result = JobResult(chars=10, submitted=0.0)
    player._heard("fragment", _fragment(3600), result)
    assert result.first_audio is None
    player._heard("fragment", _fragment(9600), result)
    assert result.first_audio == result.segments[1][0]
    assert [length for _, length in result.segments] == [0.15, 0.4]


def test_a_segment_of_one_fragment_starts_playing_at_once(player: PlayerClient) -> None:
    result = JobResult(chars=3, submitted=0.0)
    player._heard("fragment", _fragment(4800, last=True), result)
    assert result.first_audio == result.segments[0][0]


def test_other_events_are_not_audio(player: PlayerClient) -> None:
    result = JobResult(chars=3, submitted=0.0)
    player._heard("segment", {"index": 0, "url": "/x"}, result)
    assert result.first_audio is None and result.segments == []


def test_a_second_fragment_in_hand_absorbs_the_wait_the_first_alone_would_hear() -> None:
    # The first fragment (150 ms) is out at 1.0 s, the second at 1.3 s: played from the first, a 150 ms gap.
    arrivals = [(1.0, 0.15), (1.3, 0.4), (1.6, 0.4)]
    from_first = JobResult(chars=10, submitted=0.0, first_audio=1.0, segments=arrivals)
    from_two = JobResult(chars=10, submitted=0.0, first_audio=1.3, segments=arrivals)
    assert gaps(from_first) == pytest.approx([0.15])
    assert gaps(from_two) == []


def test_the_fragment_benches_listener_plays_from_the_first_fragment() -> None:
    result = JobResult(chars=10, submitted=0.0)
    FragmentClient("http://127.0.0.1:9", model="chattts-tiny")._heard("fragment", _fragment(3600), result)
    assert result.first_audio == result.segments[0][0]

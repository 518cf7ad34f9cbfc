"""The text-stream benchmark's command line (which levels and ways in it runs) and its table."""

from __future__ import annotations

import pytest

from bench.text_stream import TRANSPORTS, parse_args, summarize, table


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

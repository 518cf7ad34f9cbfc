"""The command line's progress bar (tqdm): segments done/total, seconds of audio, ETA; no redraws off a terminal."""

from __future__ import annotations

import io
import re

from client.progress import ProgressBar


def _run(progress: ProgressBar, steps: list[tuple[int, int, float]]) -> None:
    for done, total, audio_s in steps:
        progress.update(done, total, audio_s)
    progress.close()


STEPS = [(0, 3, 0.0), (1, 3, 1.2), (1, 3, 1.2), (2, 3, 2.5), (3, 3, 3.75)]


def test_off_a_terminal_each_new_segment_count_is_one_plain_line_without_redraws() -> None:
    stream = io.StringIO()
    _run(ProgressBar(stream), STEPS)
    out = stream.getvalue()
    assert "\r" not in out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert len(lines) == 4  # the repeated (1, 3) update wrote nothing
    assert lines[0] == "0/3 segments, 0.0 s audio, ETA ?"
    assert lines[1].startswith("1/3 segments, 1.2 s audio, ETA ")
    assert lines[3].startswith("3/3 segments, 3.8 s audio, done in ")


def test_on_a_terminal_tqdm_redraws_one_line_that_ends_with_the_finished_state() -> None:
    stream = io.StringIO()
    _run(ProgressBar(stream, tty=True), STEPS)
    out = stream.getvalue()
    assert "\r" in out
    assert out.endswith("\n")
    assert out.count("\n") == 1  # one line, redrawn in place
    last = out.rstrip("\n").rsplit("\r", 1)[-1].rstrip()
    assert re.fullmatch(r"\|[#█]{24}\| 3/3 segments, 3\.8 s audio, done in \d\d:\d\d", last), last


def test_a_resumed_run_starts_at_the_segments_already_there_with_no_eta_yet() -> None:
    stream = io.StringIO()
    progress = ProgressBar(stream)
    progress.update(2, 6, 4.0)
    assert stream.getvalue() == "2/6 segments, 4.0 s audio, ETA ?\n"
    progress.update(3, 6, 6.0)
    assert stream.getvalue().splitlines()[1].startswith("3/6 segments, 6.0 s audio, ETA 00:")
    progress.close()


def test_close_before_any_update_writes_nothing() -> None:
    for tty in (False, True):
        stream = io.StringIO()
        ProgressBar(stream, tty=tty).close()
        assert stream.getvalue() == ""

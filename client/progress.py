"""The command line's progress: segments done/total, seconds of audio and an ETA, drawn by tqdm."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

#: On a terminal: a bar redrawn in place.
BAR_FORMAT = "|{bar:24}| {n_fmt}/{total_fmt} segments{postfix}, ETA {remaining}"
FINISHED_BAR_FORMAT = "|{bar:24}| {n_fmt}/{total_fmt} segments{postfix}, done in {elapsed}"
#: Elsewhere (a log, a pipe): one plain line per segment, no bar and no redraws.
LINE_FORMAT = "{n_fmt}/{total_fmt} segments{postfix}, ETA {remaining}"
FINISHED_LINE_FORMAT = "{n_fmt}/{total_fmt} segments{postfix}, done in {elapsed}"
#: Seconds between redraws on a terminal.
REDRAW_S = 0.1


class ProgressBar:
    """Show how far a job has got on ``stream`` (stderr).

    On a terminal this is a tqdm bar redrawn at most every ``REDRAW_S``. On anything else tqdm's redraws
    (carriage returns) would pile up in the file, so each new segment count is one line of the same text instead.
    The ETA counts only segments fetched by this run: a resumed run's segments already on disk do not speed it up.
    """

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._bar: Any = None  # the tqdm bar, on a terminal
        self._start: tuple[float, int] | None = None  # when, and at how many segments, the first update came
        self._logged: tuple[int, int] | None = None

    def update(self, done: int, total: int, audio_s: float) -> None:
        """Show ``done`` of ``total`` segments and ``audio_s`` seconds of audio made so far."""
        finished = done >= total
        postfix = f"{audio_s:.1f} s audio"
        if self.tty:
            self._draw(done, total, postfix, finished=finished)
            return
        now = time.monotonic()
        if self._start is None:
            self._start = (now, done)
        if self._logged == (done, total):
            return
        started_at, started_done = self._start
        line = tqdm.format_meter(
            done,
            total,
            now - started_at,
            initial=started_done,
            postfix=postfix,
            bar_format=FINISHED_LINE_FORMAT if finished else LINE_FORMAT,
        )
        self.stream.write(line + "\n")
        self.stream.flush()
        self._logged = (done, total)

    def _draw(self, done: int, total: int, postfix: str, *, finished: bool) -> None:
        if self._bar is None:
            # A terminal that reports no size (some CI ptys) would get nothing drawn by tqdm: assume 80x24.
            columns, lines = shutil.get_terminal_size((80, 24))
            self._bar = tqdm(
                total=total,
                initial=done,
                file=self.stream,
                bar_format=BAR_FORMAT,
                postfix=postfix,
                mininterval=REDRAW_S,
                ncols=columns if columns > 0 else 80,
                nrows=lines if lines > 0 else 24,
                leave=True,
            )
        self._bar.set_postfix_str(postfix, refresh=False)
        if finished:
            self._bar.bar_format = FINISHED_BAR_FORMAT
        self._bar.update(done - self._bar.n)
        if finished:
            self._bar.refresh()  # the last state now, whatever the redraw interval

    def close(self) -> None:
        """End the bar's line (on a terminal); later updates start a new bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

"""A job whose text is sent piece by piece, as a language model writes it (``TTSClient.open_stream``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from client.errors import TTSClientError

if TYPE_CHECKING:
    from client.api import TTSClient
    from client.fragments import Fragment


#: ``TextStream.write`` joins tokens for at most this long into one piece (a sentence end goes at once).
JOIN_S = 0.1
#: Marks after which ``write`` sends at once: a sentence (or a line) may be complete, and is spoken soonest.
SENTENCE_ENDS = frozenset("。！？；…」』）】”’.!?;\n")


class TextStream:
    """A job whose text is sent piece by piece (an LLM's tokens as they come); made by ``TTSClient.open_stream``.

    ``send`` numbers the pieces itself (0, 1, 2, …) and retries a busy or unreachable service with the same seq;
    ``finish`` sends the final piece. Sentences are spoken as soon as they are complete, so ``segments`` can be
    iterated (in another thread) while pieces are still being sent; it ends once the final piece is spoken.
    Used as a context manager, the stream is finished on leaving the block. ``send`` may be called from several
    threads: pieces go one at a time, in the order the calls got in.

    ``write`` is for a token at a time: it joins what arrives within ``join_s`` into one piece, and sends at once
    a sentence mark and the space after one, so nothing speakable waits and an LLM's 30 tokens a second cost a few
    requests a second instead of 30.
    """

    def __init__(self, client: TTSClient, job: dict[str, Any]) -> None:
        self.client = client
        #: The job view the service answered when the stream was opened.
        self.job = job
        self.job_id: str = str(job["id"])
        stream = job.get("text_stream") or {}
        #: The seq the next piece gets.
        self.next_seq: int = int(stream.get("next_seq", 0))
        #: Segments planned so far, as of the last answer (final once the stream is closed).
        self.segments_total: int = int(job.get("segments_total", 0))
        #: Whether the service said, in its last answer, that the stream takes more pieces.
        self.open: bool = bool(stream.get("open", True))
        self.finished = False
        self._lock = threading.Lock()
        self.join_s = JOIN_S
        self._joined = ""  # written, not sent yet
        self._last_written = ""
        self._join_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._late_error: TTSClientError | None = None  # a timed send's failure, raised by the next call

    def write(self, text: str) -> None:
        """Queue ``text`` (a token, say) for the next piece: sent at once if it ends a sentence, else within
        ``join_s`` together with whatever else is written meanwhile. Raise what a timed send failed with."""
        self._raise_late_error()
        if not text:
            return
        with self._join_lock:
            # At once: a sentence mark, or the space after one (which completes "3." or "Dr." as a sentence).
            at_once = text[-1] in SENTENCE_ENDS or (text[0].isspace() and self._last_written in SENTENCE_ENDS)
            self._joined += text
            self._last_written = text[-1]
            if not at_once:
                if self._timer is None:
                    self._timer = threading.Timer(self.join_s, self._send_joined_in_time)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def flush(self) -> None:
        """Send what ``write`` has joined so far, now."""
        with self._join_lock:
            text = self._take_joined()
            if text:  # under the join lock, so that pieces keep the order their text was written in
                self.send(text)

    def _take_joined(self) -> str:
        """Stop the timed send and return what ``write`` joined (under the join lock)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        text, self._joined = self._joined, ""
        return text

    def _send_joined_in_time(self) -> None:
        try:
            self.flush()
        except TTSClientError as e:
            self._late_error = e

    def _raise_late_error(self) -> None:
        error, self._late_error = self._late_error, None
        if error is not None:
            raise error

    def send(self, text: str, *, final: bool = False) -> dict[str, Any]:
        """Send ``text`` as the next piece (the final one if ``final``) and return the service's answer.

        Raise ``TTSClientError`` when the service refuses it (409 with a ``reason`` when the stream is closed or
        over, 413 when the stream's text would be too long) or stays unreachable or busy; the piece may then have
        arrived or not, and the same ``send`` may be tried again: it keeps its seq, and is spoken at most once.
        """
        if not text and not final:
            raise ValueError("only the final piece may be empty")
        with self._lock:
            if self.finished:
                raise TTSClientError(
                    409, "conflict", "the stream's final piece was sent already", details={"reason": "after_final"}
                )
            answer = self.client.send_text(self.job_id, self.next_seq, text, final=final)
            self.next_seq += 1
            self.finished = final
            self.segments_total = int(answer.get("segments_total", self.segments_total))
            self.open = bool((answer.get("text_stream") or {}).get("open", not final))
            return answer

    def finish(self, text: str = "") -> dict[str, Any]:
        """Send the final piece (``text``, or nothing), after what ``write`` still holds: the job ends once
        everything sent is spoken."""
        self._raise_late_error()
        self.flush()
        return self.send(text, final=True)

    def close(self) -> None:
        """Finish the stream unless its final piece was sent already."""
        if not self.finished:
            self.finish()

    def segments(self, *, start: int = 0) -> Iterator[tuple[int, bytes, float]]:
        """Yield (index, audio, duration) for each segment as it is made, until the stream ends and all are made."""
        return self.client.segments(self.job_id, start=start)

    def fragments(self) -> Iterator[Fragment]:
        """Yield the audio a fragment at a time as it is made, until the stream ends and all is made
        (``TTSClient.fragments``)."""
        return self.client.fragments(self.job_id)

    def wait(self, *, poll_s: float = 0.5) -> dict[str, Any]:
        """Wait until the job is done (the stream finished and every segment made) and return it."""
        return self.client.wait(self.job_id, poll_s=poll_s)

    def cancel(self) -> dict[str, Any]:
        """Cancel the job: no more pieces are taken and segments not yet made are skipped."""
        self.finished = True
        with self._join_lock:
            self._take_joined()  # dropped: nothing more is spoken
        return self.client.cancel(self.job_id)

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(TTSClientError):  # what was sent is still spoken; the error that left is the one
            self.close()

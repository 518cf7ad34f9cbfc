"""``tts say --stdin``: speak text as it is piped in (from an LLM's command line, say), one text stream, writing or
playing the audio as it is made, a fragment at a time."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from client.api import TTSClient
from client.audio import check_supported, encode, write_audio
from client.errors import TTSClientError
from client.text_stream import TextStream

#: The most ``say --stdin`` reads at once: what a pipe holds then, so a token is taken as soon as it is written
#: (and sent within ``TextStream.join_s``, a sentence end at once).
READ_BYTES = 4096


def read_pieces(stream: BinaryIO, size: int = READ_BYTES) -> Iterator[str]:
    """Yield the text of ``stream`` as it arrives (UTF-8, no character split), each read taking what is there.

    A stream with a file descriptor (standard input, a pipe) is read with ``os.read``, which returns as soon as
    anything was written rather than once ``size`` bytes came; others with ``read1`` or ``read``.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        read = getattr(stream, "read1", stream.read)
    else:

        def read(n: int) -> bytes:
            return os.read(fd, n)

    decoder = codecs.getincrementaldecoder("utf-8")()
    taken = 0
    try:
        while chunk := read(size):
            if text := decoder.decode(chunk):
                yield text
            taken += len(chunk)
        if tail := decoder.decode(b"", final=True):
            yield tail
    except UnicodeDecodeError as e:
        raise TTSClientError(0, "bad_input", f"the input is not UTF-8 text (byte {taken + e.start:,}: "
                             f"{e.reason}); pipe text, not audio or binary data") from None  # fmt: skip


def wav_stream_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """Return a 16-bit mono WAV header; with no ``data_bytes`` its sizes say "unknown" (0xFFFFFFFF), as streams'."""
    data_size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff_size = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", riff_size, b"WAVE", b"fmt ", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16, b"data", data_size,
    )  # fmt: skip


class AudioSink:
    """Where ``say --stdin`` puts its audio (mono 16-bit PCM, a fragment at a time).

    Raw PCM and WAV are written as each fragment arrives, to a file or to standard output ('-'): a WAV file's
    header gets its sizes at the end, a WAV on standard output keeps the "unknown" sizes of a stream. Other
    formats are encoded once, whole, at the end.
    """

    def __init__(self, output: Path, fmt: str, stdout: BinaryIO) -> None:
        self.output = output
        self.fmt = fmt
        self.to_stdout = str(output) == "-"
        self.streamed = fmt in ("pcm", "wav")
        self.stdout = stdout
        self.kept: list[bytes] = []
        self.bytes_written = 0
        self._out: BinaryIO | None = None

    def write(self, pcm: bytes, sample_rate: int) -> None:
        """Take one fragment: write it now, or keep it for the end."""
        if not self.streamed:
            self.kept.append(pcm)
            return
        out = self._open(sample_rate)
        out.write(pcm)
        out.flush()
        self.bytes_written += len(pcm)

    def _open(self, sample_rate: int) -> BinaryIO:
        if self._out is None:
            self._out = self.stdout if self.to_stdout else self.output.open("wb")
            if self.fmt == "wav":
                self._out.write(wav_stream_header(sample_rate))
        return self._out

    def abort(self) -> None:
        """Close a file written so far (it keeps what was spoken before the failure); standard output stays open."""
        if self._out is not None and not self.to_stdout:
            self._out.close()

    def close(self, sample_rate: int) -> None:
        """Finish the output: patch a WAV file's sizes, or encode what was kept."""
        if not self.streamed:
            audio = encode(b"".join(self.kept), sample_rate, self.fmt)
            if self.to_stdout:
                self.stdout.write(audio)
                self.stdout.flush()
            else:
                write_audio(self.output, b"".join(self.kept), sample_rate, self.fmt)
            return
        out = self._open(sample_rate)
        if self.to_stdout:
            out.flush()
            return
        if self.fmt == "wav":
            out.seek(0)
            out.write(wav_stream_header(sample_rate, self.bytes_written))
        out.close()


class _Follower(threading.Thread):
    """Take a text stream's audio as it is made, a fragment at a time, into the sink, with a line on ``log`` for
    each segment."""

    def __init__(self, stream: TextStream, sink: AudioSink, log: TextIO) -> None:
        super().__init__(name=f"follow-{stream.job_id}", daemon=True)
        self.stream = stream
        self.sink = sink
        self.log = log
        self.sample_rate = 0
        self.count = 0
        self.audio_s = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for fragment in self.stream.fragments():
                self.sample_rate = self.sample_rate or fragment.sample_rate
                if fragment.pcm:  # a segment's last may be empty: only its end is news
                    self.sink.write(fragment.pcm, self.sample_rate)
                    self.audio_s += len(fragment.pcm) / 2 / self.sample_rate
                if not fragment.last:
                    continue
                self.count += 1
                audio = f"{self.audio_s:.1f} s audio"
                if self.stream.open:  # the total grows while text arrives
                    line = f"{self.count} segments, {audio}, text still arriving"
                else:
                    line = f"{self.count}/{max(self.count, self.stream.segments_total)} segments, {audio}"
                print(line, file=self.log, flush=True)
        except BaseException as e:  # handed to the thread that sends, which reports it
            self.error = e


def _finish(stream: TextStream) -> None:
    try:
        stream.finish()
    except TTSClientError as e:
        if e.reason != "closed":  # closed: it ended as idle, having taken (and spoken) every piece it was sent
            raise


def _cancel(stream: TextStream) -> None:
    """Cancel the stream's job, so that nothing more is spoken and its follower sees it end."""
    with contextlib.suppress(TTSClientError):
        stream.cancel()


def _send_all(stream: TextStream, pieces: Iterable[str], follower: _Follower) -> None:
    """Send each piece (joined for up to ``TextStream.join_s``; a sentence end at once), then the final one; cancel
    the job if this is cut short, so that nothing more is said."""
    try:
        for piece in pieces:
            if follower.error is not None:
                return  # the job failed or cannot be followed: the caller reports it
            stream.write(piece)
        _finish(stream)
    except KeyboardInterrupt:
        _cancel(stream)
        raise
    except TTSClientError as e:
        first = follower.error
        _cancel(stream)
        if isinstance(first, TTSClientError):
            raise first from e  # the job failed before this piece: that is why it was refused
        raise


def say_stream(
    client: TTSClient,
    pieces: Iterable[str],
    output: Path,
    *,
    fmt: str,
    options: dict[str, Any],
    log: TextIO,
    stdout: BinaryIO,
) -> TextStream:
    """Speak text as it arrives: send each of ``pieces`` to one text stream, the final piece at their end, and
    write the audio to ``output`` ('-': ``stdout``) as its segments are made. Return the finished stream."""
    check_supported(fmt)
    started = time.monotonic()
    stream = client.open_stream(**{**options, "format": "pcm"})
    print(f"job {stream.job_id}: speaking the text as it arrives; end it with end-of-file", file=log, flush=True)
    sink = AudioSink(output, fmt, stdout)
    follower = _Follower(stream, sink, log)
    follower.start()
    try:
        _send_all(stream, pieces, follower)
        follower.join()
        if follower.error is not None:
            _cancel(stream)
            raise follower.error
        if follower.count == 0:
            raise TTSClientError(422, "invalid_field", "text: standard input had nothing a voice can speak")
    except BaseException:
        sink.abort()
        raise
    sink.close(follower.sample_rate)
    print(
        f"{follower.count}/{follower.count} segments, {follower.audio_s:.1f} s audio, "
        f"done in {time.monotonic() - started:.1f} s",
        file=log,
    )
    return stream

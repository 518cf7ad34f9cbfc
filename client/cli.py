"""The command line: ``say`` a sentence into a file (or standard input as it is written, ``--stdin``), or turn a
``book`` chapter into audio and resume if cut off."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import hashlib
import io
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import requests

from client.api import TextStream, TTSClient, TTSClientError
from client.audio import SUFFIX_FORMATS, AudioSupportMissing, check_supported, encode
from client.progress import ProgressBar

__all__ = ["ProgressBar", "build_parser", "main", "make_book", "read_pieces", "say", "say_stream"]

DEFAULT_URL = "http://127.0.0.1:8000"
STATE_NAME = "job.json"
#: The most ``say --stdin`` reads at once: what a pipe holds then, so a token is taken as soon as it is written
#: (and sent within ``TextStream.join_s``, a sentence end at once).
READ_BYTES = 4096
#: What ``--help`` and the error lines call the program when it is not run as ``tts``.
PROG = "tts"


def output_format(path: Path, given: str | None) -> str:
    """Return the format named by ``--format`` or else by the output file's suffix."""
    if given:
        return given
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SystemExit(f"error: cannot tell the format of {path}; use one of {sorted(SUFFIX_FORMATS)} or --format")
    return fmt


def write_audio(path: Path, pcm: bytes, sample_rate: int, fmt: str) -> None:
    """Encode mono 16-bit PCM as ``fmt`` into ``path``, atomically (a temporary file, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(encode(pcm, sample_rate, fmt))
    temporary.replace(path)


class BookState:
    """A cut-off book run on disk: ``job.json`` (job id, request fingerprint, rate) beside ``seg-NNNNN.pcm`` files."""

    def __init__(self, state_file: Path) -> None:
        self.file = state_file
        self.folder = state_file.parent
        self.data: dict[str, Any] = {}
        if state_file.is_file():
            try:
                self.data = json.loads(state_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.data = {}  # a torn or foreign file: start over rather than guess

    def save(self, **changes: Any) -> None:
        """Update and write the state atomically."""
        self.data.update(changes)
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.file.with_name(self.file.name + ".tmp")
        temporary.write_text(json.dumps(self.data, indent=2), encoding="utf-8")
        temporary.replace(self.file)

    def segment_path(self, index: int) -> Path:
        """Return where segment ``index`` is kept."""
        return self.folder / f"seg-{index:05d}.pcm"

    def put_segment(self, index: int, pcm: bytes) -> None:
        """Keep one segment; it only appears under its name once wholly written."""
        temporary = self.segment_path(index).with_suffix(".tmp")
        temporary.write_bytes(pcm)
        temporary.replace(self.segment_path(index))

    def have(self, total: int) -> list[int]:
        """Return the indices of the segments already kept."""
        return [i for i in range(total) if self.segment_path(i).is_file()]

    def clear(self) -> None:
        """Remove the kept segments and the state file, and the folder if nothing else is in it."""
        for path in [*self.folder.glob("seg-*.pcm"), *self.folder.glob("seg-*.tmp"), self.file]:
            path.unlink(missing_ok=True)
        self.data = {}
        with contextlib.suppress(OSError):  # absent, or it holds files that are not ours
            self.folder.rmdir()


def _fingerprint(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


#: What the service chose for a job that decides its segments: the same text planned with the same choices is cut
#: into the same segments (the seed, when none is given, is 0), so a new job's segments may replace a lost job's.
PLAN_KEYS = ("model", "voice", "speed", "mode", "seed", "segments_total", "chars_total")
#: How long a book waits in all for the service to admit it (503 with Retry-After: its store or engines are full
#: of other work), and the longest pause between two tries, whatever Retry-After says.
BOOK_ADMISSION_WAIT_S = 1800.0
BOOK_RETRY_MAX_S = 60.0


def _submit_when_admitted(
    client: TTSClient, request: dict[str, Any], log: TextIO, *, wait_s: float = BOOK_ADMISSION_WAIT_S
) -> dict[str, Any]:
    """Submit a book, waiting out each 503 that says when to try again (Retry-After), for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.submit(**request)
        except TTSClientError as e:
            if e.status != 503 or e.retry_after is None:
                raise
            pause = min(max(e.retry_after, 1.0), BOOK_RETRY_MAX_S)
            if time.monotonic() + pause > deadline:
                raise
            print(f"not admitted yet ({e.code}: {e.message}); trying again in {pause:g} s", file=log, flush=True)
            time.sleep(pause)


def _plan(job: dict[str, Any]) -> dict[str, Any]:
    return {key: job.get(key) for key in PLAN_KEYS}


def _reuse_or_submit(client: TTSClient, state: BookState, request: dict[str, Any], log: TextIO) -> dict[str, Any]:
    fingerprint = _fingerprint(request)
    job_id = state.data.get("job_id")
    if job_id and state.data.get("fingerprint") == fingerprint:
        try:
            job = client.status(job_id)
        except TTSClientError as e:
            if e.status != 404:
                raise
            return _submit_again(client, state, request, log, why=f"job {job_id} is gone from the server (expired)")
        if job["status"] not in ("failed", "canceled"):
            return job
        # A job failed (its store full, say) or canceled: the segments saved before are as good as a new job's.
        reason = f": {job['error']}" if job.get("error") else ""
        return _submit_again(client, state, request, log, why=f"job {job_id} {job['status']}{reason}")
    elif job_id:
        print("the text or options changed since the cut-off run; starting again", file=log)
    state.clear()
    job = _submit_when_admitted(client, request, log)
    state.save(job_id=job["id"], fingerprint=fingerprint, segments_total=job["segments_total"], plan=_plan(job))
    return job


def _submit_again(
    client: TTSClient, state: BookState, request: dict[str, Any], log: TextIO, *, why: str
) -> dict[str, Any]:
    """Submit the text again for a job whose audio is lost, keeping the segments saved if it plans the same."""
    job = _submit_when_admitted(client, request, log)
    # A state saved before plans were recorded knows the segment count only.
    planned = state.data.get("plan") or {"segments_total": state.data.get("segments_total")}
    changed = sorted(key for key, value in planned.items() if job.get(key) != value)
    if changed:
        state.clear()
        state.save(fingerprint=_fingerprint(request))
        print(f"{why}; submitted again as job {job['id']}, which plans the text differently "
              f"({', '.join(changed)} changed): starting over", file=log)  # fmt: skip
    else:
        print(f"{why}; submitted again as job {job['id']}", file=log)
    state.save(job_id=job["id"], segments_total=job["segments_total"], plan=_plan(job))
    return job


def _audio_gone(client: TTSClient, job_id: str, error: TTSClientError) -> bool:
    """Say whether ``error``, met fetching a segment of ``job_id``, means the job's audio is no longer kept."""
    if error.status == 410 and error.code == "gone":
        return True
    if error.status != 404:
        return False
    try:  # the segment route's 404 is also its answer for an index past the end
        client.status(job_id)
    except TTSClientError as e:
        return e.status == 404
    return False


def _fetch_missing(
    client: TTSClient, state: BookState, job: dict[str, Any], progress: ProgressBar, log: TextIO
) -> None:
    """Fetch into ``state`` each segment of ``job`` not saved yet, showing progress."""
    job_id, total = job["id"], int(job["segments_total"])
    have = state.have(total)
    rate = int(state.data.get("sample_rate") or 0)
    audio_s = sum(state.segment_path(i).stat().st_size / 2 / rate for i in have) if rate else 0.0
    if have:
        print(f"resuming job {job_id}: {len(have)}/{total} segments already here", file=log)
    progress.update(len(have), total, audio_s)
    done = len(have)
    for index in sorted(set(range(total)) - set(have)):
        pcm, duration, rate = client.segment(job_id, index)
        state.put_segment(index, pcm)
        if state.data.get("sample_rate") != rate:
            state.save(sample_rate=rate)
        done += 1
        audio_s += duration
        progress.update(done, total, audio_s)


def make_book(
    client: TTSClient,
    text: str,
    output: Path,
    *,
    options: dict[str, Any],
    state_file: Path,
    progress: ProgressBar,
    log: TextIO,
) -> Path:
    """Turn ``text`` into ``output``, keeping fetched segments in ``state_file``'s folder so a rerun resumes.

    When the job's audio is no longer kept (its audio TTL passed, or the service's memory budget needed it), the
    text is submitted again and only the segments not saved yet are fetched, from the new job.
    """
    check_supported(output_format(output, None))
    state = BookState(state_file)
    request = {"text": text, "format": "pcm", **options}
    job = _reuse_or_submit(client, state, request, log)
    submitted_again = False
    while True:
        saved = len(state.have(int(job["segments_total"])))
        try:
            _fetch_missing(client, state, job, progress, log)
            break
        except TTSClientError as e:
            # A job submitted again that loses its audio before giving a segment would only loop.
            stuck = submitted_again and len(state.have(int(job["segments_total"]))) == saved
            if stuck or not _audio_gone(client, job["id"], e):
                raise
        progress.close()
        job = _submit_again(client, state, request, log, why=f"job {job['id']}'s audio is no longer kept")
        submitted_again = True
    progress.close()
    total = int(job["segments_total"])
    pcm = b"".join(state.segment_path(i).read_bytes() for i in range(total))
    write_audio(output, pcm, int(state.data["sample_rate"]), output_format(output, None))
    state.clear()
    return output


def say(client: TTSClient, text: str, output: Path, *, options: dict[str, Any], progress: ProgressBar) -> Path:
    """Synthesize ``text`` as one job, follow its progress, and download the file."""
    job = client.submit(text, **options)
    done, audio_s = 0, 0.0
    progress.update(done, job["segments_total"], audio_s)
    for event in client.events(job["id"]):
        if event["event"] == "segment":
            done += 1
            audio_s += float(event["data"].get("duration_s") or 0.0)
            progress.update(done, job["segments_total"], audio_s)
        elif event["event"] != "done":
            raise TTSClientError(409, "job_failed", f"job {event['event']}: {event['data']}")
    progress.close()
    return client.download(job["id"], output)


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
    """Where ``say --stdin`` puts its audio (mono 16-bit PCM, segment by segment).

    Raw PCM and WAV are written as each segment arrives, to a file or to standard output ('-'): a WAV file's
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
        """Take one segment: write it now, or keep it for the end."""
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
    """Fetch a text stream's segments as they are made, into the sink, with a line on ``log`` for each."""

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
            for _, pcm, duration in self.stream.segments():
                if not self.sample_rate:  # known once the job's first segment is made
                    self.sample_rate = int(self.stream.client.status(self.stream.job_id)["sample_rate"] or 0)
                self.sink.write(pcm, self.sample_rate)
                self.count += 1
                self.audio_s += duration
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


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """Describe the ``say`` and ``book`` commands; ``TTS_URL`` and ``TTS_API_KEY`` give defaults."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-o", "--output", type=Path, required=True, help="output file; its suffix picks the format")
    common.add_argument("--url", default=os.environ.get("TTS_URL") or DEFAULT_URL, help="service URL (env TTS_URL)")
    common.add_argument(
        "--api-key",
        default=os.environ.get("TTS_API_KEY") or None,
        help="key for a service that asks for one, sent as 'Authorization: Bearer' (env TTS_API_KEY, which "
        "keeps it out of the shell history)",
    )
    common.add_argument("--model", help="model id (see GET /v1/models); the service's default if omitted")
    common.add_argument("--voice", help="voice of the model")
    common.add_argument("--speed", type=float, help="0.5 to 2.0")
    common.add_argument("--mode", choices=("fast", "balanced", "quality"))
    common.add_argument("--seed", type=int, help="fixes the voice and sampling for models that use one")
    parser = argparse.ArgumentParser(prog=prog, description="Turn text into speech with the service.")
    commands = parser.add_subparsers(dest="command", required=True)
    say_parser = commands.add_parser(
        "say", parents=[common], help="synthesize a text given on the command line, or standard input as it arrives"
    )
    say_parser.add_argument("text", nargs="?", help="what to say (or --stdin)")
    say_parser.add_argument(
        "--stdin",
        action="store_true",
        help="read the text from standard input as it is written (a pipe from an LLM) and speak each sentence as "
        "soon as it is complete; -o - writes pcm (or --format wav) to standard output as it is made",
    )
    say_parser.add_argument("--format", choices=sorted(set(SUFFIX_FORMATS.values())), help="overrides the suffix")
    book_parser = commands.add_parser("book", parents=[common], help="synthesize a text file; rerun to resume")
    book_parser.add_argument("text_file", type=Path)
    book_parser.add_argument(
        "--resume-file", type=Path, help="state file of a cut-off run (default: <output>.part/job.json)"
    )
    return parser


def main(
    argv: list[str] | None = None,
    *,
    session: requests.Session | None = None,
    prog: str = PROG,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """Run one command and return its exit status (the ``tts`` command's entry point); ``stdin`` and ``stdout``
    replace the standard streams of ``say --stdin``."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.command == "say" and args.stdin == (args.text is not None):
        parser.error("say takes a text or --stdin (not both)" if args.stdin else "say needs a text, or --stdin")
    args.stdin_stream, args.stdout_stream = stdin, stdout
    with TTSClient(args.url, api_key=args.api_key, session=session) as client:
        return _run(client, args)


def error_message(error: TTSClientError, args: argparse.Namespace) -> str:
    """Return the line to print for a failed command; a 401 says how to give a key."""
    if error.status == 401:
        if args.api_key:
            return (
                f"error: {args.url} refused the API key ({error.message}); "
                "pass a valid one with --api-key or set TTS_API_KEY"
            )
        return f"error: {args.url} needs an API key; pass --api-key KEY or set TTS_API_KEY ({error.message})"
    return f"error: {error}"


def _run(client: TTSClient, args: argparse.Namespace) -> int:
    options = {k: getattr(args, k) for k in ("model", "voice", "speed", "mode", "seed") if getattr(args, k) is not None}
    progress = ProgressBar(sys.stderr)
    output: Path = args.output
    try:
        if args.command == "say" and args.stdin:
            fmt = args.format or ("pcm" if str(output) == "-" else output_format(output, None))
            source = args.stdin_stream or (sys.stdin.buffer if sys.stdin is not None else None)
            if source is None:
                raise TTSClientError(0, "bad_input", "standard input is closed: pipe the text to say into --stdin")
            pieces = read_pieces(source)
            stdout = args.stdout_stream or sys.stdout.buffer
            say_stream(client, pieces, output, fmt=fmt, options=options, log=sys.stderr, stdout=stdout)
        elif args.command == "say":
            options["format"] = output_format(output, args.format)
            say(client, args.text, output, options=options, progress=progress)
        else:
            # Refuse an unknown suffix, or one this install cannot write, before any work is done.
            check_supported(output_format(output, None))
            state_file = args.resume_file or output.with_name(output.name + ".part") / STATE_NAME
            text = args.text_file.read_text(encoding="utf-8")
            make_book(client, text, output, options=options, state_file=state_file, progress=progress, log=sys.stderr)
    except KeyboardInterrupt:
        progress.close()
        if args.command == "book":
            print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except TTSClientError as e:
        progress.close()
        print(error_message(e, args), file=sys.stderr)
        return 1
    except AudioSupportMissing as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {'standard output' if str(output) == '-' else output}", file=sys.stderr)
    return 0

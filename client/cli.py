"""The command line: ``say`` a sentence into a file (or standard input as it is written, ``--stdin``: client/piped.py),
or turn a ``book`` chapter into audio and resume if cut off (client/book.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import requests

from client.api import TTSClient
from client.audio import SUFFIX_FORMATS, AudioSupportMissing, check_supported, output_format
from client.book import STATE_NAME, make_book
from client.errors import TTSClientError
from client.piped import read_pieces, say_stream, wav_stream_header
from client.progress import ProgressBar

__all__ = ["ProgressBar", "build_parser", "main", "make_book", "read_pieces", "say", "say_stream"]

DEFAULT_URL = "http://127.0.0.1:8000"
#: What ``--help`` and the error lines call the program when it is not run as ``tts``.
PROG = "tts"


#: The formats ``say`` writes itself as the audio comes (the file the service would send, byte for byte); others
#: it downloads once the job is done.
WRITTEN_AS_MADE = frozenset({"wav", "pcm"})


def say(client: TTSClient, text: str, output: Path, *, options: dict[str, Any], progress: ProgressBar) -> Path:
    """Synthesize ``text`` as one job, follow its progress, and write the file as its audio comes (wav, pcm) or
    download it once made."""
    job = client.submit(text, **options)
    if options.get("format") in WRITTEN_AS_MADE:
        return write_as_made(client, job, output, fmt=options["format"], progress=progress)
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


def write_as_made(client: TTSClient, job: dict[str, Any], output: Path, *, fmt: str, progress: ProgressBar) -> Path:
    """Write the job's audio into ``output`` (via ``<output>.part``) a fragment at a time as it is made; a WAV's
    header gets its sizes at the end, so the file is the one the service would send."""
    partial = output.with_name(output.name + ".part")
    done, audio_s, rate, written = 0, 0.0, 0, 0
    progress.update(done, job["segments_total"], audio_s)
    try:
        with partial.open("wb") as out:
            for fragment in client.fragments(job["id"]):
                if not rate:
                    rate = fragment.sample_rate
                    out.write(wav_stream_header(rate) if fmt == "wav" else b"")
                out.write(fragment.pcm)
                out.flush()
                written += len(fragment.pcm)
                audio_s += len(fragment.pcm) / 2 / rate
                done += fragment.last
                if fragment.last:
                    progress.update(done, job["segments_total"], audio_s)
            if fmt == "wav":
                out.seek(0)
                out.write(wav_stream_header(rate, written))
    except BaseException:
        partial.unlink(missing_ok=True)  # as when a job fails before its download: no file
        raise
    progress.close()
    partial.replace(output)
    return output


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

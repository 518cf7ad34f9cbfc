"""The client's text streams (``TTSClient.open_stream``) and ``tts say --stdin``, against a real API over HTTP and
a real worker (espeak-en): text sent in pieces as it is written is spoken sentence by sentence, once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import soundfile as sf
from flask import Flask

from client import TTSClient
from client.api import TextStream
from client.cli import main
from tests.support.processes import wait_for
from tests.support.servers import ROOT

#: How long any one condition is waited for: generous, for 2 shared cores.
TIMEOUT_S = 60.0
SENTENCES = ["The first one is here.", "And the second one ends.", "A third is the last."]


def _texts(app: Flask, job_id: str) -> list[str]:
    """Return the segment texts the service planned (what it speaks), in order."""
    texts: list[str] = app.extensions["tts"].store.texts(job_id)
    return texts


def _pieces() -> tuple[list[str], list[str]]:
    """Return the tokens of the first sentence, ending with the space that completes it, and those of the rest.

    The first sentence is complete once its space arrives, and nothing is left over: the idle cut-off (the
    unfinished text of a stream left 1.5 s) finds nothing to speak while the test waits for its audio.
    """
    return [*_tokens(SENTENCES[:1]), " "], _tokens(SENTENCES[1:])


def _tokens(sentences: list[str]) -> list[str]:
    """Cut sentences into the word-sized pieces an LLM streams: "The", " first", …, "."."""
    text = " ".join(sentences)
    tokens: list[str] = []
    for word in text.split(" "):
        core = word.rstrip(".")
        tokens.append(core if not tokens else f" {core}")
        tokens.extend("." * (len(word) - len(core)))
    return tokens


class Follower(threading.Thread):
    """Iterate a stream's segments in the background, as a player would while the text is still being sent."""

    def __init__(self, stream: TextStream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.got: list[tuple[int, bytes, float]] = []
        self.first = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for segment in self.stream.segments():
                self.got.append(segment)
                self.first.set()
        except BaseException as e:
            self.error = e


class RecordingSession(requests.Session):
    """Record each request with its status; flag the first segment that came back; make chosen pieces fail.

    ``lose_answer_of`` names seqs whose first POST reaches the service but whose answer is lost (a dropped
    connection); ``busy_for`` names seqs whose first POST is answered 503 with Retry-After, never reaching it.
    """

    def __init__(self, *, lose_answer_of: tuple[int, ...] = (), busy_for: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int]] = []
        self.pieces: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []
        self.segment_arrived = threading.Event()
        self.lose_answer_of = set(lose_answer_of)
        self.busy_for = set(busy_for)

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        path = urlsplit(str(url)).path
        piece = kwargs.get("json") if path.endswith("/text") else None
        if piece is not None:
            self.pieces.append(piece)
            if piece["seq"] in self.busy_for:
                self.busy_for.discard(piece["seq"])
                self.calls.append((method, path, 503))
                return _busy(str(url))
        response = super().request(method, url, *args, **kwargs)
        self.calls.append((method, path, response.status_code))
        if (method, path, response.status_code) == ("POST", "/v1/jobs", 202):
            self.jobs.append(response.json())
        if "/segments/" in path and response.status_code == 200:
            self.segment_arrived.set()
        if piece is not None and piece["seq"] in self.lose_answer_of:
            self.lose_answer_of.discard(piece["seq"])
            response.close()
            raise requests.ConnectionError("the connection dropped before the answer came back")
        return response


def _busy(url: str) -> requests.Response:
    response = requests.Response()
    response.status_code = 503
    response.url = url
    response.headers["Retry-After"] = "0"
    response.headers["Content-Type"] = "application/json"
    body = {"error": {"code": "service_unavailable", "message": "busy; retry", "retry_after": 0}}
    response._content = json.dumps(body).encode()
    return response


def test_a_text_stream_sent_token_by_token_gets_audio_for_every_sentence_while_it_is_written_and_ends_done(
    app: Flask, tts: TTSClient
) -> None:
    first, rest = _pieces()
    with tts.open_stream(model="espeak-en", format="wav", cache=False) as stream:
        assert stream.open and stream.next_seq == 0 and stream.segments_total == 0
        follower = Follower(stream)
        follower.start()
        for token in first:
            stream.send(token)
        assert follower.first.wait(TIMEOUT_S), f"no audio while the text is still open: {follower.error}"
        assert stream.open and stream.segments_total == 1
        for token in rest:
            stream.send(token)
    sent = len(first) + len(rest) + 1  # and the final piece
    assert stream.finished and not stream.open and stream.next_seq == sent
    follower.join(TIMEOUT_S)
    assert not follower.is_alive() and follower.error is None
    assert [index for index, _, _ in follower.got] == list(range(len(SENTENCES)))
    for _, audio, duration in follower.got:
        info = sf.info(io.BytesIO(audio))
        assert info.samplerate == 22050 and info.duration == pytest.approx(duration, abs=0.002) and duration > 0.3
    assert _texts(app, stream.job_id) == SENTENCES
    done = stream.wait(poll_s=0.1)
    assert done["status"] == "done" and done["segments_total"] == len(SENTENCES)
    assert done["text_stream"] == {"open": False, "next_seq": sent, "end_reason": "final"}
    assert [i for i, _, _ in tts.segments(stream.job_id, start=1)] == [1, 2], "a closed stream: a plain job's"


def test_written_tokens_are_joined_into_few_pieces_and_a_sentence_end_goes_at_once(app: Flask, base_url: str) -> None:
    session = RecordingSession()
    with TTSClient(base_url, session=session) as client:
        stream = client.open_stream(model="espeak-en", cache=False)
        stream.join_s = 600.0  # no timed send in this test: only sentence ends send
        for token in _tokens(SENTENCES[:2]):
            stream.write(token)
        assert [p["text"] for p in session.pieces] == ["The first one is here.", " And", " the second one ends."], (
            "each full stop went at once, and so did the space after it, which completes its sentence"
        )
        assert stream.segments_total == 1, "the first is spoken; the second waits, as '3.' may become '3.14'"
        stream.finish()
        assert stream.wait(poll_s=0.1)["status"] == "done"
    assert [p["text"] for p in session.pieces] == ["The first one is here.", " And", " the second one ends.", ""]
    assert _texts(app, stream.job_id) == SENTENCES[:2]


def test_written_text_without_a_sentence_end_is_sent_within_the_join_window(app: Flask, base_url: str) -> None:
    session = RecordingSession()
    with TTSClient(base_url, session=session) as client:
        stream = client.open_stream(model="espeak-en", cache=False)
        stream.join_s = 0.05
        stream.write("Hello")
        stream.write(" there")
        wait_for(lambda: session.pieces, TIMEOUT_S, "the joined text to be sent without a sentence end")
        assert [p["text"] for p in session.pieces] == ["Hello there"]
        stream.finish(", friend.")
        assert stream.wait(poll_s=0.1)["status"] == "done"
    assert _texts(app, stream.job_id) == ["Hello there, friend."]


def test_segments_of_an_open_stream_from_a_later_index_skip_the_earlier_ones_and_wait_for_the_rest(
    tts: TTSClient,
) -> None:
    stream = tts.open_stream("The first sentence is here. The second one follows it. ", model="espeak-en", cache=False)
    assert stream.segments_total >= 2, "the opening text's complete sentences are planned at once"
    later = tts.segments(stream.job_id, start=1)
    assert next(later)[0] == 1
    stream.finish("And the third ends it.")
    assert stream.segments_total > 2
    assert [index for index, _, _ in later] == list(range(2, stream.segments_total))


def test_a_send_whose_answer_was_lost_or_that_found_the_service_busy_is_retried_with_its_seq_and_spoken_once(
    app: Flask, base_url: str
) -> None:
    session = RecordingSession(lose_answer_of=(0,), busy_for=(1,))
    with TTSClient(base_url, session=session) as client:
        stream = client.open_stream("Hello there. ", model="espeak-en", cache=False)
        lost = stream.send("How are you? ")
        assert lost["duplicate"] is True, "the retry found the piece already taken"
        busy = stream.send("Fine, thanks. ")
        assert busy["duplicate"] is False, "the 503 never reached the service: the retry is its first arrival"
        stream.finish("Bye.")
        assert stream.wait(poll_s=0.1)["status"] == "done"
    assert [piece["seq"] for piece in session.pieces] == [0, 0, 1, 1, 2]
    assert [c for c in session.calls if c[1].endswith("/text")][:4] == [
        ("POST", f"/v1/jobs/{stream.job_id}/text", 200),  # taken, though its answer was then lost
        ("POST", f"/v1/jobs/{stream.job_id}/text", 200),
        ("POST", f"/v1/jobs/{stream.job_id}/text", 503),
        ("POST", f"/v1/jobs/{stream.job_id}/text", 200),
    ]
    assert _texts(app, stream.job_id) == ["Hello there.", "How are you?", "Fine, thanks.", "Bye."]


def test_say_stdin_speaks_each_sentence_while_the_pipe_is_still_open_and_writes_a_wav_of_them_all(
    app: Flask, base_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    read_end, write_end = os.pipe()
    out = tmp_path / "spoken.wav"
    session = RecordingSession()
    result: list[int] = []

    def run_cli() -> None:
        with session, os.fdopen(read_end, "rb", buffering=0) as stdin:
            argv = ["say", "--stdin", "-o", str(out), "--url", base_url, "--model", "espeak-en"]
            result.append(main(argv, session=session, stdin=stdin))

    cli = threading.Thread(target=run_cli, daemon=True)
    cli.start()
    first, rest = _pieces()
    with os.fdopen(write_end, "wb", buffering=0) as pipe:
        for token in first:
            pipe.write(token.encode())
        # The first sentence's audio is written (after the WAV header) while the pipe is still open.
        wait_for(lambda: out.exists() and out.stat().st_size > 44, TIMEOUT_S, "the first sentence's audio written")
        for token in rest:
            pipe.write(token.encode())
    cli.join(TIMEOUT_S)
    assert not cli.is_alive() and result == [0]

    job_id = session.jobs[0]["id"]
    assert session.jobs[0]["text_stream"]["open"] is True and session.jobs[0]["format"] == "pcm"
    texts = _texts(app, job_id)
    assert " ".join(texts) == " ".join(SENTENCES), "the pipe's pieces may join sentences into a segment"
    samples, rate = sf.read(out, dtype="int16")
    whole = requests.get(f"{base_url}/v1/jobs/{job_id}/audio", timeout=30)
    assert rate == 22050 and len(samples) / rate > 2
    assert np.array_equal(samples, np.frombuffer(whole.content, dtype="<i2")), "every segment, in order"
    err = capsys.readouterr().err
    assert f"{len(texts)}/{len(texts)} segments" in err and "s audio, done in" in err
    assert f"wrote {out}" in err


def test_say_stdin_from_a_subprocess_pipe_writes_raw_pcm_to_standard_output(app: Flask, base_url: str) -> None:
    command = [sys.executable, "-m", "client", "say", "--stdin", "-o", "-", "--url", base_url, "--model", "espeak-en"]
    text = "Piped in from another program. Ünïcödé is fine too."
    done = subprocess.run(command, input=text.encode(), capture_output=True, cwd=ROOT, timeout=TIMEOUT_S, check=False)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    job_id = err.split("job ", 1)[1].split(":", 1)[0]
    assert " ".join(_texts(app, job_id)) == text
    whole = requests.get(f"{base_url}/v1/jobs/{job_id}/audio", timeout=30)
    assert len(done.stdout) > 22050 and done.stdout == whole.content
    assert "wrote standard output" in err


def test_say_needs_a_text_or_stdin_but_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as neither:
        main(["say", "-o", "x.wav"])
    with pytest.raises(SystemExit) as both:
        main(["say", "Hello.", "--stdin", "-o", "x.wav"])
    assert neither.value.code == both.value.code == 2
    err = capsys.readouterr().err
    assert "say needs a text, or --stdin" in err and "not both" in err


def test_say_stdin_to_standard_output_as_wav_writes_a_stream_header_then_each_segment(base_url: str) -> None:
    stdout = io.BytesIO()
    stdin = io.BytesIO(b"Written to standard output. As a wave stream.")
    argv = ["say", "--stdin", "-o", "-", "--format", "wav", "--url", base_url, "--model", "espeak-en"]
    assert main(argv, stdin=stdin, stdout=stdout) == 0
    audio = stdout.getvalue()
    assert audio[:4] == b"RIFF" and audio[4:8] == b"\xff\xff\xff\xff", "a stream's header: the length is unknown"
    samples, rate = sf.read(io.BytesIO(audio), dtype="int16")
    assert rate == 22050 and len(samples) == (len(audio) - 44) // 2 and len(samples) / rate > 1


def test_say_stdin_with_nothing_a_voice_can_speak_fails_with_a_reason(
    base_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "silence.wav"
    argv = ["say", "--stdin", "-o", str(out), "--url", base_url, "--model", "espeak-en"]
    assert main(argv, stdin=io.BytesIO(b"")) == 1
    assert "nothing a voice can speak" in capsys.readouterr().err  # the service says so: the job failed
    assert not out.exists()


def test_say_stdin_with_input_that_is_not_utf8_text_says_so_exits_1_and_cancels_its_job(
    base_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the bytes were spoken as U+FFFD, with no word that the input was not text."""
    session = RecordingSession()
    argv = ["say", "--stdin", "-o", str(tmp_path / "out.wav"), "--url", base_url, "--model", "espeak-en"]
    with session:
        status = main(argv, session=session, stdin=io.BytesIO(b"Hello there. \xff\xfe and more."))
    err = capsys.readouterr().err
    assert status == 1 and "not UTF-8 text (byte 13" in err and "Traceback" not in err, err
    (job,) = session.jobs
    with TTSClient(base_url) as client:
        assert client.status(job["id"])["status"] == "canceled"

"""POST /v1/audio/speech: OpenAI-compatible speech, chunked as its fragments are made."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import redis
from flask import Blueprint, Response, g, request

from api.contract import JobBody, SpeechBody
from api.holds import Hold, departure, held_response
from api.jobs import cancel, cancel_known, finished_file, submit_input
from api.services import Services, services
from api.streaming import audio_stream, wait_first_audio
from api.validation import read_body
from cache.records import JobStatus
from core.audio import media_type
from core.errors import Gone, JobFailed, ServiceError, ServiceUnavailable

log = logging.getLogger(__name__)

bp = Blueprint("speech", __name__, url_prefix="/v1/audio")

#: OpenAI's model names map to the default model.
OPENAI_MODELS = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15"})
#: OpenAI's voice names map to the voices every registry model has.
OPENAI_VOICES = {
    "alloy": "default", "ash": "male", "ballad": "male", "coral": "female", "echo": "male", "fable": "default",
    "onyx": "male", "nova": "female", "sage": "female", "shimmer": "female", "verse": "default", "marin": "female",
    "cedar": "male",
}  # fmt: skip
#: What is answered to a caller who hung up before its audio came (nginx's "client closed request"): nobody reads
#: it, but the access log and the request metrics say what happened.
CALLER_LEFT_STATUS = 499


class CallerLeft(Exception):
    """Raised when the caller hangs up while the route waits for its job's audio."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"the caller of job {job_id} left")
        self.job_id = job_id


def job_of(body: SpeechBody) -> JobBody:
    """Translate OpenAI's request into ours (both already checked by their models)."""
    return JobBody.model_construct(
        text=body.input,
        model=None if body.model in OPENAI_MODELS else body.model,
        voice=OPENAI_VOICES.get(body.voice, body.voice) if body.voice else None,
        speed=body.speed,
        mode="quality" if body.model == "tts-1-hd" else "balanced",
        format=body.response_format,
        priority="realtime",
        seed=None,
        cache=True,
    )


@bp.post("/speech")
def speech() -> Response:
    """Synthesise ``input`` and stream the audio back as it is made, a fragment at a time."""
    svc = services()
    body = read_body(
        request,
        SpeechBody,
        max_bytes=svc.settings.max_body_bytes,
        context={"max_text_chars": svc.settings.max_text_chars},
    )
    job_input = job_of(body)
    fmt = job_input.format
    gone = departure(request.environ)
    hold = svc.holds.hold(g.caller)  # before submitting: a refused stream leaves no job behind
    try:
        job_id = _submitted(job_input)
        waited = _wait_whole(job_id, hold, gone) if fmt == "flac" else _wait_first(job_id, gone)
        if waited is None:
            raise _no_audio(job_id)
        rate, total = waited
    except CallerLeft as left:
        hold.release()
        _abandon(svc, left.job_id, "while it waited for the audio")
        return Response(status=CALLER_LEFT_STATUS)
    except BaseException:
        hold.release()
        raise
    headers = {"X-Job-Id": job_id, "X-Sample-Rate": str(rate)}
    if fmt == "flac":  # FLAC's header states the length: wait for every segment, then send them one at a time
        return finished_file(job_id, fmt, rate, total, headers=headers, hold=hold)
    stream = audio_stream(svc.store, job_id, fmt=fmt, keepalive_s=svc.settings.stream_keepalive_s, gone=gone)
    return held_response(
        hold,
        _abandoned_if_cut_short(svc, job_id, stream),
        mimetype=media_type(fmt, rate),
        headers={**headers, "X-Accel-Buffering": "no"},
    )


def _submitted(job_input: JobBody) -> str:
    """Submit the translated request; an error about its ``text`` names the field this request calls ``input``."""
    try:
        return submit_input(job_input)
    except ServiceError as e:
        if e.details.get("field") == "text":
            e.details["field"] = "input"
            e.message = e.message.replace("text", "input", 1) if e.message.startswith("text") else e.message
            for listed in e.details.get("errors", ()):
                if listed.get("field") == "text":
                    listed["field"] = "input"
        raise


def _wait_first(job_id: str, gone: Callable[[], bool]) -> tuple[int, int] | None:
    """Wait for the job's first audio (its first fragment); return its sample rate and segment count (None: no
    audio came)."""
    svc = services()
    came = _wait_for(job_id, lambda turn: wait_first_audio(svc.store, job_id, turn), gone)
    record = svc.store.get(job_id)
    if not came or record is None or record.sample_rate is None:
        return None
    return record.sample_rate, record.segments_total


def _wait_whole(job_id: str, hold: Hold, gone: Callable[[], bool]) -> tuple[int, int] | None:
    """Wait for every segment of the job, renewing the caller's stream slot; return its rate and segment count
    (None: a segment did not come)."""
    svc = services()
    record = svc.store.get(job_id)
    total = record.segments_total if record else 0
    for index in range(total):
        hold.keep()
        if not _wait_for(job_id, _segment_of(svc, job_id, index), gone):
            return None
    record = svc.store.get(job_id)
    return ((record.sample_rate or 0) if record else 0), total


def _segment_of(svc: Services, job_id: str, index: int) -> Callable[[float], bool]:
    """Return a wait for segment ``index`` of up to the seconds given, which says whether it came."""
    return lambda turn: svc.store.wait_segment(job_id, index, turn) is not None


def _wait_for(job_id: str, came: Callable[[float], bool], gone: Callable[[], bool]) -> bool:
    """Wait up to TTS_MAX_WAIT_S for audio (``came(seconds)`` waits that long for it and says whether it came);
    say whether it came, or raise CallerLeft.

    Nothing is written to the caller while it waits, so no failed write tells that it left: it looks before each
    wait, and at every keep-alive interval while the audio is slow to come.
    """
    svc = services()
    deadline = time.monotonic() + svc.settings.max_wait_s
    while True:
        if gone():
            raise CallerLeft(job_id)
        remaining = deadline - time.monotonic()
        turn = max(0.0, min(svc.settings.stream_keepalive_s, remaining))
        if came(turn):
            return True
        record = svc.store.get(job_id)
        if turn >= remaining or record is None or record.status.terminal:
            return False


def _abandoned_if_cut_short(svc: Services, job_id: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Yield the growing stream; if it ends before its job does, the caller left (seen at an idle turn, or a
    write to it failed and the server closed the body), so cancel the job."""
    try:
        yield from chunks
    finally:
        _abandon(svc, job_id, "during its audio")


def _abandon(svc: Services, job_id: str, when: str) -> None:
    """Cancel the job of a caller who left, and log it; nothing for a job that already ended (or is gone)."""
    try:
        record = svc.store.get(job_id)
        if record is None or not cancel_known(svc, job_id, record.segments_total):
            return
    except redis.RedisError as e:
        log.warning("speech job %s: its caller left %s, and the job could not be canceled (%s)", job_id, when, e)
        return
    log.info(
        "speech job %s canceled: its caller left %s, %d of its %d segments made",
        job_id, when, record.segments_done, record.segments_total,
    )  # fmt: skip


def _no_audio(job_id: str) -> ServiceError:
    """Return what a caller is answered whose audio did not come: the failed job's reason, or, when it is still
    being made after TTS_MAX_WAIT_S, 503 with the job canceled.

    This route is one call returning audio: its caller (OpenAI's SDKs among them, which retry 409 and 5xx)
    follows no job, so one left running would be made for nobody, and each retry would add another.
    """
    svc = services()
    record = svc.store.get(job_id)
    if record is not None and record.status is JobStatus.DONE:  # its audio removed meanwhile (memory budget)
        return Gone(f"job {job_id} is done but its audio is no longer kept; ask again")
    if record is not None and record.status.terminal:
        return JobFailed(f"job {job_id} {record.status.value}: {record.error or 'no reason recorded'}")
    cancel(job_id)
    wait_s = svc.settings.max_wait_s
    return ServiceUnavailable(
        f"no audio within {wait_s:g} s (TTS_MAX_WAIT_S): the engines are busier than that, so the job was canceled; "
        "retry after Retry-After, or submit to POST /v1/jobs and follow the job there",
        retry_after=5,
        job_id=job_id,
    )

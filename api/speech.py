"""POST /v1/audio/speech: OpenAI-compatible speech, chunked as segments finish."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, request

from api.holds import Hold, held_response
from api.jobs import finished_file, submit_input
from api.services import services
from api.streaming import audio_stream
from api.validation import JobInput, read_json_object
from core.audio import media_type
from core.errors import NotReady, ValidationFailed

bp = Blueprint("speech", __name__, url_prefix="/v1/audio")

#: OpenAI's response formats → ours; aac has no encoder in libsndfile.
RESPONSE_FORMATS = {"mp3": "mp3", "opus": "opus", "flac": "flac", "wav": "wav", "pcm": "pcm"}
#: OpenAI's model names map to the default model.
OPENAI_MODELS = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts"})
#: OpenAI's voice names map to the voices every registry model has.
OPENAI_VOICES = {
    "alloy": "default", "ash": "male", "ballad": "male", "coral": "female", "echo": "male", "fable": "default",
    "onyx": "male", "nova": "female", "sage": "female", "shimmer": "female", "verse": "default",
}  # fmt: skip


def _speech_input(body: dict[str, Any], *, max_chars: int) -> JobInput:
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed("input", "is required and must be a non-empty string")
    if len(text) > max_chars:
        raise ValidationFailed("input", f"is {len(text)} characters; the limit is {max_chars}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValidationFailed("model", "must be a string")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise ValidationFailed("voice", "must be a string")
    fmt = body.get("response_format", "mp3")
    if fmt == "aac":
        raise ValidationFailed("response_format", "aac is not available here; use mp3, opus, flac, wav or pcm")
    if fmt not in RESPONSE_FORMATS:
        raise ValidationFailed("response_format", f"must be one of {sorted(RESPONSE_FORMATS)}")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0:
        raise ValidationFailed("speed", "must be a number between 0.5 and 2.0")
    return JobInput(
        text=text,
        model=None if model in OPENAI_MODELS else model,
        voice=OPENAI_VOICES.get(voice, voice) if voice else None,
        speed=float(speed),
        mode="quality" if model == "tts-1-hd" else "balanced",
        format=RESPONSE_FORMATS[fmt],
        priority="realtime",
        seed=None,
    )


@bp.post("/speech")
def speech() -> Response:
    """Synthesise ``input`` and stream the audio back as its segments finish."""
    svc = services()
    body = read_json_object(request, max_bytes=svc.settings.max_body_bytes)
    job_input = _speech_input(body, max_chars=svc.settings.max_text_chars)
    fmt = job_input.format
    hold = svc.holds.hold(g.caller)  # before submitting: a refused stream leaves no job behind
    try:
        job_id = submit_input(job_input)
        rate, total = _wait_whole(job_id, hold) if fmt == "flac" else _wait_first(job_id)
    except BaseException:
        hold.release()
        raise
    headers = {"X-Job-Id": job_id, "X-Sample-Rate": str(rate)}
    if fmt == "flac":  # FLAC's header states the length: wait for every segment, then send them one at a time
        return finished_file(job_id, fmt, rate, total, headers=headers, hold=hold)
    return held_response(
        hold,
        audio_stream(svc.store, job_id, fmt=fmt, keepalive_s=svc.settings.stream_keepalive_s),
        mimetype=media_type(fmt, rate),
        headers={**headers, "X-Accel-Buffering": "no"},
    )


def _wait_first(job_id: str) -> tuple[int, int]:
    """Wait for the job's first segment; return its sample rate and segment count."""
    svc = services()
    first = svc.store.wait_segment(job_id, 0, svc.settings.max_wait_s)
    record = svc.store.get(job_id)
    if first is None or record is None:
        raise NotReady(f"job {job_id} has produced no audio yet; follow it at /v1/jobs/{job_id}")
    return int(record["sample_rate"]), int(record["segments_total"])


def _wait_whole(job_id: str, hold: Hold) -> tuple[int, int]:
    """Wait for every segment of the job, renewing the caller's stream slot; return its rate and segment count."""
    svc = services()
    record = svc.store.get(job_id)
    total = int(record["segments_total"]) if record else 0
    for index in range(total):
        hold.keep()
        if svc.store.wait_segment(job_id, index, svc.settings.max_wait_s) is None:
            raise NotReady(f"job {job_id} is still running; follow it at /v1/jobs/{job_id}")
    record = svc.store.get(job_id)
    return (int(record["sample_rate"]) if record else 0), total

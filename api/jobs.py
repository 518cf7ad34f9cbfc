"""The /v1/jobs blueprint: submit, poll, fetch segments and the whole file, cancel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Blueprint, Response, g, request

from api.contract import JobBody, PieceView, TextPieceBody, TextStreamView, as_json
from api.downloads import FILE_CACHE_MAX_BYTES, download, kept
from api.holds import Hold, departure, held_response
from api.services import Services, services
from api.streaming import STREAMABLE, audio_stream, fragments_asked, resume_position, sse_events, wait_first_audio
from api.text_pieces import refuse_piece
from api.validation import parse_wait, read_body
from api.views import gone_message, job_not_found, job_view
from cache.idempotency import IdempotencyKeys, body_digest
from cache.records import JobRecord, JobStatus, PieceResult
from cache.sentences import file_key, segment_keys
from core.audio import encode, media_type, pcm16_duration
from core.errors import Gone, JobFailed, NotFound, NotReady, ValidationFailed

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")


def _record(job_id: str) -> JobRecord:
    """Return the job's record, or 404: for an unknown job, and for another caller's when keys are on."""
    record = services().store.get(job_id)
    if record is None or record.owner != g.owner:
        raise job_not_found(job_id)
    return record


def _raise_if_over(record: JobRecord) -> None:
    """Raise when the job's audio cannot come: the job failed or was canceled, or its audio is no longer kept."""
    if record.status in (JobStatus.FAILED, JobStatus.CANCELED):
        reason = record.error or "no reason recorded"
        raise JobFailed(f"job {record.status}: {reason}", status=record.status.value)
    _raise_if_gone(record)


def _raise_if_gone(record: JobRecord) -> None:
    """Raise 410 Gone when a finished job's audio is no longer kept."""
    if record.status is JobStatus.DONE and not services().store.has_audio(record.id):
        raise Gone(gone_message(record, job_ttl_s=services().settings.job_ttl_s), job_id=record.id)


def _sample_rate(record: JobRecord) -> int:
    """Return the job's sample rate, known once its first segment is written."""
    if record.sample_rate is None:
        raise NotReady("the job's first segment is not written yet; retry shortly", segments_done=record.segments_done)
    return record.sample_rate


@bp.post("")
def create_job() -> tuple[dict[str, Any], int, dict[str, str]]:
    """Accept text, answer 202 with the job id at once (the same job again for a repeated Idempotency-Key)."""
    svc = services()
    job_input = read_body(
        request, JobBody, max_bytes=svc.settings.max_body_bytes, context={"max_text_chars": svc.settings.max_text_chars}
    )
    idem_key = request.headers.get("Idempotency-Key")
    if idem_key is None:
        job_id = submit_input(job_input)
    else:
        if not 1 <= len(idem_key) <= 255 or not idem_key.isprintable():
            raise ValidationFailed("Idempotency-Key", "must be 1 to 255 printable characters")
        job_id = IdempotencyKeys(svc.redis).submit_once(
            g.caller, idem_key, body_digest(job_input.model_dump()),
            submit=lambda new_id: submit_input(job_input, job_id=new_id),
            exists=lambda known: svc.store.get(known) is not None,
        )  # fmt: skip
    svc.replication.ensure(
        f"job {job_id}",
        then=f"it may still run: poll /v1/jobs/{job_id}, or retry with the same Idempotency-Key, which returns it",
    )
    view = job_view(_record(job_id))
    return as_json(view), 202, {"Location": view.urls.self}


def submit_input(job_input: JobBody, *, job_id: str | None = None) -> str:
    """Submit a checked request for the caller with the app's services (as job ``job_id``, if given); return the
    job id."""
    svc = services()
    return svc.submitter.submit(
        job_input, owner=g.owner, cache_scope=g.caller if svc.settings.cache_per_caller else "", caller=g.caller,
        job_id=job_id,
    )  # fmt: skip


@bp.post("/<job_id>/text")
def append_text(job_id: str) -> dict[str, Any]:
    """Take one piece of a text stream's text (in seq order; a retry is answered again and spoken once)."""
    svc = services()
    piece = read_body(
        request, TextPieceBody, max_bytes=svc.settings.max_body_bytes,
        context={"max_text_chars": svc.settings.max_text_chars},
    )  # fmt: skip
    if not piece.text and not piece.final:
        raise ValidationFailed("text", "must not be empty (only the final piece may be)")
    # The piece's own script checks the owner: one round trip for most pieces, which come many a second.
    answer = svc.text_streams.take(job_id, seq=piece.seq, text=piece.text, final=piece.final, owner=g.owner,
                                   store_full=svc.admission.store_full())  # fmt: skip
    refuse_piece(answer, job_id)
    svc.replication.ensure(f"piece {piece.seq} of job {job_id}", then="send the piece again: a repeat is spoken once")
    record = svc.store.get(job_id) if not answer.open else None  # closed: say why (the common case reads less)
    stream = TextStreamView(open=answer.open, next_seq=answer.next_seq,
                            end_reason=record.text_end_reason if record else None)  # fmt: skip
    view = PieceView(seq=piece.seq, duplicate=answer.result is PieceResult.DUPLICATE,
                     segments_total=answer.segments_total, text_stream=stream)  # fmt: skip
    return as_json(view)


@bp.get("/<job_id>")
def get_job(job_id: str) -> dict[str, Any]:
    """Return the job's status and progress."""
    return as_json(job_view(_record(job_id)))


@bp.delete("/<job_id>")
def cancel_job(job_id: str) -> dict[str, Any]:
    """Cancel the job; segments not yet made are skipped."""
    cancel(job_id)
    return as_json(job_view(_record(job_id)))


def cancel(job_id: str) -> None:
    """Cancel the job (unknown: 404) and take its segments off the deadline book; nothing for an ended job."""
    cancel_known(services(), job_id, _record(job_id).segments_total)


def cancel_known(svc: Services, job_id: str, segments_total: int) -> bool:
    """Cancel a job known to exist and take its segments off the deadline book; say whether it was still live."""
    if not svc.store.cancel(job_id):
        return False
    svc.book.remove(job_id, range(segments_total))
    return True


@bp.get("/<job_id>/segments/<int:index>")
def get_segment(job_id: str, index: int) -> Response:
    """Return one segment's audio, long-polling up to ?wait= seconds; 409 not_ready otherwise."""
    svc = services()
    record = _record(job_id)
    total = record.segments_total
    growing = bool(record.text_open) and not record.status.terminal and index < svc.settings.max_segments
    if index >= total and not growing:  # an open text stream's next ones may come
        raise NotFound(_no_such_segment(job_id, total, index))
    wait = parse_wait(request.args.get("wait"), limit=svc.settings.max_wait_s)
    pcm = svc.store.segment(job_id, index)
    if pcm is None and wait:
        with svc.holds.hold(g.caller):  # a long-poll that waits is held: it counts against the caller's streams
            pcm = svc.store.wait_segment(job_id, index, wait)
    if pcm is None:
        record = _record(job_id)
        _raise_if_over(record)
        if index >= record.segments_total and not record.text_open:  # the stream closed with fewer
            raise NotFound(_no_such_segment(job_id, record.segments_total, index))
        raise NotReady(
            f"segment {index} is not ready yet; retry, or long-poll with ?wait=<seconds up to "
            f"{svc.settings.max_wait_s:g}>",
            segments_done=record.segments_done,
        )
    if record.sample_rate is None:  # read before the job's first segment was written
        record = _record(job_id)
    fmt, rate = record.request.format, _sample_rate(record)
    return Response(
        encode(pcm, rate, fmt),
        mimetype=media_type(fmt, rate),
        headers={
            "X-Segment-Index": str(index),
            "X-Segment-Duration": f"{pcm16_duration(pcm, rate):.3f}",
            "X-Sample-Rate": str(rate),
            "Cache-Control": "private, max-age=3600",
        },
    )


def _no_such_segment(job_id: str, total: int, index: int) -> str:
    held = f"segments 0..{total - 1}" if total > 1 else "segment 0" if total == 1 else "no segments"
    return f"job {job_id!r} has {held}, not segment {index}"


def _growing_audio(job_id: str, fmt: str) -> Response:
    svc = services()
    limit = svc.settings.max_wait_s
    wait = parse_wait(request.args.get("wait"), limit=limit) if "wait" in request.args else limit
    hold = svc.holds.hold(g.caller)
    try:
        came = wait_first_audio(svc.store, job_id, wait)  # the sample rate comes with the first audio
        record = _record(job_id)
        if not came:
            _raise_if_over(record)
            raise NotReady("segment 0 is not ready yet; retry shortly", segments_done=record.segments_done)
        rate = _sample_rate(record)
    except BaseException:
        hold.release()
        raise
    return held_response(
        hold,
        audio_stream(
            svc.store, job_id, fmt=fmt, keepalive_s=svc.settings.stream_keepalive_s, gone=departure(request.environ)
        ),
        mimetype=media_type(fmt, rate),
        headers={"X-Sample-Rate": str(rate), "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@bp.get("/<job_id>/events")
def get_events(job_id: str) -> Response:
    """Stream server-sent events: with ?fragments=1 one per fragment (id = index.n), and one per finished segment in
    order (id = index), then the job's end; Last-Event-ID resumes after the event it names."""
    record = _record(job_id)
    _raise_if_gone(record)  # its events would point at audio that is gone
    start = resume_position(request.headers.get("Last-Event-ID") or request.args.get("last_event_id"))
    fragments = fragments_asked(request.args.get("fragments"))
    segment_url = job_view(record).urls.segment
    svc = services()
    events = sse_events(
        svc.store, job_id, start=start, segment_url=segment_url, fragments=fragments,
        keepalive_s=svc.settings.stream_keepalive_s,
    )  # fmt: skip
    return held_response(
        svc.holds.hold(g.caller),
        events,
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@bp.get("/<job_id>/audio")
def get_audio(job_id: str) -> Response:
    """Return the whole audio: growing while the job runs, then encoded segment by segment as it is sent."""
    svc = services()
    if "wait" in request.args:  # checked whatever the job's state: a bad value is the caller's to know of
        parse_wait(request.args.get("wait"), limit=svc.settings.max_wait_s)
    record = _record(job_id)
    _raise_if_over(record)
    job_request = record.request
    fmt = job_request.format
    if record.status is not JobStatus.DONE:
        if fmt not in STREAMABLE:
            raise NotReady(
                f"job is {record.status} ({record.segments_done}/{record.segments_total} segments) and "
                f"{fmt} cannot grow while it runs; retry when done, or submit with format wav, pcm, mp3 or ogg",
                segments_done=record.segments_done,
            )
        return _growing_audio(job_id, fmt)
    rate = _sample_rate(record)
    suffix = "raw" if fmt == "pcm" else fmt
    headers = {"Content-Disposition": f'attachment; filename="{job_id}.{suffix}"', "X-Sample-Rate": str(rate)}
    data = cache_key = None
    if job_request.cache:
        spec = svc.registry.get(job_request.model, job_request.mode)
        cache_key = file_key(segment_keys(spec, job_request, svc.store.texts(job_id)), fmt)
        data = svc.cache.get_file(cache_key)
    if data is not None:
        return Response(data, mimetype=media_type(fmt, rate), headers=headers)
    return finished_file(job_id, fmt, rate, record.segments_total, headers=headers, cache_key=cache_key)


def finished_file(
    job_id: str,
    fmt: str,
    rate: int,
    total: int,
    *,
    headers: dict[str, str],
    cache_key: str | None = None,
    hold: Hold | None = None,
) -> Response:
    """Stream a finished job's file a segment at a time; a small one also fills the file cache at ``cache_key``."""
    svc = services()
    hold = hold or svc.holds.hold(g.caller)  # a long download is held as long as a stream
    try:
        found = download(svc.store, job_id, fmt=fmt, sample_rate=rate, total=total)
        if found is None:
            raise NotReady("job is done but a segment is missing; retry shortly")
    except BaseException:
        hold.release()
        raise
    chunks: Iterable[bytes] = found.chunks
    if cache_key is not None and found.pcm_bytes <= FILE_CACHE_MAX_BYTES:
        key = cache_key
        chunks = kept(found.chunks, lambda data: svc.cache.put_file(key, data))
    if found.length is not None:
        headers = {**headers, "Content-Length": str(found.length)}
    return held_response(hold, chunks, mimetype=media_type(fmt, rate), headers=headers)

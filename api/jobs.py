"""The /v1/jobs blueprint: submit, poll, fetch segments and the whole file, cancel."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, request, stream_with_context, url_for

from api.services import services
from api.streaming import STREAMABLE, audio_stream, sse_events
from api.submission import submit_job
from api.validation import JobInput, parse_job, parse_wait, read_json_object
from cache.idempotency import IdempotencyKeys, body_digest
from cache.jobstore import JobRequest
from cache.sentences import file_key, segment_keys
from core.audio import encode, media_type, pcm16_duration
from core.errors import JobFailed, NotFound, NotReady, ServiceUnavailable, ValidationFailed

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")


def job_view(record: dict[str, str]) -> dict[str, Any]:
    """Render a job record as the JSON the HTTP contract promises."""
    job_id = record["id"]
    req = JobRequest.from_json(record["request"])
    total = int(record["segments_total"])
    done = int(record["segments_done"])
    view: dict[str, Any] = {
        "id": job_id,
        "status": record["status"],
        "segments_total": total,
        "segments_done": done,
        "cached_segments": int(record.get("cached_segments", 0)),
        "progress": round(done / total, 4) if total else 1.0,
        "model": req.model,
        "voice": req.voice,
        "format": req.format,
        "priority": req.priority,
        "speed": req.speed,
        "mode": req.mode,
        "seed": req.seed,
        "chars_total": int(record.get("chars_total", 0)),
        "created_at": float(record["created_at"]),
        "started_at": float(record["started_at"]) if "started_at" in record else None,
        "finished_at": float(record["finished_at"]) if "finished_at" in record else None,
        "sample_rate": int(record["sample_rate"]) if "sample_rate" in record else None,
        "first_due_at": float(record["first_due_at"]) if "first_due_at" in record else None,
        "start_estimate_s": float(record["start_estimate_s"]) if "start_estimate_s" in record else None,
        "urls": {
            "self": url_for("jobs.get_job", job_id=job_id),
            "audio": url_for("jobs.get_audio", job_id=job_id),
            "events": url_for("jobs.get_events", job_id=job_id),
            "segment": url_for("jobs.get_segment", job_id=job_id, index=0).rsplit("/", 1)[0] + "/{index}",
        },
    }
    if "error" in record:
        view["error"] = record["error"]
    return view


def _record(job_id: str) -> dict[str, str]:
    record = services().store.get(job_id)
    if record is None:
        raise NotFound(f"no job {job_id!r} (unknown, or expired after its TTL)")
    return record


def _raise_if_over(record: dict[str, str]) -> None:
    if record["status"] in ("failed", "canceled"):
        raise JobFailed(f"job {record['status']}: {record.get('error', 'no reason recorded')}", status=record["status"])


@bp.post("")
def create_job() -> tuple[dict[str, Any], int, dict[str, str]]:
    """Accept text, answer 202 with the job id at once (the same job again for a repeated Idempotency-Key)."""
    svc = services()
    body = read_json_object(request, max_bytes=svc.settings.max_body_bytes)
    job_input = parse_job(body, max_chars=svc.settings.max_text_chars)
    idem_key = request.headers.get("Idempotency-Key")
    if idem_key is None:
        job_id = submit_input(job_input)
    else:
        if not 1 <= len(idem_key) <= 255 or not idem_key.isprintable():
            raise ValidationFailed("Idempotency-Key", "must be 1 to 255 printable characters")
        keys, digest = IdempotencyKeys(svc.redis), body_digest(body)
        earlier = keys.claim(g.caller, idem_key, digest)
        if earlier is not None:
            if earlier[0] != digest:
                raise ValidationFailed("Idempotency-Key", "was already used with a different body")
            if not earlier[1]:
                raise ServiceUnavailable("a request with this Idempotency-Key is still being accepted", retry_after=1)
            job_id = earlier[1]
        else:
            try:
                job_id = submit_input(job_input)
            except Exception:
                keys.release(g.caller, idem_key)
                raise
            keys.fill(g.caller, idem_key, digest, job_id)
    view = job_view(_record(job_id))
    return view, 202, {"Location": view["urls"]["self"]}


def submit_input(job_input: JobInput) -> str:
    """Submit a checked request with the app's services; return the job id."""
    svc = services()
    return submit_job(
        job_input,
        settings=svc.settings,
        registry=svc.registry,
        store=svc.store,
        cache=svc.cache,
        enqueue=svc.enqueue,
        book=svc.book,
        admit=svc.admission.admit,
    )


@bp.get("/<job_id>")
def get_job(job_id: str) -> dict[str, Any]:
    """Return the job's status and progress."""
    return job_view(_record(job_id))


@bp.delete("/<job_id>")
def cancel_job(job_id: str) -> dict[str, Any]:
    """Cancel the job; segments not yet made are skipped."""
    record = _record(job_id)
    svc = services()
    if svc.store.cancel(job_id):
        svc.book.remove(job_id, range(int(record["segments_total"])))
    return job_view(_record(job_id))


@bp.get("/<job_id>/segments/<int:index>")
def get_segment(job_id: str, index: int) -> Response:
    """Return one segment's audio, long-polling up to ?wait= seconds; 409 not_ready otherwise."""
    svc = services()
    record = _record(job_id)
    total = int(record["segments_total"])
    if not 0 <= index < total:
        raise NotFound(f"job {job_id!r} has segments 0..{total - 1}, not {index}")
    wait = parse_wait(request.args.get("wait"), limit=svc.settings.max_wait_s)
    pcm = svc.store.wait_segment(job_id, index, wait) if wait else svc.store.segment(job_id, index)
    if pcm is None:
        record = _record(job_id)
        _raise_if_over(record)
        raise NotReady(
            f"segment {index} is not ready yet; retry, or long-poll with ?wait=<seconds up to "
            f"{svc.settings.max_wait_s:g}>",
            segments_done=int(record["segments_done"]),
        )
    if "sample_rate" not in record:  # read before the job's first segment was written
        record = _record(job_id)
    fmt = JobRequest.from_json(record["request"]).format
    rate = int(record["sample_rate"])
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


def _growing_audio(job_id: str, fmt: str) -> Response:
    store = services().store
    limit = services().settings.max_wait_s
    wait = parse_wait(request.args.get("wait"), limit=limit) if "wait" in request.args else limit
    first = store.wait_segment(job_id, 0, wait)  # the sample rate comes with segment 0
    record = _record(job_id)
    if first is None:
        _raise_if_over(record)
        raise NotReady("segment 0 is not ready yet; retry shortly", segments_done=int(record["segments_done"]))
    rate = int(record["sample_rate"])
    return Response(
        stream_with_context(audio_stream(store, job_id, fmt=fmt)),
        mimetype=media_type(fmt, rate),
        headers={"X-Sample-Rate": str(rate), "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@bp.get("/<job_id>/events")
def get_events(job_id: str) -> Response:
    """Stream server-sent events: one per finished segment in order (id = index), then the job's end."""
    record = _record(job_id)
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    start = 0
    if raw is not None:
        try:
            start = int(raw) + 1
        except ValueError as e:
            raise ValidationFailed("Last-Event-ID", "must be the integer id of a segment event") from e
        if start < 0:
            raise ValidationFailed("Last-Event-ID", "must not be negative")
    segment_url = job_view(record)["urls"]["segment"]
    return Response(
        stream_with_context(sse_events(services().store, job_id, start=start, segment_url=segment_url)),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@bp.get("/<job_id>/audio")
def get_audio(job_id: str) -> Response:
    """Return the whole audio file once the job is done, encoded once and kept."""
    svc = services()
    record = _record(job_id)
    _raise_if_over(record)
    job_request = JobRequest.from_json(record["request"])
    fmt = job_request.format
    if record["status"] != "done":
        if fmt not in STREAMABLE:
            raise NotReady(
                f"job is {record['status']} ({record['segments_done']}/{record['segments_total']} segments) and "
                f"{fmt} cannot grow while it runs; retry when done, or submit with format wav, pcm, mp3 or ogg",
                segments_done=int(record["segments_done"]),
            )
        return _growing_audio(job_id, fmt)
    rate = int(record["sample_rate"])
    data = svc.store.cached_file(job_id, fmt)
    if data is None:
        parts = svc.store.segments(job_id, int(record["segments_total"]))
        if any(p is None for p in parts):
            raise NotReady("job is done but a segment is missing; retry shortly")
        data = encode(b"".join(p for p in parts if p is not None), rate, fmt)
        svc.store.store_file(job_id, fmt, data)
        if job_request.cache:
            spec = svc.registry.get(job_request.model)
            svc.cache.put_file(file_key(segment_keys(spec, job_request, svc.store.texts(job_id)), fmt), data)
    suffix = "raw" if fmt == "pcm" else fmt
    return Response(
        data,
        mimetype=media_type(fmt, rate),
        headers={"Content-Disposition": f'attachment; filename="{job_id}.{suffix}"', "X-Sample-Rate": str(rate)},
    )

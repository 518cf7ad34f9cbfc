"""The /v1/jobs blueprint: submit, poll, fetch segments and the whole file, cancel."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request, url_for

from api.services import services
from api.submission import submit_job
from api.validation import parse_job, parse_wait, read_json_object
from cache.jobstore import JobRequest
from cache.sentences import file_key, segment_keys
from core.audio import encode, media_type, pcm16_duration
from core.errors import JobFailed, NotFound, NotReady

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
        "urls": {
            "self": url_for("jobs.get_job", job_id=job_id),
            "audio": url_for("jobs.get_audio", job_id=job_id),
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
    """Accept text, answer 202 with the job id at once."""
    svc = services()
    body = read_json_object(request, max_bytes=svc.settings.max_body_bytes)
    job_input = parse_job(body, max_chars=svc.settings.max_text_chars)
    job_id = submit_job(
        job_input,
        settings=svc.settings,
        registry=svc.registry,
        store=svc.store,
        cache=svc.cache,
        enqueue=svc.enqueue,
    )
    view = job_view(_record(job_id))
    return view, 202, {"Location": view["urls"]["self"]}


@bp.get("/<job_id>")
def get_job(job_id: str) -> dict[str, Any]:
    """Return the job's status and progress."""
    return job_view(_record(job_id))


@bp.delete("/<job_id>")
def cancel_job(job_id: str) -> dict[str, Any]:
    """Cancel the job; segments not yet made are skipped."""
    _record(job_id)
    services().store.cancel(job_id)
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


@bp.get("/<job_id>/audio")
def get_audio(job_id: str) -> Response:
    """Return the whole audio file once the job is done, encoded once and kept."""
    svc = services()
    record = _record(job_id)
    _raise_if_over(record)
    if record["status"] != "done":
        raise NotReady(
            f"job is {record['status']} ({record['segments_done']}/{record['segments_total']} segments); "
            "fetch segments as they finish, or retry when done",
            segments_done=int(record["segments_done"]),
        )
    job_request = JobRequest.from_json(record["request"])
    fmt = job_request.format
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

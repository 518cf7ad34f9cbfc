"""One WebSocket for voice agents: text in, audio out, on one connection (``/v1/jobs/stream``).

The connection is a text stream (cache/text_streams.py) with its follower. The client's first message opens the
job: a JSON object with the fields of ``POST /v1/jobs`` (``text`` optional). Then each text message is a piece
(``{"text": "..."}``, or the text itself), and ``{"final": true}`` (or ``{"text": "...", "final": true}``) ends
the text. The server answers with JSON events and binary frames: ``{"type": "job", ...}`` once,
``{"type": "planned", "seq", "segments_total"}`` whenever a piece completes a sentence, then for each
segment in order ``{"type": "segment", "index", "duration_s", "bytes"}`` followed by one binary frame (the
segment's audio in the job's format), and at the end ``{"type": "done"}`` (or ``failed``/``canceled``). A bad
message gets ``{"type": "error", "error": {...}}``, the same error body as HTTP, and the connection closes.

Flask-Sock (on simple-websocket) runs the route under gunicorn's gevent worker: the connection is a greenlet
that reads, and its follower is a second one that waits on the process's one ``XREAD`` loop like an event
stream; it holds one stream slot (api/holds.py) for as long as it is open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any

import redis
from flask import Blueprint, Flask, g
from flask_sock import Sock
from pydantic import ValidationError
from simple_websocket import ConnectionClosed, Server

from api.contract import ErrorBody, ErrorDetail, JobBody
from api.services import Services, services
from api.streaming import Ended, Idle, follow
from api.text_pieces import refuse_piece
from api.validation import contract_error
from core.audio import encode
from core.errors import ServiceError, ServiceUnavailable, ValidationFailed

log = logging.getLogger(__name__)

bp = Blueprint("voice", __name__)
sock = Sock()
#: How long the first message (the job's fields) may take to arrive.
START_TIMEOUT_S = 30.0
#: A message larger than this closes the connection (a piece is a few tokens; the opening text at most a job's).
MAX_MESSAGE_BYTES = 1 << 20


class _Socket:
    """One connection's sends, serialised: the reader's errors and the follower's audio share the socket."""

    def __init__(self, ws: Server) -> None:
        self.ws = ws
        self._lock = threading.Lock()

    def event(self, kind: str, **data: Any) -> None:
        with self._lock:
            self.ws.send(json.dumps({"type": kind, **data}, ensure_ascii=False))

    def audio(self, index: int, duration_s: float | None, payload: bytes) -> None:
        with self._lock:
            self.ws.send(json.dumps({"type": "segment", "index": index, "duration_s": duration_s,
                                     "bytes": len(payload)}))  # fmt: skip
            self.ws.send(payload)

    def error(self, error: ServiceError) -> None:
        body = ErrorBody(error=ErrorDetail(code=error.code, message=error.message, **error.details))
        self.event("error", status=error.status, **body.model_dump(exclude_none=True))


def _message(raw: str | bytes | None) -> dict[str, Any]:
    """Parse one client message: a JSON object, or bare text (a piece)."""
    if raw is None:
        raise ValidationFailed("message", f"no message within {START_TIMEOUT_S:g} s")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        found = json.loads(text)
    except ValueError:
        return {"text": text}
    if not isinstance(found, dict):
        return {"text": text}
    return found


def _follow(svc: Services, job_id: str, out: _Socket) -> None:
    """Send each segment as it is made, then how the job ended."""
    store = svc.store
    try:
        for event in follow(store, job_id):
            if isinstance(event, Idle):
                continue
            if isinstance(event, Ended):
                out.event(event.status, **({"error": event.error} if event.error else {}))
                return
            meta = store.segment_meta_one(job_id, event.index)
            record = store.get(job_id)
            payload = svc.store.packed_segment(job_id, event.index)
            if payload is None or record is None:
                out.event("failed", error="the segment's audio is no longer kept")
                return
            audio = encode(payload.pcm(), record.sample_rate or 0, record.request.format)
            out.audio(event.index, meta.get("duration_s"), audio)
    except ConnectionClosed:
        return


def _open(svc: Services, first: dict[str, Any]) -> str:
    try:
        body = JobBody.model_validate({**first, "text_stream": True},
                                      context={"max_text_chars": svc.settings.max_text_chars})  # fmt: skip
    except ValidationError as e:
        raise contract_error(e, JobBody) from None
    return svc.submitter.submit(
        body, owner=g.owner, cache_scope=g.caller if svc.settings.cache_per_caller else "", caller=g.caller
    )


@sock.route("/v1/jobs/stream", bp=bp)  # type: ignore[untyped-decorator]
def voice_socket(ws: Server) -> None:
    """Open a text stream, take its pieces as messages, and send its audio back on the same connection."""
    svc, out = services(), _Socket(ws)
    job_id = None
    try:
        with svc.holds.hold(g.caller) as hold:
            job_id = _open(svc, _message(ws.receive(timeout=START_TIMEOUT_S)))
            out.event("job", id=job_id)
            follower = threading.Thread(target=_follow, args=(svc, job_id, out), name=f"ws-{job_id}", daemon=True)
            follower.start()
            seq, final, planned = 0, False, 0
            while not final and ws.connected:
                raw = ws.receive(timeout=svc.settings.text_stream_idle_s)
                if raw is None:
                    break  # idle: the stream ends by itself (TTS_TEXT_STREAM_IDLE_S), and the follower says so
                message = _message(raw)
                text, final = message.get("text", ""), message.get("final") is True
                if not isinstance(text, str) or (not text and not final):
                    raise ValidationFailed("text", "must be a non-empty string (only the final message may be empty)")
                if len(text) > svc.settings.max_text_chars:
                    raise ValidationFailed("text", f"is over {svc.settings.max_text_chars} characters")
                answer = svc.text_streams.take(job_id, seq=seq, text=text, final=final)
                refuse_piece(answer, job_id)
                if answer.segments_total > planned:  # the piece completed a sentence: say how many there are
                    planned = answer.segments_total
                    out.event("planned", seq=seq, segments_total=planned)
                seq += 1
                hold.keep()
            while follower.is_alive():
                follower.join(timeout=svc.holds.ttl_s / 3)
                hold.keep()
    except ConnectionClosed as e:
        log.info("voice socket of job %s closed by its client (%s)", job_id, e)
        if job_id is not None and svc.store.cancel(job_id):  # nobody will listen to the rest: skip it
            record = svc.store.get(job_id)
            svc.book.remove(job_id, range(record.segments_total if record else 0))
        return
    except redis.RedisError as e:
        log.warning("voice socket of job %s: the job store is unavailable (%s)", job_id, e)
        _send_error(out, ServiceUnavailable("the job store is unavailable; retry shortly", retry_after=1))
    except ServiceError as e:
        _send_error(out, e)


def _send_error(out: _Socket, error: ServiceError) -> None:
    with contextlib.suppress(ConnectionClosed):
        out.error(error)


def init_app(app: Flask) -> None:
    """Serve the voice socket (and cap its messages)."""
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"max_message_size": MAX_MESSAGE_BYTES, "ping_interval": 25})
    app.register_blueprint(bp)
    sock.init_app(app)

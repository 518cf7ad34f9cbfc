"""One WebSocket for voice agents: text in, audio out, on one connection (``/v1/jobs/stream``).

The connection is a text stream (cache/text_streams.py) with its follower. The client's first message opens the
job: a JSON object with the fields of ``POST /v1/jobs`` (``text`` optional). Then each text message is a piece
(``{"text": "..."}``, or the text itself), and ``{"final": true}`` (or ``{"text": "...", "final": true}``) ends
the text. The server answers with JSON events and binary frames: ``{"type": "job", ...}`` once,
``{"type": "planned", "seq", "segments_total"}`` whenever a piece completes a sentence, then the audio in order,
and at the end ``{"type": "done"}`` (or ``failed``/``canceled``). Every event with a ``bytes`` field is followed by
one binary frame of that many bytes.

The audio comes a segment at a time by default: ``{"type": "segment", "index", "duration_s", "bytes"}`` and the
segment's audio in the job's format. Connected as ``/v1/jobs/stream?fragments=1``, it comes a fragment at a time,
as the model makes it: ``{"type": "fragment", "index", "fragment", "samples", "duration_s", "sample_rate", "last",
"encoding", "bytes"}`` and the fragment's audio, in the job's format when it is wav or flac (each fragment a file
of its own) and otherwise raw 16-bit little-endian PCM (``"encoding": "pcm16"``: a lossy codec's fragments, each
encoded alone, would click where they join); after a segment's last fragment, ``{"type": "segment", "index",
"duration_s", "fragments"}`` with no frame. ``last`` is true on a fragment known, when sent, to end its segment.

A bad message (not a string ``text``, not a boolean ``final``, a lone surrogate escape) gets ``{"type": "error",
"error": {...}}``, the same error body as HTTP, and the connection closes. However the connection ends (the client
hangs up, an error, the server), a job whose end was not sent is canceled: nobody will hear the rest. While the
job store is full, a piece waits for room, and no further message is read meanwhile (the client's sends back up),
for up to ``TTS_STREAM_WRITE_TIMEOUT_S``; then its ``store_full`` error ends the stream (each try keeps the stream
from counting as idle).

Flask-Sock (on simple-websocket) runs the route under gunicorn's gevent worker: the connection is a greenlet
that reads, and its follower is a second one that waits on the process's one ``XREAD`` loop like an event
stream; it holds one stream slot (api/holds.py) for as long as it is open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from flask import Blueprint, Flask, g, request
from flask_sock import Sock
from pydantic import ValidationError
from simple_websocket import ConnectionClosed, Server

from api.contract import ErrorBody, ErrorDetail, JobBody
from api.errors import retry_after_of
from api.holds import Hold
from api.jobs import cancel
from api.services import Services, services
from api.streaming import Ended, Fragment, Idle, Ready, follow, follow_fragments, fragment_fields, fragments_asked
from api.text_pieces import refuse_piece
from api.timeouts import within
from api.validation import contract_error
from cache.nodes import close_log, open_log
from cache.records import PieceResult
from cache.text_streams import PieceAnswer
from core.audio import encode
from core.errors import BadRequest, NotFound, ServiceError, ServiceUnavailable, ValidationFailed

log = logging.getLogger(__name__)

bp = Blueprint("voice", __name__)
sock = Sock()
#: How long the first message (the job's fields) may take to arrive.
START_TIMEOUT_S = 30.0
#: What the opening message must be.
_OPENING = 'open with a JSON object of POST /v1/jobs\'s fields, such as {"model": "espeak-en"}'
#: A message larger than this closes the connection (a piece is a few tokens; the opening text at most a job's).
MAX_MESSAGE_BYTES = 1 << 20
#: After the final piece, how often the connection looks whether its follower has sent the job's end (a client that
#: hangs up is noticed at once).
FOLLOW_CHECK_S = 0.5
#: While the job store is full, how often a piece that waits for room tries again.
ROOM_CHECK_S = 0.5


class _WholeWrites:
    """The client's socket as simple-websocket writes to it: each write whole, one at a time, and bounded.

    simple-websocket sends a frame with one ``send`` and drops what a full send buffer did not take: under gevent a
    client that read slower than its audio came got frames cut short and the rest of its stream misread as frames
    (found by a black-box probe; the job said done, nothing was logged). Here each write is a ``sendall``, under a
    lock (simple-websocket's reader answers pings from its own greenlet while the follower sends audio), and must
    finish within ``timeout_s``: a client that takes nothing for that long has its connection shut (a frame may be
    half out), which ends the socket, and its job is canceled.
    """

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self._sock = sock
        self._timeout_s = timeout_s
        self._lock = threading.Lock()

    def send(self, data: bytes) -> int:
        with self._lock:
            try:
                with within(self._timeout_s, "a write to the voice socket's client"):
                    self._sock.sendall(data)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
                raise
        return len(data)

    def __getattr__(self, name: str) -> Any:  # fileno, recv, close: the socket's own
        return getattr(self._sock, name)


@bp.before_request
def _whole_writes() -> None:
    """Have the voice socket's frames written whole (before Flask-Sock's Server takes the connection's socket)."""
    for key in ("gunicorn.socket", "werkzeug.socket"):
        sock = request.environ.get(key)
        if sock is not None and not isinstance(sock, _WholeWrites):
            request.environ[key] = _WholeWrites(sock, services().settings.stream_write_timeout_s)


class _Socket:
    """One connection's sends, serialised: the reader's errors and the follower's audio share the socket."""

    def __init__(self, ws: Server, confirm: Callable[[], None]) -> None:
        self.ws = ws
        self.confirm = confirm  # what a send says was read from a node that a replica confirmed (api/served.py)
        self._lock = threading.Lock()
        self._open = True
        self._ended = False

    def event(self, kind: str, **data: Any) -> None:
        self.confirm()
        with self._lock:
            self._send_json(kind, data)

    def end(self, kind: str, **data: Any) -> None:
        """Send how the job ended (``done``, ``failed``, ``canceled``), and remember that the client has it."""
        self.confirm()
        with self._lock:
            self._send_json(kind, data)
            self._ended = True

    def audio(self, kind: str, payload: bytes, **data: Any) -> None:
        """Send an event that announces audio (``bytes``), then the audio as one binary frame."""
        self.confirm()
        with self._lock:
            self._send_json(kind, {**data, "bytes": len(payload)})
            self.ws.send(payload)

    def error(self, error: ServiceError) -> None:
        """Send an error event, unconfirmed: it carries nothing that was read (and may be about the store)."""
        body = ErrorBody(error=ErrorDetail(code=error.code, message=error.message, **error.details))
        retry_after = retry_after_of(error)  # a WebSocket has no Retry-After header: the event says it
        extra = {} if retry_after is None else {"retry_after": retry_after}
        with self._lock:
            self._send_json("error", {"status": error.status, **extra, **body.model_dump(exclude_none=True)})

    def finish(self) -> bool:
        """Send nothing more (the follower stops at its next send); say whether the job's end reached the client."""
        with self._lock:
            self._open = False
            return self._ended

    def _send_json(self, kind: str, data: dict[str, Any]) -> None:
        self._check_open()
        self.ws.send(json.dumps({"type": kind, **data}, ensure_ascii=False))

    def _check_open(self) -> None:
        if not self._open:
            raise ConnectionClosed(message="the voice socket is finished")


def _message(raw: str | bytes | None, *, opening: bool = False) -> dict[str, Any]:
    """Parse one client message: a JSON object, or (after the opening one) bare text, a piece; raise 400 for a
    binary frame, an opening message that is not a JSON object, a message that starts as a JSON object but is not
    one (it would be spoken as its source), and one holding a lone surrogate."""
    if raw is None:
        raise ValidationFailed("message", f"no message within {START_TIMEOUT_S:g} s")
    if isinstance(raw, bytes):
        raise BadRequest("messages are text frames (a JSON object, or the text itself); this one was binary")
    text = raw
    try:
        found = json.loads(text)
    except (ValueError, RecursionError) as e:  # not JSON (or nested past the interpreter's limit)
        if opening or text.lstrip().startswith("{"):
            raise BadRequest(f"message is not valid JSON ({e}); {_OPENING if opening else 'send a JSON object'}, "
                             "or, after the first message, the text itself") from None  # fmt: skip
        return {"text": text}
    if not isinstance(found, dict):
        if opening:
            raise BadRequest(f"the first message is not a JSON object; {_OPENING}")
        return {"text": text}
    # A frame's text arrives as decoded UTF-8, so only an escape can carry a surrogate (json.loads takes a lone
    # one, which UTF-8, a frame and Redis cannot carry): look only then, by encoding what was parsed.
    if "\\u" in text and not _encodable(found):
        raise BadRequest(
            "message is not valid JSON: it holds a lone surrogate (an escape from \\ud800 to \\udfff without its "
            "other half), which is no character; send the character itself, or both halves of its pair"
        )
    return found


def _encodable(found: dict[str, Any]) -> bool:
    """Say whether a parsed message encodes to UTF-8 (no key or string in it holds a lone surrogate)."""
    try:
        json.dumps(found, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def _piece(message: dict[str, Any], *, max_chars: int) -> tuple[str, bool]:
    """Return a piece's text and whether it is the final one, or raise 422 naming the field that is wrong."""
    text, final = message.get("text", ""), message.get("final", False)
    if not isinstance(final, bool):
        raise ValidationFailed("final", "must be true or false (a JSON boolean)")
    if not isinstance(text, str) or (not text and not final):
        raise ValidationFailed("text", "must be a non-empty string (only the final message may be empty)")
    if len(text) > max_chars:
        raise ValidationFailed("text", f"is over {max_chars} characters")
    return text, final


#: The formats a fragment is sent in as a file of its own; any other is sent as raw 16-bit PCM.
FRAGMENT_FILES = frozenset({"wav", "flac"})


def _follow(svc: Services, job_id: str, out: _Socket, *, fragments: bool = False) -> None:
    """Send each segment (or, with ``fragments``, each fragment) as it is made, then how the job ended."""
    open_log()  # this thread's replies, confirmed before each send
    try:
        if fragments:
            _send_fragments(svc, job_id, out)
        else:
            _send_segments(svc, job_id, out)
    except ConnectionClosed:
        return
    except OSError as e:  # the client reset the connection, or took nothing for stream_write_timeout_s
        log.info("voice socket of job %s: its audio could not be sent (%s); the connection ends", job_id, e)
    except redis.RedisError as e:
        _store_away(out, job_id, e)
    finally:
        close_log()


def _send_segments(svc: Services, job_id: str, out: _Socket) -> None:
    store = svc.store
    for event in follow(store, job_id):
        if isinstance(event, Idle):
            continue
        if isinstance(event, Ended):
            out.end(event.status, **({"error": event.error} if event.error else {}))
            return
        meta = store.segment_meta_one(job_id, event.index)
        record = store.get(job_id)
        payload = store.packed_segment(job_id, event.index)
        if payload is None or record is None:
            out.event("failed", error="the segment's audio is no longer kept")
            return
        audio = encode(payload.pcm(), record.sample_rate or 0, record.request.format)
        out.audio("segment", audio, index=event.index, duration_s=meta.get("duration_s"))


def _send_fragments(svc: Services, job_id: str, out: _Socket) -> None:
    store = svc.store
    record = store.get(job_id)
    fmt = record.request.format if record is not None else "pcm"
    encoding = fmt if fmt in FRAGMENT_FILES else "pcm16"
    counts: dict[int, int] = {}
    for event in follow_fragments(store, job_id):
        if isinstance(event, Fragment):
            audio = encode(event.pcm, event.sample_rate, fmt) if encoding != "pcm16" else event.pcm
            counts[event.index] = event.number + 1
            out.audio("fragment", audio, **fragment_fields(event), encoding=encoding)
        elif isinstance(event, Ready):
            meta = store.segment_meta_one(job_id, event.index)
            out.event("segment", index=event.index, duration_s=meta.get("duration_s"),
                      fragments=counts.pop(event.index, None))  # fmt: skip
        elif isinstance(event, Ended):
            out.end(event.status, **({"error": event.error} if event.error else {}))
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
    svc = services()
    out = _Socket(ws, svc.replication.confirm_noted)
    job_id = None
    try:
        with svc.holds.hold(g.caller) as hold:
            fragments = fragments_asked(request.args.get("fragments"))
            job_id = _open(svc, _message(ws.receive(timeout=START_TIMEOUT_S), opening=True))
            out.event("job", id=job_id)
            follower = threading.Thread(target=_follow, args=(svc, job_id, out), kwargs={"fragments": fragments},
                                        name=f"ws-{job_id}", daemon=True)  # fmt: skip
            follower.start()
            seq, final, planned = 0, False, 0
            while not final and ws.connected:
                raw = ws.receive(timeout=svc.settings.text_stream_idle_s)
                if raw is None:
                    break  # idle: the stream ends by itself (TTS_TEXT_STREAM_IDLE_S), and the follower says so
                text, final = _piece(_message(raw), max_chars=svc.settings.max_text_chars)
                answer = _take_when_room(svc, job_id, seq=seq, text=text, final=final, hold=hold)
                refuse_piece(answer, job_id)
                if answer.segments_total > planned:  # the piece completed a sentence: say how many there are
                    planned = answer.segments_total
                    out.event("planned", seq=seq, segments_total=planned)
                seq += 1
                hold.keep()
            while follower.is_alive():
                # Reading, not joining: a client that hangs up now (barge-in) raises ConnectionClosed at once.
                # A message after the final piece has nothing to add and is dropped.
                ws.receive(timeout=FOLLOW_CHECK_S)
                hold.keep()
    except ConnectionClosed as e:
        log.info("voice socket of job %s closed (%s)", job_id, e)
    except OSError as e:  # a send to a client that reset the connection, or took nothing for too long
        log.info("voice socket of job %s ended: %s", job_id, e)
    except redis.RedisError as e:
        _store_away(out, job_id, e)
    except ServiceError as e:
        _send_error(out, e)
    finally:
        if not out.finish() and job_id is not None:  # the connection ends before the job's end: nobody will listen
            _cancel(job_id)


def _take_when_room(svc: Services, job_id: str, *, seq: int, text: str, final: bool, hold: Hold) -> PieceAnswer:
    """Take a piece; while the job store has no room for its text, try again every ``ROOM_CHECK_S`` for up to the
    stream's write timeout (the same time a client that takes nothing is given), keeping the stream's slot."""
    waited_from = None
    while True:
        answer = svc.text_streams.take(job_id, seq=seq, text=text, final=final, store_full=svc.admission.store_full())
        if answer.result is not PieceResult.NO_ROOM:
            return answer
        if waited_from is None:
            waited_from = time.monotonic()
            log.info("text stream %s: piece %d waits for room in the job store, which is full", job_id, seq)
        elif time.monotonic() - waited_from >= svc.settings.stream_write_timeout_s:
            return answer  # refused: its StoreFull ends the stream
        hold.keep()
        time.sleep(ROOM_CHECK_S)


def _cancel(job_id: str) -> None:
    """Cancel the job as DELETE does, unless it already ended (or is gone)."""
    try:
        cancel(job_id)
    except NotFound:
        pass
    except redis.RedisError as e:
        log.warning("voice socket of job %s ended; its job could not be canceled (%s)", job_id, e)


def _store_away(out: _Socket, job_id: str | None, error: redis.RedisError) -> None:
    """Tell the client that the job store is unavailable (Unreplicated too: it fails over)."""
    log.warning("voice socket of job %s: the job store is unavailable (%s)", job_id, error)
    _send_error(out, ServiceUnavailable("the job store is unavailable; retry shortly", retry_after=1))


def _send_error(out: _Socket, error: ServiceError) -> None:
    with contextlib.suppress(ConnectionClosed, OSError):
        out.error(error)


def init_app(app: Flask) -> None:
    """Serve the voice socket (and cap its messages)."""
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"max_message_size": MAX_MESSAGE_BYTES, "ping_interval": 25})
    app.register_blueprint(bp)
    sock.init_app(app)

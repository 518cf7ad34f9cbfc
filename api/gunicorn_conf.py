"""gunicorn's settings for the API: `make run` (scripts/run.sh) and the tests' real server both pass ``-c`` this file.

Where to bind and how many processes stay on the command line. This file is read by gunicorn's master before
it forks: it imports nothing of the app, which each worker loads after gevent has patched it (gunicorn imports
its gevent worker in the master for the "gevent" class too; nothing is patched until a worker starts).
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import resource
from typing import Any

from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

#: The codes api/errors.py gives these statuses, for the refusals gunicorn makes before the app sees a request.
_CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long", 417: "expectation_failed",
          431: "headers_too_large", 500: "internal_error", 501: "not_implemented"}  # fmt: skip
_ADVICE = {
    414: "the request line (method, path and query) is over 4,094 bytes; job ids are 32 characters",
    431: "the request's headers are over gunicorn's limits (100 headers of at most 8,190 bytes each)",
}


class _Written:
    """Stands in for the client's socket while gunicorn writes its own text/html refusal."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


class JsonErrorWorker(GeventWorker):  # type: ignore[misc]
    """gunicorn's gevent worker, whose own refusals (a request line or headers too large, a malformed request)
    are the JSON error every other answer uses, with the same status, instead of an HTML page."""

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        """Serve one request; a write that timed out (a held response whose client took nothing for the API's
        stream_write_timeout_s, api/holds.py) ends the connection with one log line, as a client's reset does,
        rather than gunicorn's "Socket error" traceback."""
        try:
            return super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            peer = addr[0] if addr else "?"
            self.log.info("closed the connection of %s: it took nothing of its response in time", peer)
            raise OSError(errno.EPIPE, "the client stopped reading") from None

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        written = _Written()
        super().handle_error(req, written, addr, exc)  # gunicorn classifies, logs and writes the access line
        head, _, page = written.data.decode("latin-1").partition("\r\n\r\n")
        status = int(head.split(" ", 2)[1]) if head.startswith("HTTP/") else 500
        found = re.search(r"</h1>(.*)</body>", page, re.DOTALL)
        detail = html.unescape(found.group(1)).strip() if found else ""
        message = _ADVICE.get(status, detail or "the request could not be read")
        body = json.dumps({"error": {"code": _CODES.get(status, "bad_request"), "message": message}}).encode()
        reason = head.split(" ", 2)[2] if head.count(" ") >= 2 else "Error"
        response = (
            f"HTTP/1.1 {status} {reason.splitlines()[0]}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        try:
            util.write_nonblock(client, response)
        except OSError:
            self.log.debug("Failed to send error message.")


# Held requests (event streams, long-polls, growing audio, downloads) wait on the network, not the CPU: as
# greenlets they cost a few kilobytes each, where a thread each would fill a fixed pool and leave every other
# request waiting. Their Redis waits share one loop per process (cache/events.py).
worker_class = JsonErrorWorker


# Room for every stream one process admits (TTS_MAX_STREAMS_PER_PROCESS, default 2000) and as many other
# requests again: a full set of streams still leaves connections for health probes and submissions.
def _streams_per_process() -> int:
    """Return TTS_MAX_STREAMS_PER_PROCESS (as core/settings checks it), or stop gunicorn naming a bad value."""
    raw = os.environ.get("TTS_MAX_STREAMS_PER_PROCESS", "2000")
    try:
        streams = int(raw)
    except ValueError:
        streams = 0
    if streams < 1:
        raise SystemExit(f"TTS_MAX_STREAMS_PER_PROCESS: {raw!r} is not a whole number of 1 or more")
    return streams


worker_connections = 2 * _streams_per_process()
#: Open files each process should be allowed: a socket per connection, plus Redis connections, logs and weight files
#: (deploy/ sets the same 65536). systemd and Docker often start a process with a soft limit of 1024.
OPEN_FILES_WANTED = max(65536, 2 * worker_connections)
timeout = 120
graceful_timeout = 10
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(M)sms'
# supervisord (or the tests) run and stop gunicorn; a control socket in $HOME would only collide between runs.
control_socket_disable = True


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> tuple[int, int]:
    """Raise the soft open-files limit to ``wanted``, never above the hard limit; return (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, hard  # a platform cap below the hard limit: on_starting warns
        soft = target
    return soft, hard


def on_starting(server: Any) -> None:
    """Give the master, and so every gunicorn process it forks, room for worker_connections sockets."""
    soft, hard = raise_open_files_limit()
    if soft != resource.RLIM_INFINITY and soft < worker_connections:
        server.log.warning(
            "open files limited to %d (hard limit %d), below worker_connections (%d): held streams past it fail; "
            "raise the hard limit (LimitNOFILE, docker --ulimit nofile)",
            soft,
            hard,
            worker_connections,
        )

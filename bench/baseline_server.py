"""The 'before' architecture: a plain synchronous HTTP server, one whole-text synthesis per request.

Like upstream ChatTTS's example server, it loads the model once in-process and answers
``POST /synthesize`` with the finished audio; calls to the engine are serialised under a lock, and a
threaded server lets callers queue on it. The same engine, registry and text normaliser as the service,
so the only difference is the architecture: no segmentation, no batching, no streaming.

Run as ``python -m bench.baseline_server --model chattts-tiny --port 8100``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.engine_limit import load_engine
from core.audio import encode, to_pcm16
from core.text.normalize import normalize

log = logging.getLogger("bench.baseline")


class BaselineServer(ThreadingHTTPServer):
    """A thread per connection, all waiting on one engine lock."""

    daemon_threads = True
    request_queue_size = 256  # the default of 5 would make 50 callers wait in TCP retries, not on the model

    def __init__(self, address: tuple[str, int], engine: Any, language: str) -> None:
        super().__init__(address, Handler)
        self.engine = engine
        self.language = language
        self.lock = threading.Lock()
        self.pending = 0
        self.pending_lock = threading.Lock()
        self.calls = 0
        self.busy_s = 0.0


class Handler(BaseHTTPRequestHandler):
    """POST /synthesize {"text", "seed"} → audio/wav; GET /healthz → 200."""

    protocol_version = "HTTP/1.1"
    server: BaselineServer

    def do_GET(self) -> None:
        """Answer the health check with the number of requests in hand."""
        if self.path != "/healthz":
            self._send(404, b"not found", "text/plain")
            return
        server = self.server
        state = {"pending": server.pending, "calls": server.calls, "busy_s": server.busy_s}
        self._send(200, json.dumps(state).encode(), "application/json")

    def do_POST(self) -> None:
        """Synthesise the whole text in one engine call and answer with the WAV."""
        from workers.engines.base import SynthesisRequest

        if self.path != "/synthesize":
            self._send(404, b"not found", "text/plain")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            text = normalize(str(body["text"]), language=self.server.language)
            request = SynthesisRequest(text=text, seed=body.get("seed"))
        except (ValueError, KeyError, TypeError) as e:
            self._send(400, str(e).encode(), "text/plain")
            return
        server = self.server
        engine = server.engine
        with server.pending_lock:
            server.pending += 1
        try:
            with server.lock:
                started = time.perf_counter()
                wave = engine.synthesize([request])[0]
                server.busy_s += time.perf_counter() - started
                server.calls += 1
        except Exception as e:  # the caller learns why; the server keeps serving
            log.exception("synthesis failed")
            self._send(500, f"{type(e).__name__}: {e}".encode(), "text/plain")
            return
        finally:
            with server.pending_lock:
                server.pending -= 1
        pcm = to_pcm16(wave)
        duration = len(wave) / engine.sample_rate
        self._send(200, encode(pcm, engine.sample_rate, "wav"), "audio/wav", {"X-Audio-Duration": f"{duration:.3f}"})

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: a log line per request would cost the benchmark CPU."""


def main(argv: list[str] | None = None) -> int:
    """Load the engine, then serve until killed."""
    parser = argparse.ArgumentParser(prog="python -m bench.baseline_server", description=__doc__)
    parser.add_argument("--model", default="chattts-tiny")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine, language = load_engine(args.model, torch_threads=args.torch_threads, device=args.device)
    server = BaselineServer((args.host, args.port), engine, language)
    log.info("baseline serving %s on http://%s:%d", args.model, args.host, args.port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

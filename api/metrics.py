"""Request metrics for every route, and the /metrics endpoint (merging gunicorn processes)."""

from __future__ import annotations

import os
import time

import redis
from flask import Blueprint, Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from api.services import services
from celery_config import QUEUES, queue_keys
from core.metrics import HTTP_REQUESTS, HTTP_SECONDS, QUEUE_DEPTH, SEGMENTS_OUTSTANDING

bp = Blueprint("metrics", __name__)


def _start_timer() -> None:
    g.request_started = time.perf_counter()


#: Label values come from these sets only: a caller choosing methods or paths cannot add series without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _record(response: Response) -> Response:
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"  # a route template, not a path
    method = request.method if request.method in METHODS else "other"
    HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
    started = g.get("request_started")
    if started is not None:
        HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)
    return response


def _update_queue_depth() -> None:
    svc = services()
    try:
        for lane in QUEUES:
            QUEUE_DEPTH.labels(lane).set(sum(int(svc.redis.llen(key)) for key in queue_keys(lane)))
        # Workers hold up to TTS_WORKER_CONCURRENCY segments each, so the lists above stay short
        # under load; the deadline books count everything accepted and not yet written.
        due, total = svc.book.due_by(time.time()), svc.book.outstanding()
        SEGMENTS_OUTSTANDING.labels("due").set(due)
        SEGMENTS_OUTSTANDING.labels("later").set(max(0, total - due))
    except redis.RedisError:
        pass  # the scrape still reports everything else


@bp.get("/metrics")
def metrics() -> Response:
    """Expose Prometheus metrics of every API process."""
    _update_queue_depth()
    registry: CollectorRegistry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


def init_app(app: Flask) -> None:
    """Time every request and serve /metrics."""
    app.before_request(_start_timer)
    app.after_request(_record)
    app.register_blueprint(bp)

"""Flat Celery settings, derived from the one settings object (Celery's config style)."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

from core.settings import Settings
from core.store_url import is_sentinel, parse_sentinel_url

#: Lanes, in the order a worker consumes them: realtime before batch.
QUEUES = ("realtime", "batch")

SYNTHESIZE_TASK = "tts.synthesize_segment"

# kombu's Redis transport keeps one list per queue and priority step, and a worker
# pops them step by step: every queue at step 0, then every queue at step 3, ...
# The deadline scheduler picks a segment's step from its slack when it is enqueued
# (core.schedule.priority_step); the worker then orders what it holds exactly.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"  # kombu's default separator, named here so queue depths can be read


def queue_keys(lane: str) -> list[str]:
    """Return the Redis lists that hold a lane's waiting tasks, one per priority step."""
    return [lane if step == 0 else f"{lane}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def sentinel_broker(url: str) -> tuple[str, dict[str, Any]]:
    """Return kombu's broker URL and transport options for a ``redis+sentinel://`` URL.

    kombu names a Sentinel group its own way: one ``sentinel://`` URL per Sentinel, joined by ``;``, the
    credentials and database on each, and the service as the ``master_name`` transport option.
    """
    target = parse_sentinel_url(url)
    auth = ""
    if target.username or target.password:
        auth = quote(target.username or "", safe="") + ":" + quote(target.password or "", safe="") + "@"
    hosts = ";".join(f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)
    options: dict[str, Any] = {"master_name": target.service}
    if target.sentinel_password:
        options["sentinel_kwargs"] = {"password": target.sentinel_password}
    return hosts, options


def celery_settings(settings: Settings) -> dict[str, Any]:
    """Return Celery's lowercase settings for this deployment."""
    # A redelivered message is re-run after this long; keep it well above the
    # longest unit of work (one segment) so a slow segment is not run twice.
    visibility_timeout = max(settings.visibility_timeout_s, 3 * settings.task_time_limit_s)
    transport = {
        "visibility_timeout": visibility_timeout,
        "socket_keepalive": True,
        "health_check_interval": 25,
        # Consume queues in the order given to -Q: realtime first.
        "queue_order_strategy": "priority",
        "priority_steps": list(PRIORITY_STEPS),
        "sep": PRIORITY_SEP,
    }
    broker_url = settings.redis_url
    if is_sentinel(broker_url):
        broker_url, sentinel_options = sentinel_broker(broker_url)
        transport.update(sentinel_options)
    conf: dict[str, Any] = {
        "broker_url": broker_url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # Job state lives in the job store; Celery results would only duplicate it.
        "task_ignore_result": True,
        "result_backend": None,
        # Never pickle: a pickle payload in Redis is remote code execution.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "result_accept_content": ["json"],
        # At-least-once: ack after the segment is written; requeue if the worker dies.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_time_limit": settings.task_time_limit_s,
        "task_soft_time_limit": max(1, settings.task_time_limit_s - 10),
        "task_default_queue": QUEUES[0],
        "task_create_missing_queues": True,
        # Threads: one process owns the models, and several segments are in
        # flight at once so the batcher can group them.
        "worker_pool": "threads",
        "worker_concurrency": settings.worker_concurrency,
        "worker_prefetch_multiplier": 1,
        # A thread pool cannot cancel a running task (Celery would log a traceback per task at every connection
        # loss, and let it run): it runs on, its write is idempotent, and a redelivery of it is skipped.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }
    if settings.redis_url.startswith("rediss://"):
        # kombu, given a rediss:// URL and no options, turns certificate checks off (CERT_NONE); redis-py's own
        # clients check them. The broker checks them too, against the system's CA store.
        conf["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return conf

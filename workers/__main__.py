"""Start one worker: ``python -m workers`` (one per GPU; see workers/launch.py)."""

from __future__ import annotations

import logging
import os
import socket
import sys

from celery import bootsteps
from celery.signals import task_received, worker_ready, worker_shutdown
from celery.worker.request import Request
from prometheus_client import start_http_server

from celery_config import QUEUES, SYNTHESIZE_TASK
from core.logs import setup_logging
from core.settings import Settings, load_settings
from workers.celery_app import celery_enqueue, create_celery
from workers.runtime import WorkerRuntime, attach
from workers.wiring import build_runtime

log = logging.getLogger("workers")


def _serve_metrics(port: int) -> None:
    """Serve Prometheus metrics on ``port`` (0: none), or say why not and go on."""
    if not port:
        return
    try:
        start_http_server(port)
        log.info("worker metrics on :%d/metrics", port)
    except OSError as e:
        # Serving beats observing: keep working, and say how to fix it.
        log.error("worker metrics off: port %d: %s; set TTS_METRICS_PORT to a free port", port, e)


def _connect_signals(runtime: WorkerRuntime, exit_status: list[int]) -> None:
    """Tie the runtime to Celery's worker: hold segments as delivered, start when ready, stop at shutdown."""

    @task_received.connect(weak=False)  # type: ignore[untyped-decorator]
    def _received(request: Request, **_: object) -> None:
        # A delivered message is in kombu's unacked hash for an hour if this process dies: hold its segment
        # now, not when a thread starts on it, so a death hands it on within heartbeats.
        if request.name == SYNTHESIZE_TASK:
            job_id, index = request.args
            if not runtime.synthesizer.received(str(job_id), int(index)):
                runtime.janitor.alarm()

    @worker_ready.connect(weak=False)  # type: ignore[untyped-decorator]
    def _ready(**_: object) -> None:
        runtime.start()

    @worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _shutdown(sender: object = None, **_: object) -> None:
        exit_status.append(int(getattr(sender, "exitcode", None) or 0))
        runtime.stop()


def forget_dropped_deliveries(runtime: WorkerRuntime) -> type[bootsteps.StartStopStep]:
    """Return a consumer step that, whenever Celery's consumer stops (its broker connection lost, before it
    connects again; or at shutdown), forgets the deliveries Celery has just dropped (``forget_unstarted``).

    Without it a retry waiting out its countdown when Redis restarted stayed "worked on" here for good: its hold
    was never released, and a redelivery of its message was taken for a copy of a delivery still running.
    """

    class ForgetDroppedDeliveries(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def stop(self, parent: object) -> None:
            forgotten = runtime.synthesizer.forget_unstarted()
            if forgotten:
                log.warning("the broker connection closed: forgot %d deliveries no thread had started (their "
                            "segments go back through the outbox)", forgotten)  # fmt: skip

    return ForgetDroppedDeliveries


def _worker_argv(settings: Settings, node: str) -> list[str]:
    """Return the Celery worker command line of this process."""
    return [
        "worker",
        "--hostname",
        node,
        "--queues",
        ",".join(QUEUES),
        "--pool",
        "threads",
        "--concurrency",
        str(settings.worker_concurrency),
        "--loglevel",
        settings.log_level,
        "--without-gossip",
        "--without-mingle",
    ]


def main() -> int:
    """Build the worker's runtime, run the Celery worker until it stops, and return its exit status."""
    settings = load_settings()
    setup_logging(settings.log_level, fmt=settings.log_format)
    node = f"tts-{os.environ.get('CUDA_VISIBLE_DEVICES') or 'cpu'}-{os.getpid()}@{socket.gethostname()}"
    app = create_celery(settings)
    import workers.tasks  # noqa: F401  (registers the tasks on the app)

    runtime = build_runtime(settings, hostname=node, enqueue=celery_enqueue(app))
    _serve_metrics(settings.metrics_port)
    attach(app, runtime)
    runtime.preload()  # models load in their own processes while Celery starts (seconds saved on every restart)
    # app.worker_main() drops the worker's exit status (celery's start() and click both swallow it), so take
    # it from the worker itself: one that stops on an "Unrecoverable error" (celery/kombu can, when the broker
    # connection drops) must exit non-zero, so that its supervisor (systemd Restart=on-failure) restarts it.
    exit_status: list[int] = []
    _connect_signals(runtime, exit_status)
    app.steps["consumer"].add(forget_dropped_deliveries(runtime))
    app.worker_main(_worker_argv(settings, node))
    return exit_status[-1] if exit_status else 0


if __name__ == "__main__":
    sys.exit(main())

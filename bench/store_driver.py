"""One driver process of `make bench-store`: a worker and its callers, on the service's own code, against one Redis.

The worker is the one ``python -m workers`` wires (``workers.wiring.build_runtime``), its engine replaced by the
stand-in (bench/store_engine.py). It takes each segment task off the broker as Celery's consumer does (kombu, the
ack after the task), holds and makes it as the task and its ``task_received`` signal do (workers/tasks.py,
workers/__main__.py), and beats and looks after its segments as ``WorkerRuntime.start`` does. The callers are
closed-loop clients of the API's own app (``api.create_app``) through Flask's test client: every Redis call an HTTP
request makes, without the HTTP server. Each submits a corpus text with a fresh seed, so the sentence cache never
answers it (POST /v1/jobs), reads the job's server-sent events with fragments to its end (GET
/v1/jobs/<id>/events?fragments=1), then submits the next.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event
from typing import Any

import numpy as np
from celery import Celery
from flask import Flask
from kombu.message import Message

from api import create_app
from api.contract import SEED_MAX
from bench.store_engine import StandInEngine
from bench.store_figures import COUNTS
from celery_config import QUEUES
from core.settings import Settings, load_settings
from workers.celery_app import celery_enqueue, create_celery
from workers.observers import MadeSegment, Observers, SegmentObserver
from workers.runtime import WorkerRuntime
from workers.segment import Outcome
from workers.wiring import batch_observer, build_runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverPlan:
    """What one driver process runs: its worker's name, its environment, its callers and their texts."""

    name: str
    env: dict[str, str]
    callers: int
    texts: list[str]
    speech: bytes  # the stand-in's speech bank: float32 samples at 24 kHz
    seed: int


class Tally(SegmentObserver):
    """Count what this process wrote and called into a shared array (COUNTS), which the bench reads."""

    def __init__(self, counts: SynchronizedArray[float]) -> None:
        self.counts = counts

    def add(self, **amounts: float) -> None:
        """Add to the named counts."""
        with self.counts.get_lock():
            for name, amount in amounts.items():
                self.counts[COUNTS.index(name)] += amount

    def written(self, made: MadeSegment, outcome: str) -> None:
        """Count a segment this worker wrote: its audio and its fragments."""
        if outcome == Outcome.WRITTEN.value:
            self.add(segments=1, audio_s=made.duration_s, fragments=len(made.fragments) or 1)


def worker_runtime(settings: Settings, plan: DriverPlan, tally: Tally) -> tuple[Celery, WorkerRuntime]:
    """Wire a worker as ``python -m workers`` does, with the stand-in engine and the tally among its observers."""
    app = create_celery(settings)
    runtime = build_runtime(settings, hostname=plan.name, enqueue=celery_enqueue(app))
    synthesizer = runtime.synthesizer
    synthesizer.backend = StandInEngine(
        np.frombuffer(plan.speech, dtype=np.float32),
        seconds_per_char=settings.seconds_per_char,
        schedule=settings.fragments,
        observe=batch_observer(synthesizer.stats),  # what the batcher records of each engine call
        seed=plan.seed,
    )
    synthesizer.observer = Observers([synthesizer.observer, tally])
    return app, runtime


def consume(app: Celery, runtime: WorkerRuntime, tally: Tally, halt: threading.Event) -> None:
    """Take segment tasks off the lanes' queues as Celery's consumer does, and run each as the task does."""
    synthesizer = runtime.synthesizer

    def handle(body: Any, message: Message) -> None:
        job_id, index = str(body[0][0]), int(body[0][1])  # protocol 2: [args, kwargs, embed]
        if not synthesizer.received(job_id, index):
            runtime.janitor.alarm()
        synthesizer.started(job_id, index)
        try:
            synthesizer.run(job_id, index, token=f"{message.headers['id']}:{message.headers.get('retries', 0)}")
        except Exception:
            log.exception("segment %d of job %s failed", index, job_id)
            tally.add(errors=1)
        finally:
            synthesizer.let_go(job_id, index)
            message.ack()  # type: ignore[no-untyped-call]

    queues = [app.amqp.queues[lane] for lane in QUEUES]  # created as missing, as the worker's are
    with (
        app.connection_for_read() as connection,
        connection.Consumer(queues, accept=["json"], callbacks=[handle]) as consumer,
    ):
        consumer.qos(prefetch_count=runtime.settings.worker_concurrency)  # Celery's: concurrency × multiplier 1
        while not halt.is_set():
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)


def call(app: Flask, plan: DriverPlan, number: int, tally: Tally, halt: threading.Event) -> None:
    """Submit a job, read its events with fragments to its end, and again, until ``halt``."""
    rng = random.Random(plan.seed * 1000 + number)
    client = app.test_client()
    while not halt.is_set():
        answer = client.post("/v1/jobs", json={"text": rng.choice(plan.texts), "seed": rng.randrange(SEED_MAX)})
        if answer.status_code in (429, 503):  # refused: back after its Retry-After, as a client is
            tally.add(refused=1)
            halt.wait(float(answer.headers.get("Retry-After", "1")))
            continue
        if answer.status_code != 202:
            log.warning("POST /v1/jobs answered %d: %s", answer.status_code, answer.get_data(as_text=True))
            tally.add(errors=1)
            continue
        events = client.get(f"/v1/jobs/{answer.get_json()['id']}/events?fragments=1", buffered=False)
        ended = b""
        try:
            for chunk in events.response:
                if halt.is_set():
                    return
                ended = chunk if isinstance(chunk, bytes) else chunk.encode()
        finally:
            events.close()
        tally.add(**({"jobs": 1} if ended.startswith(b"event: done") else {"errors": 1}))


def every(period_s: float, step: Callable[[], object], halt: threading.Event, name: str) -> threading.Thread:
    """Start a thread running ``step`` every ``period_s`` until ``halt``, logging what it raises (as upkeep does)."""

    def loop() -> None:
        while not halt.wait(period_s):
            try:
                step()
            except Exception:
                log.exception("%s failed", name)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def drive(plan: DriverPlan, counts: SynchronizedArray[float], ready: Event, go: Event, stop: Event) -> None:
    """Run one worker (at once) and its callers (from ``go``) until ``stop``; say ``ready`` once the worker is."""
    os.environ.update(plan.env)
    logging.basicConfig(level=logging.WARNING)  # before the app: it then leaves logging as it finds it
    settings = load_settings()
    tally = Tally(counts)
    celery, runtime = worker_runtime(settings, plan, tally)
    api = create_app()
    halt = threading.Event()
    runtime.announce()
    upkept: dict[str, float] = {"reconcile": 0.0, "trim": 0.0}
    every(settings.heartbeat_s, runtime.announce, halt, "heartbeat")
    every(settings.heartbeat_s, lambda: runtime.look_after(upkept), halt, "janitor")
    every(max(0.1, min(settings.heartbeat_s, settings.text_stream_flush_s / 3)), runtime.text_streams.sweep, halt,
          "text-stream sweep")  # fmt: skip
    consumer = threading.Thread(target=consume, args=(celery, runtime, tally, halt), name="consumer", daemon=True)
    consumer.start()
    ready.set()
    go.wait()  # the bench sets it before ``stop`` on every way out
    if not stop.is_set():
        for number in range(plan.callers):
            threading.Thread(target=call, args=(api, plan, number, tally, halt), daemon=True).start()
    stop.wait()
    halt.set()
    # The consumer closes its channel itself (kombu's finalizer would, at exit, on a connection already closed);
    # the other threads (all daemons) end with the process, mid-call or not.
    consumer.join(5)
    with contextlib.suppress(Exception):
        runtime.heartbeats.remove(plan.name)

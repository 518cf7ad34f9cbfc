"""A worker takes realtime-lane segments before batch-lane ones, whatever order they were queued in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kombu import Queue
from kombu.message import Message

from celery_config import QUEUES
from core.settings import load_settings
from tests.support.databases import spare_database
from workers.celery_app import celery_enqueue, create_celery


@pytest.fixture
def empty_broker(settings_env: dict[str, str]) -> Iterator[str]:
    """Return the URL of a database no worker consumes, emptied before and after."""
    with spare_database(settings_env["REDIS_URL"], 6) as url:
        yield url


def test_realtime_segments_are_consumed_before_batch_segments_queued_earlier(empty_broker: str) -> None:
    app = create_celery(load_settings(redis_url=empty_broker))
    enqueue = celery_enqueue(app)
    enqueue("book", [0, 1, 2], "batch")
    enqueue("listener", [0, 1], "realtime")
    taken: list[tuple[str, int]] = []

    def take(_: object, message: Message) -> None:
        (job_id, index), _, _ = message.decode()  # Celery's message body: args, kwargs, embed
        taken.append((job_id, index))
        message.ack()

    # What the worker does: one consumer of every lane, in QUEUES order (its -Q), one message in flight at a time.
    assert QUEUES == ("realtime", "batch")
    with app.connection_for_read() as connection:
        consumer = connection.Consumer([Queue(lane) for lane in QUEUES], callbacks=[take], accept=["json"])
        consumer.qos(prefetch_count=1)
        with consumer:
            while len(taken) < 5:
                connection.drain_events(timeout=5)
    app.close()
    assert taken == [("listener", 0), ("listener", 1), ("book", 0), ("book", 1), ("book", 2)]


def test_a_jobs_segment_tasks_reach_the_broker_in_one_round_trip_in_order(
    empty_broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A book's window is 64 tasks: one pipeline for them all, not a round trip each."""
    import redis

    sent_alone: list[object] = []
    pipelines: list[int] = []
    one_by_one, in_one_go = redis.Redis.execute_command, redis.client.Pipeline.execute

    def alone(self: redis.Redis, *args: object, **options: object) -> object:
        if args and args[0] == "LPUSH":
            sent_alone.append(args)
        return one_by_one(self, *args, **options)

    def together(self: redis.client.Pipeline, raise_on_error: bool = True) -> list[object]:
        pipelines.append(len(self.command_stack))
        return in_one_go(self, raise_on_error)

    monkeypatch.setattr(redis.Redis, "execute_command", alone)
    monkeypatch.setattr(redis.client.Pipeline, "execute", together)
    app = create_celery(load_settings(redis_url=empty_broker))
    celery_enqueue(app)("book", list(range(64)), "batch")
    monkeypatch.undo()
    assert sent_alone == [] and pipelines == [64]
    taken: list[int] = []
    with app.connection_for_read() as connection:
        take = lambda body, message: (taken.append(body[0][1]), message.ack())  # noqa: E731
        consumer = connection.Consumer([Queue("batch")], callbacks=[take], accept=["json"])
        with consumer:
            while len(taken) < 64:
                connection.drain_events(timeout=5)
    app.close()
    assert taken == list(range(64))

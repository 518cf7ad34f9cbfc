"""A busy consumer whose Redis dies is closed without an AttributeError, and its late acks land (workers/broker.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from tests.support.servers import RedisServer
from workers import broker


def _redis(folder: Path) -> RedisServer:
    """Start a Redis of the test's own (skipped locally without redis-server; in CI, a failure)."""
    try:
        server = RedisServer(folder)
    except RuntimeError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))
    server.start()
    return server


def test_a_busy_consumer_whose_redis_died_closes_cleanly_and_its_late_acks_land(tmp_path: Path) -> None:
    server = _redis(tmp_path)
    broker.install()
    tasks = Queue("t", Exchange("t"), "t")
    with Connection(server.url) as producer_connection:
        producer = producer_connection.Producer()
        for n in range(2):
            producer.publish({"n": n}, exchange=tasks.exchange, routing_key="t", declare=[tasks])
    connection = Connection(server.url)
    try:
        held = []  # acks_late: delivered, never acked
        consumer = connection.Consumer(tasks, callbacks=[lambda _, message: held.append(message)], accept=["json"])
        consumer.qos(prefetch_count=10)
        consumer.consume()
        # Like the worker's remote control: another channel, with an auto-delete fanout queue.
        control = Queue("c.pidbox", Exchange("c", type="fanout"), auto_delete=True)
        connection.Consumer(control, channel=connection.channel(), callbacks=[], accept=["json"]).consume()
        for _ in range(4):  # until both messages are held and a BRPOP waits on the empty queue
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.3)
        assert len(held) == 2 and connection.default_channel._in_poll
        server.kill()
        # What celery's consumer does on a connection loss (on_connection_error_after_connected):
        connection.collect(socket_timeout=1)
        connection.close()  # unpatched: AttributeError from restore_unacked, and the worker stops for good
        channel = held[0].channel
        assert channel.closed, "the close gave up at the lost BRPOP reply"
        server.start()  # Redis is back: a task that finishes after the reconnect acks through the old channel
        held[0].ack()
    finally:
        server.stop()


def test_a_delivery_a_full_redis_refuses_to_record_is_a_connection_error_not_an_unrecoverable_one(
    tmp_path: Path,
) -> None:
    import redis
    from kombu.transport import redis as kombu_redis

    server = _redis(tmp_path)
    broker.install()
    tasks = Queue("t", Exchange("t"), "t")
    try:
        with Connection(server.url) as connection:
            channel = connection.default_channel
            consumer = connection.Consumer(tasks, callbacks=[lambda *_: None], accept=["json"])
            consumer.qos(prefetch_count=10)
            info = {"delivery_tag": "d1", "delivery_info": {"exchange": "t", "routing_key": "t"}}
            raw = {"body": "{}", "properties": info, "content-type": "application/json"}
            message = channel.Message(raw, channel=channel)
            # Redis at its maxmemory: the MULTI that records the delivery is refused (what a worker met, and died of).
            channel.client.config_set("maxmemory", channel.client.info("memory")["used_memory"] // 2)
            assert kombu_redis.QoS.append is broker._append_or_reconnect
            with pytest.raises(redis.ConnectionError, match="refused to record a delivery"):
                channel.qos.append(message, "d1")
            assert redis.ConnectionError in connection.connection_errors, "which Celery's consumer reconnects on"
            channel.qos.restore_visible()  # as a (re)connecting consumer does: under a lock a full Redis refuses
    finally:
        server.stop()


def test_a_channel_records_and_acks_deliveries_through_one_client_per_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = _redis(tmp_path)
    broker.install()
    tasks = Queue("t", Exchange("t"), "t")
    built: list[int] = []
    init = redis.Redis.__init__

    def counted(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    connection = Connection(server.url)
    try:
        producer = connection.Producer()
        for n in range(5):
            producer.publish({"n": n}, exchange=tasks.exchange, routing_key="t", declare=[tasks])
        acked: list[int] = []

        def ack(body: dict[str, int], message: Any) -> None:
            message.ack()
            acked.append(body["n"])

        consumer = connection.Consumer(tasks, callbacks=[ack], accept=["json"])
        consumer.qos(prefetch_count=10)
        consumer.consume()
        channel = connection.default_channel
        channel._create_client()  # the first one, before counting
        monkeypatch.setattr(redis.Redis, "__init__", counted)
        while len(acked) < 5:
            connection.drain_events(timeout=5)
        assert sorted(acked) == list(range(5)) and not built, f"{len(built)} clients built for 5 records and acks"
        assert not channel._create_client().hlen(channel.unacked_key), "every ack landed"
        first = channel._create_client()
        channel._disconnect_pools()  # as a reconnect does: a new pool, and a client of its own
        assert channel._create_client() is not first and channel._create_client().ping()
    finally:
        connection.close()
        server.stop()

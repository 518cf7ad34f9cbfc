"""A worker writes each segment's fragments as its engine makes them, and the segment is exactly those fragments."""

from __future__ import annotations

import numpy as np
import redis
from flask.testing import FlaskClient

from cache import keys
from cache.jobstore import JobRequest, JobStore
from core.audio import to_pcm16
from tests.support.jobs import wait_done
from workers.engines.base import Piece
from workers.fragment_writer import FragmentWriter

REQUEST = JobRequest(model="chattts-tiny", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None)  # fmt: skip
RATE = 24000


def test_a_chattts_segment_is_written_in_fragments_that_join_into_it(
    served: FlaskClient, redis_client: redis.Redis
) -> None:
    text = "今天天气很好，我们一起去公园散步吧。然后我们回家吃饭，晚上早点睡觉。"
    response = served.post("/v1/jobs", json={"text": text, "model": "chattts-tiny"})
    assert response.status_code == 202, response.get_data(as_text=True)
    job_id = response.get_json()["id"]
    job = wait_done(served, job_id, timeout=120)
    assert job["status"] == "done", job
    store = JobStore(redis_client, ttl=600)
    events = [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in redis_client.xrange(keys.events(job_id))
    ]
    for index in range(job["segments_total"]):
        meta = store.segment_meta_one(job_id, index)
        pcm = store.segment(job_id, index)
        assert pcm is not None
        lengths = meta["fragments"]
        assert len(lengths) > 1 and sum(lengths) * 2 == len(pcm), meta
        # Every fragment but the segment's last was written on its own, in order, before the segment.
        numbers = [int(e["fragment"]) for e in events if e["type"] == "fragment" and int(e["index"]) == index]
        assert numbers == list(range(len(lengths) - 1))
        assert meta["first_at"] <= meta["finished_at"]
        found = store.fragments(job_id, index)
        assert found.complete and [len(p) // 2 for p in found.pcm] == lengths
        assert b"".join(found.pcm) == pcm
    assert not redis_client.exists(keys.fragments(job_id))  # the segments took them all


def _pieces(values: list[float], samples: int = 100) -> list[Piece]:
    return [Piece(n, np.full(samples, v, dtype=np.float32), last=n == len(values) - 1) for n, v in enumerate(values)]


def test_a_segment_made_again_neither_repeats_nor_skips_a_fragment(redis_client: redis.Redis) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = store.create(REQUEST, ["一段话"])
    # The first attempt writes three fragments, then its worker dies.
    first = FragmentWriter(store, job_id, 0)
    for piece in _pieces([0.1, 0.2, 0.3, 0.4, 0.5])[:3]:
        first(piece, RATE)
    heard = store.fragments(job_id, 0).pcm
    assert len(heard) == 3
    # The second attempt makes the segment again, a little differently (another batch, another rounding).
    again = FragmentWriter(store, job_id, 0)
    for piece in _pieces([0.11, 0.21, 0.31, 0.41, 0.51]):
        again(piece, RATE)
    joined = again.joined()
    expected = [*heard, to_pcm16(np.full(100, 0.41, dtype=np.float32)), to_pcm16(np.full(100, 0.51, dtype=np.float32))]
    assert joined.pcm == b"".join(expected)
    assert joined.lengths == [100] * 5
    assert joined.first_at is not None
    # What a listener read as it came: the first attempt's three, then the second's fourth (its last comes with the
    # segment), and no fragment twice.
    assert store.fragments(job_id, 0).pcm == expected[:4]


def test_a_segments_last_fragment_comes_with_the_segment_not_twice(redis_client: redis.Redis) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = store.create(REQUEST, ["一段话"])
    writer = FragmentWriter(store, job_id, 0)
    writer(Piece(0, np.full(50, 0.2, dtype=np.float32), last=True), RATE)
    assert store.fragments(job_id, 0).pcm == []
    assert writer.joined().lengths == [50]


def test_a_retried_engine_call_starts_the_fragments_again(redis_client: redis.Redis) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = store.create(REQUEST, ["一段话"])
    writer = FragmentWriter(store, job_id, 0)
    pieces = _pieces([0.1, 0.2, 0.3])
    writer(pieces[0], RATE)
    writer(pieces[1], RATE)
    for piece in pieces:  # its host died; the pool ran the call again on a new one
        writer(piece, RATE)
    assert writer.joined().lengths == [100, 100, 100]
    assert len(store.fragments(job_id, 0).pcm) == 2  # the last comes with the segment

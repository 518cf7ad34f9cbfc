"""Fragments in the job store: written once and in order, read the same before and after their segment is written."""

from __future__ import annotations

import redis

from cache import keys
from cache.jobstore import JobRequest, JobStore
from cache.records import FragmentResult, WriteResult

REQUEST = JobRequest(model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav",
                     priority="realtime", seed=None)  # fmt: skip
RATE = 24000


def pcm(value: int, samples: int) -> bytes:
    return int(value).to_bytes(2, "little", signed=True) * samples


def _store(client: redis.Redis) -> JobStore:
    return JobStore(client, ttl=600)


def test_fragments_are_written_once_and_in_order(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    job_id = store.create(REQUEST, ["one", "two"])
    assert store.write_fragment(job_id, 0, 0, pcm(1, 10), sample_rate=RATE) is FragmentResult.WRITTEN
    assert store.write_fragment(job_id, 0, 0, pcm(9, 10), sample_rate=RATE) is FragmentResult.DUPLICATE
    assert store.write_fragment(job_id, 0, 2, pcm(3, 10), sample_rate=RATE) is FragmentResult.OUT_OF_ORDER
    assert store.write_fragment(job_id, 0, 1, pcm(2, 20), sample_rate=RATE) is FragmentResult.WRITTEN
    found = store.fragments(job_id, 0)
    assert found.pcm == [pcm(1, 10), pcm(2, 20)] and not found.complete
    assert store.fragments(job_id, 0, first=1).pcm == [pcm(2, 20)]
    assert store.fragments(job_id, 1).pcm == []


def test_each_fragment_is_announced_with_when_it_was_written(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    job_id = store.create(REQUEST, ["one"])
    store.write_fragment(job_id, 0, 0, pcm(1, 10), sample_rate=RATE)
    [(_, fields)] = redis_client.xrange(keys.events(job_id))
    assert fields[b"type"] == b"fragment" and fields[b"index"] == b"0" and fields[b"fragment"] == b"0"
    assert float(fields[b"at"]) > 0


def test_a_written_segment_takes_its_fragments_and_is_read_in_the_same_cuts(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    job_id = store.create(REQUEST, ["one", "two"])
    parts = [pcm(1, 10), pcm(2, 20), pcm(3, 5)]
    for n, part in enumerate(parts[:2]):
        store.write_fragment(job_id, 0, n, part, sample_rate=RATE)
    write = store.write_segment(job_id, 0, b"".join(parts), sample_rate=RATE, meta={"fragments": [10, 20, 5]})
    assert write.result is WriteResult.WRITTEN
    assert redis_client.hlen(keys.fragments(job_id)) == 0
    found = store.fragments(job_id, 0)
    assert found.pcm == parts and found.complete
    assert store.fragments(job_id, 0, first=2).pcm == [parts[2]]
    assert store.write_fragment(job_id, 0, 2, parts[2], sample_rate=RATE) is FragmentResult.SEGMENT_WRITTEN


def test_a_segment_written_without_fragment_lengths_is_one_fragment(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    job_id = store.create(REQUEST, ["one"])
    store.write_segment(job_id, 0, pcm(4, 30), sample_rate=RATE, meta={})
    found = store.fragments(job_id, 0)
    assert found.pcm == [pcm(4, 30)] and found.complete


def test_no_fragment_is_written_to_a_job_that_ended_and_its_fragments_go_with_it(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    job_id = store.create(REQUEST, ["one"])
    store.write_fragment(job_id, 0, 0, pcm(1, 10), sample_rate=RATE)
    store.cancel(job_id)
    assert not redis_client.exists(keys.fragments(job_id))
    assert store.write_fragment(job_id, 0, 1, pcm(1, 10), sample_rate=RATE) is FragmentResult.OVER
    assert store.write_fragment("no-such-job", 0, 0, pcm(1, 10), sample_rate=RATE) is FragmentResult.GONE

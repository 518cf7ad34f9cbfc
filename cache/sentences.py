"""The sentence cache: finished segment audio shared by every API replica and worker.

A segment's audio is determined by the model (and its version), voice, seed,
mode, speed and normalised text; the key is a hash of exactly those, and of the
owner's caller id when the cache is scoped per caller (``TTS_CACHE_SCOPE``). Values are
the segment's packed audio (as the job store keeps it, core.audio.PackedAudio) plus
JSON metadata in a hash, never pickle. The cache may live on its own Redis with an
evicting policy: every failure here degrades to a miss. On the job store's Redis,
entries are listed by age (keys.CACHE_KEPT) for the memory budget to remove.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from cache import keys
from cache.connect import blocking_pool
from cache.jobstore import JobRequest
from core.audio import PackedAudio
from core.registry import ModelSpec
from core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedSegment:
    """One cached segment: its packed audio and what is needed to serve it."""

    audio: PackedAudio
    sample_rate: int
    meta: dict[str, Any]


def segment_key(
    *, model: str, version: str, voice: str, seed: int | None, mode: str, speed: float, text: str, scope: str = ""
) -> str:
    """Return the cache key of a segment: a hash of everything that determines its audio, and of whose it is."""
    fields: dict[str, object] = {
        "model": model,
        "version": version,
        "voice": voice,
        "seed": seed,
        "mode": mode,
        "speed": round(speed, 4),
        "text": text,
    }
    if scope:  # a shared entry's key stays what it was before scopes existed
        fields["scope"] = scope
    material = json.dumps(fields, sort_keys=True, ensure_ascii=False)
    return keys.sentence(hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest())


def segment_keys(spec: ModelSpec, request: JobRequest, texts: list[str]) -> list[str]:
    """Return the cache key of every segment of a job."""
    return [
        segment_key(
            model=spec.name,
            version=spec.version,
            voice=request.voice,
            seed=request.seed,
            mode=request.mode,
            speed=request.speed,
            text=text,
            scope=request.cache_scope,
        )
        for text in texts
    ]


def file_key(segment_keys: list[str], fmt: str) -> str:
    """Return the key of a whole encoded file made of exactly these segments in this format."""
    material = "\n".join([fmt, *segment_keys])
    return keys.cached_file(hashlib.sha256(material.encode()).hexdigest())


class SentenceCache:
    """Look up and store segment audio; a cache Redis that is down or evicting only causes misses."""

    def __init__(self, client: redis.Redis, *, ttl_s: int, enabled: bool = True, listed: bool = False) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self.enabled = enabled
        self.listed = listed  # list entries by age for the job store's memory budget (a shared Redis)

    def get_many(self, segment_keys: list[str]) -> list[CachedSegment | None]:
        """Return each key's cached segment or None, in one round trip."""
        if not self.enabled or not segment_keys:
            return [None] * len(segment_keys)
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key in segment_keys:
                pipe.hmget(key, ["audio", "rate", "meta"])
            replies = pipe.execute()
        except redis.RedisError as e:
            log.warning("sentence cache unavailable, treating as misses: %s", e)
            return [None] * len(segment_keys)
        found: list[CachedSegment | None] = []
        for audio, rate, meta in replies:
            if audio is None or rate is None or meta is None:
                found.append(None)  # absent, or partly evicted
                continue
            found.append(CachedSegment(PackedAudio(bytes(audio)), int(rate), json.loads(meta)))
        return found

    def put(self, segment_key: str, segment: CachedSegment) -> int:
        """Store a segment; return the bytes stored (0 when the cache is off or unavailable)."""
        if not self.enabled:
            return 0
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(
                segment_key,
                mapping={"audio": segment.audio.data, "rate": segment.sample_rate, "meta": json.dumps(segment.meta)},
            )
            pipe.expire(segment_key, self.ttl_s)
            self._list(pipe, segment_key)
            pipe.execute()
        except redis.RedisError as e:
            log.warning("sentence cache write failed: %s", e)
            return 0
        return len(segment.audio.data)

    def _list(self, pipe: redis.client.Pipeline, key: str) -> None:
        if self.listed:
            pipe.zadd(keys.CACHE_KEPT, {key: time.time()})

    def get_file(self, key: str) -> bytes | None:
        """Return a cached whole file, or None."""
        if not self.enabled:
            return None
        try:
            value = self.redis.get(key)
        except redis.RedisError as e:
            log.warning("file cache unavailable: %s", e)
            return None
        return value if isinstance(value, bytes) else None

    def put_file(self, key: str, data: bytes) -> None:
        """Store a whole encoded file."""
        if not self.enabled:
            return
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(key, data, ex=self.ttl_s)
            self._list(pipe, key)
            pipe.execute()
        except redis.RedisError as e:
            log.warning("file cache write failed: %s", e)


def build_cache(settings: Settings) -> SentenceCache:
    """Connect to the sentence cache's Redis (its own URL, or the job store's)."""
    # Short timeouts: a slow or absent cache must cost a miss, not a stalled request. A bounded pool that makes
    # a caller wait (up to a second) for a connection: an API under gevent runs lookups by the hundred at once.
    pool = blocking_pool(
        settings.cache_redis_url or settings.redis_url,
        max_connections=settings.api_redis_connections,
        timeout=1.0,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )
    client = redis.Redis(connection_pool=pool)
    shared = settings.cache_redis_url in (None, "", settings.redis_url)
    return SentenceCache(client, ttl_s=settings.cache_ttl_s, enabled=settings.cache_enabled, listed=shared)

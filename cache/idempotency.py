"""Idempotency keys: the same key and body return the same job; another body with the key is refused.

A key is claimed with the id its job will have, before the job is written. So a retry finds that job whatever
became of the request that claimed it: answered, or its API process killed between writing the job and
recording it under the key. Only a claim whose job was never written (its submission failed or died first)
is taken over, once it is ``CLAIM_TTL_S`` old.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from cache import keys
from core.errors import ServiceUnavailable, ValidationFailed

TTL_S = 24 * 3600
#: A claim whose job was never written (its submission died before writing it) is taken over after this long;
#: an honest submission writes its job well within it.
CLAIM_TTL_S = 15
#: How long a request waits for a concurrent one with the same key to write its job.
WAIT_S = 5.0

#: KEYS[1] the key; ARGV the claim read, the claim to write, ttl in s. Replaces only the claim that was read.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0
"""


def body_digest(body: dict[str, Any]) -> str:
    """Hash a request body independently of key order."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """What a key holds: the body's digest, the id of the job it creates, and whether that job was recorded."""

    digest: str
    job_id: str
    filled: bool
    claimed_at: float
    raw: bytes  # as stored: a take-over replaces exactly this

    @classmethod
    def parse(cls, raw: bytes) -> Claim:
        found = json.loads(raw)
        job_id = str(found.get("job_id") or "")
        # Written before claims carried their job's id: filled once it had one, else an old dead claim.
        filled = bool(found.get("filled", job_id))
        return cls(str(found["digest"]), job_id, filled, float(found.get("claimed_at", 0.0)), raw)


class IdempotencyKeys:
    """Remember which job each (caller, key) created, for a day (Stripe's model)."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = TTL_S, claim_ttl_s: int = CLAIM_TTL_S) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self.claim_ttl_s = claim_ttl_s
        self._take_over = client.register_script(TAKE_OVER)

    def submit_once(
        self, caller: str, key: str, digest: str, *, submit: Callable[[str], str], exists: Callable[[str], bool]
    ) -> str:
        """Return the job this key created, or claim the key and ``submit`` the job under a new id.

        ``submit(job_id)`` writes and enqueues the job; ``exists(job_id)`` says whether a job was written. Raise
        422 for the key used with another body, and 503 while a request with the key is still writing its job.
        """
        deadline = time.monotonic() + WAIT_S
        job_id = uuid.uuid4().hex
        while True:
            earlier = self.claim(caller, key, digest, job_id)
            if earlier is None:
                return self._submit(caller, key, digest, job_id, submit=submit, exists=exists)
            if earlier.digest != digest:
                raise ValidationFailed("Idempotency-Key", "was already used with a different body")
            if earlier.filled or (earlier.job_id and exists(earlier.job_id)):
                if not earlier.filled:  # its request died between writing the job and recording it here
                    self.fill(caller, key, digest, earlier.job_id)
                return earlier.job_id
            if time.time() - earlier.claimed_at > self.claim_ttl_s:  # its job was never written: take it over
                if self._take_over(keys=[keys.idempotency(caller, key)],
                                   args=[earlier.raw, self._value(digest, job_id), self.ttl_s]):  # fmt: skip
                    return self._submit(caller, key, digest, job_id, submit=submit, exists=exists)
                continue  # another request took it over first: read what it wrote
            if time.monotonic() > deadline:
                raise ServiceUnavailable("a request with this Idempotency-Key is still being accepted", retry_after=1)
            time.sleep(0.05)  # polling a concurrent request's claim until its job is written

    def _submit(
        self, caller: str, key: str, digest: str, job_id: str, *,
        submit: Callable[[str], str], exists: Callable[[str], bool],
    ) -> str:  # fmt: skip
        try:
            created = submit(job_id)
        except Exception:
            # Refused before its job was written (admission, limits): the key is free for the retry. Written, and
            # failed after (its publish): a retry gets that job, which the janitor publishes from the outbox.
            with contextlib.suppress(redis.RedisError):
                if exists(job_id):
                    self.fill(caller, key, digest, job_id)
                else:
                    self.release(caller, key)
            raise
        self.fill(caller, key, digest, created)
        return created

    @staticmethod
    def _value(digest: str, job_id: str, *, filled: bool = False) -> str:
        return json.dumps({"digest": digest, "job_id": job_id, "filled": filled, "claimed_at": time.time()})

    def claim(self, caller: str, key: str, digest: str, job_id: str) -> Claim | None:
        """Claim the key for a new job of id ``job_id`` (None), or return the claim an earlier request made."""
        name = keys.idempotency(caller, key)
        while not self.redis.set(name, self._value(digest, job_id), nx=True, ex=self.ttl_s):
            raw = self.redis.get(name)
            if isinstance(raw, bytes):
                return Claim.parse(raw)
        return None

    def created(self, caller: str, key: str) -> bool:
        """Say whether this caller's key already created its job (a replay of it starts no work)."""
        raw = self.redis.get(keys.idempotency(caller, key))
        return isinstance(raw, bytes) and Claim.parse(raw).filled

    def fill(self, caller: str, key: str, digest: str, job_id: str) -> None:
        """Record that the job a claimed key creates was written."""
        self.redis.set(keys.idempotency(caller, key), self._value(digest, job_id, filled=True), ex=self.ttl_s)

    def release(self, caller: str, key: str) -> None:
        """Forget a claim whose job was never created, so the client may retry with the key."""
        self.redis.delete(keys.idempotency(caller, key))

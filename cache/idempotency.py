"""Idempotency keys: the same key and body return the same job; another body with the key is refused."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import redis

from cache import keys

TTL_S = 24 * 3600
#: A claim whose job id never came (its submission died midway) frees the key after this long; an honest
#: submission writes its job id well within it.
CLAIM_TTL_S = 15


def body_digest(body: dict[str, Any]) -> str:
    """Hash a request body independently of key order."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class IdempotencyKeys:
    """Remember which job each (caller, key) created, for a day (Stripe's model)."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = TTL_S, claim_ttl_s: int = CLAIM_TTL_S) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self.claim_ttl_s = claim_ttl_s

    def _read(self, caller: str, key: str) -> tuple[str, str] | None:
        raw = self.redis.get(keys.idempotency(caller, key))
        if not isinstance(raw, bytes):
            return None
        found = json.loads(raw)
        return str(found["digest"]), str(found["job_id"])

    def claim(self, caller: str, key: str, digest: str, *, wait_s: float = 5.0) -> tuple[str, str] | None:
        """Claim the key for a new job (None), or return the (digest, job id) an earlier request recorded."""
        value = json.dumps({"digest": digest, "job_id": ""})
        if self.redis.set(keys.idempotency(caller, key), value, nx=True, ex=self.claim_ttl_s):
            return None
        deadline = time.monotonic() + wait_s
        while True:  # a concurrent request holds the claim: wait for its job id
            found = self._read(caller, key)
            if found is None:
                return self.claim(caller, key, digest, wait_s=max(0.0, deadline - time.monotonic()))
            if found[1] or found[0] != digest or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def fill(self, caller: str, key: str, digest: str, job_id: str) -> None:
        """Record the job a claimed key created."""
        self.redis.set(keys.idempotency(caller, key), json.dumps({"digest": digest, "job_id": job_id}), ex=self.ttl_s)

    def release(self, caller: str, key: str) -> None:
        """Forget a claim whose job was never created, so the client may retry with the key."""
        self.redis.delete(keys.idempotency(caller, key))

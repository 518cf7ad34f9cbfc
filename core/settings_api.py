"""Settings of the API: held streams, admission, the circuit breaker, API keys, where it listens."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from core.apikeys import KeyRing, parse_api_keys


class ApiSettings(BaseSettings):
    """What the API processes read: how many streams they hold, whom they admit and how."""

    max_wait_s: float = Field(30.0, gt=0, description="Longest long-poll a client may ask for with ?wait=.")
    max_streams_per_caller: int = Field(
        100,
        ge=1,
        description="Streams and long-polls (events, growing or downloading audio, speech, ?wait=) one caller may "
        "hold open at once across every API process; beyond it 429 with Retry-After.",
    )
    max_streams_per_process: int = Field(
        2000,
        ge=1,
        description="The same, for all callers together in one API process; beyond it 503 with Retry-After.",
    )
    stream_keepalive_s: float = Field(
        15.0,
        gt=0,
        description="An idle event stream sends a keep-alive this often; a client that left is noticed at the "
        "next one, and its stream slot freed.",
    )
    stream_write_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A stream, download or voice socket whose client takes nothing of what is sent for this long "
        "(each 64 KB piece must go out within it) is closed, and its slot freed.",
    )
    api_redis_connections: int = Field(
        100,
        ge=4,
        description="Redis connections one API process opens at most; a request beyond them waits up to 10 s for "
        "one, then gets 503.",
    )

    admission_realtime_wait_s: float = Field(
        30.0, gt=0, description="Refuse realtime jobs (503) when their estimated queue wait is longer."
    )
    admission_lateness_s: float = Field(
        1.0,
        ge=0,
        description="Refuse a realtime job (503, Retry-After) that would delay an admitted stream past a playback "
        "deadline, or be made more than this many seconds later than on an idle service itself. 0 turns it off.",
    )
    admission_first_audio_s: float = Field(
        1.0,
        ge=0,
        description="Refuse a realtime job (503, Retry-After) whose first segment, at the pace recent first segments "
        "were made, would take longer than this (on engines slower than this alone: this much longer than alone). "
        "0 turns it off.",
    )
    admission_retry_margin_s: float = Field(
        0.25,
        ge=0,
        description="While refused requests await their retries, a first try must pass the admission checks with "
        "this many seconds to spare (on first audio, at most half its limit), which the same request resent after "
        "its Retry-After may use once. 0: retries are judged as newcomers.",
    )
    admission_batch_wait_s: float = Field(
        3600.0, gt=0, description="Refuse batch jobs (503) when their estimated queue wait is longer."
    )
    breaker_failure_rate: float = Field(0.5, gt=0, le=1, description="Open the breaker at this share of failures.")
    breaker_min_failures: int = Field(5, ge=1, description="...but only after this many failures in a minute.")
    breaker_cooldown_s: float = Field(30.0, gt=0, description="How long an open breaker refuses jobs.")
    api_keys: str = Field(
        "",
        description="Comma-separated `key=submissions_per_minute` (or just `key`), each key at least 16 characters; "
        "empty turns authentication off. A malformed entry stops the service at start.",
    )
    cache_scope: Literal["auto", "caller", "shared"] = Field(
        "auto",
        description="Whose segments a sentence-cache hit may reuse: `caller` (only the same API key's), `shared` "
        "(everyone's: a caller can tell another already said a sentence), `auto` (per key with keys on, else shared).",
    )
    anonymous_per_minute: int = Field(
        0, ge=0, description="Submissions per minute per client IP without keys; 0 = no limit."
    )
    api_host: str = Field("127.0.0.1", description="Address the API binds to.")
    api_port: int = Field(8000, ge=1, le=65535, description="Port the API listens on.")

    @field_validator("api_keys")
    @classmethod
    def _keys_parse(cls, value: str) -> str:
        parse_api_keys(value)  # raises naming the entry: the service does not start on a malformed one
        return value

    @property
    def key_ring(self) -> KeyRing:
        """Return the configured API keys (empty: authentication off)."""
        return parse_api_keys(self.api_keys)

    @property
    def cache_per_caller(self) -> bool:
        """Return whether sentence-cache hits are limited to the caller that made the audio."""
        return self.cache_scope == "caller" or (self.cache_scope == "auto" and bool(self.api_keys.strip()))

    @property
    def stream_slot_ttl_s(self) -> float:
        """Return how long an open stream's slot counts without being renewed (a crashed process's slots lapse)."""
        # A stream renews its slot at each keep-alive; a long-poll holds it for up to max_wait_s unrenewed.
        return 2 * max(self.stream_keepalive_s, self.max_wait_s) + 10

"""The one typed settings object, read from the environment at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.apikeys import KeyRing, parse_api_keys
from core.schedule import DeadlinePolicy

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Every knob of the service; each field reads ``TTS_<NAME>`` unless noted."""

    # Inputs stay out of error messages: TTS_API_KEYS holds secrets.
    model_config = SettingsConfigDict(env_prefix="TTS_", extra="ignore", hide_input_in_errors=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "TTS_REDIS_URL"),
        description="Broker and job store; needs maxmemory-policy noeviction. rediss:// and passwords work.",
    )
    cache_redis_url: str | None = Field(
        None,
        description="Redis for the sentence cache (may use allkeys-lru); unset shares REDIS_URL.",
    )
    cache_enabled: bool = Field(True, description="Look up and store finished segments in the sentence cache.")
    cache_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="How long cached segments and files live.")
    models_file: Path = Field(
        PROJECT_ROOT / "models.json", description="The model registry: names, engines, weights, voices."
    )
    default_model: str | None = Field(
        None, description="Model used when a request names none; unset picks ChatTTS if its weights exist, else espeak."
    )
    chattts_weights_dir: Path = Field(
        PROJECT_ROOT / "models" / "chattts",
        description="Where real ChatTTS weights go (asset/ layout or a Hugging Face cache).",
    )
    tiny_model_dir: Path = Field(
        PROJECT_ROOT / "models" / "chattts-tiny",
        description="Where `make tiny-model` builds the tiny random-weight ChatTTS used by tests and benchmarks.",
    )
    device: str = Field("auto", description="Worker device: auto, cpu, cuda, cuda:N.")

    max_text_chars: int = Field(
        20_000,
        ge=1,
        description="Longest text accepted by POST /v1/jobs and /v1/audio/speech, in characters both as sent and "
        "after normalisation (numbers and symbols spelled out, compatibility characters expanded).",
    )
    max_segments: int = Field(
        2_000,
        ge=1,
        description="Most segments one job may plan into; a 20,000-character book plans into about 200 to 400. "
        "Over it, or over max_text_chars once normalised, a job is refused with 413 before any work is queued.",
    )
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest request body accepted.")
    segment_max_chars: int = Field(
        60,
        ge=10,
        description="Segments pack sentences up to this many characters. One engine call lasts as long as its "
        "longest segment, and holds a model replica for that long: shorter segments bound everyone's wait.",
    )
    first_segment_max_chars: int = Field(
        24,
        ge=5,
        description="The first segment is kept this short (a clause); each next one is at most as long as all "
        "before it together.",
    )
    batch_lane_chars: int = Field(2000, ge=1, description="Jobs longer than this default to the batch lane.")
    enqueue_window_batch: int = Field(
        4, ge=1, description="Segments of one batch-lane job in the queue at once; the rest follow as they finish."
    )
    enqueue_window_realtime: int = Field(64, ge=1, description="The same window for realtime-lane jobs.")
    reconcile_interval_s: float = Field(
        15.0,
        gt=0,
        description="How often a worker looks for stalled and late jobs, and accounts for every live job's "
        "segments (also right after a worker dies or Redis errs).",
    )
    reconcile_stall_s: float = Field(
        900.0,
        gt=0,
        description="Re-enqueue a live job's missing segments after this long without progress; keep it above "
        "2x the task time limit, or a slow segment is counted twice against its attempts.",
    )
    job_deadline_s: float = Field(6 * 3600.0, gt=0, description="A job not done this long after submission fails.")
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
        description="The same, for all callers together in one API process (beyond it 503 with Retry-After); "
        "gunicorn's worker_connections is set above it, so the rest of the API always finds a connection.",
    )
    stream_keepalive_s: float = Field(
        15.0,
        gt=0,
        description="An idle event stream sends a keep-alive this often; a client that left is noticed at the "
        "next one, and its stream slot freed.",
    )
    api_redis_connections: int = Field(
        100,
        ge=4,
        description="Redis connections one API process opens at most; a request beyond them waits for one (up to "
        "10 s, then 503). Held streams need none of their own: each process's waits share one.",
    )

    job_ttl_s: int = Field(
        24 * 3600, ge=60, description="How long a finished job's record (status, progress, error) stays in Redis."
    )
    audio_ttl_s: int = Field(
        3600,
        ge=60,
        description="How long a finished job's audio stays in Redis (at most job_ttl_s); after it, the audio "
        "routes answer 410 Gone. The memory budget may remove the oldest finished audio sooner.",
    )
    audio_store_codec: str = Field(
        "flac",
        pattern="^(flac|vorbis|pcm)$",
        description="How segment audio is kept in Redis: flac (lossless, about half of raw PCM for speech), "
        "vorbis (lossy, about a quarter), pcm (raw).",
    )
    store_budget_mb: int = Field(
        0,
        ge=0,
        description="The job store's memory budget; 0 takes Redis's own maxmemory (and no budget if it has none).",
    )
    store_trim_at: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="Past this share of the budget, the oldest finished audio and cache entries are removed.",
    )
    store_full_at: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="Past this share of the budget (live jobs alone fill it), new jobs get 503 with Retry-After.",
    )
    segment_max_attempts: int = Field(3, ge=1, description="Attempts per segment before its job fails.")
    task_time_limit_s: int = Field(300, ge=10, description="Hard limit for one segment's synthesis.")
    visibility_timeout_s: int = Field(
        3600,
        ge=30,
        description="A delivered task not acked this long is delivered again; keep above 3x the time limit.",
    )
    worker_concurrency: int = Field(
        128,
        ge=1,
        description="Segments one worker holds at once (threads): the window its deadline scheduler orders; "
        "several times the batch size lets batches fill.",
    )
    model_replicas: int = Field(
        1,
        ge=1,
        le=64,
        description="Host processes per model in each worker, running batches side by side: on CPUs, one per "
        "core with TTS_TORCH_THREADS=1 uses every core; on a GPU keep 1 (one worker per GPU instead).",
    )
    batch_max_size: int = Field(16, ge=1, description="Most segments in one engine call.")
    batch_wait_ms: float = Field(
        10.0, ge=0, description="How long the batcher waits for company after a segment arrives."
    )
    batch_max_ratio: float = Field(1.5, ge=1.0, description="Longest/shortest text length allowed in one batch.")
    scheduler: str = Field(
        "deadline",
        pattern="^(deadline|fifo)$",
        description="Order of work: `deadline` (earliest playback deadline first) or `fifo` (arrival order).",
    )
    batch_hold_ms: float = Field(
        150.0, ge=0, description="How long a batch may wait to fill while its most urgent segment still has slack."
    )
    batch_horizon_s: float = Field(
        30.0, ge=0, description="A batch only takes segments due within this many seconds of its most urgent one."
    )
    deadline_lead: float = Field(
        2.0,
        ge=0,
        description="A stream's next segment is ordered this many engine calls before its deadline, so it is "
        "written by then (one call may be running, then its own); a call is the recent average, longer "
        "for a longer text.",
    )
    deadline_first_priority_s: float = Field(
        2.0,
        ge=0,
        description="A job's first segment is ordered as many seconds before its deadline as it is already late, "
        "up to this: when the engines are overloaded someone must wait, and a listener who has heard nothing "
        "yet waits first-hand.",
    )
    deadline_first_audio_s: float = Field(
        1.0, ge=0, description="Expected first-audio time of a realtime job: its listener's start until known."
    )
    deadline_batch_delay_s: float = Field(
        60.0, ge=0, description="A batch-lane job's first segment is due this long after acceptance."
    )
    deadline_batch_stretch: float = Field(
        2.0, ge=1.0, description="Batch-lane deadlines assume a listener this many times slower than real time."
    )
    seconds_per_char: float = Field(
        0.2, gt=0, description="Audio seconds per character assumed for a model until its own pace is measured."
    )
    model_budget_mb: int = Field(
        8192, ge=64, description="Memory all loaded models may hold (GPU memory on CUDA, resident on CPU)."
    )
    model_idle_s: float = Field(600.0, gt=0, description="Unpinned models idle this long are unloaded.")
    torch_threads: int = Field(
        0, ge=0, description="CPU threads per model process for torch; 0 keeps torch's default (use 1 on shared CPUs)."
    )
    metrics_port: int = Field(9310, ge=0, le=65535, description="Worker's Prometheus port; 0 turns it off.")
    log_format: str = Field("text", pattern="^(text|json)$", description="Log lines as text or JSON.")
    heartbeat_s: float = Field(
        2.0,
        gt=0,
        description="How often a worker announces itself in Redis, and looks for dead workers and unpublished "
        "segments.",
    )
    malloc_trim_s: float = Field(
        60.0,
        ge=0,
        description="How often a worker gives its free heap pages back to the system (glibc malloc_trim); 0 = never.",
    )
    heartbeat_misses: int = Field(
        3,
        ge=2,
        description="A worker whose heartbeat is this many intervals old is dead: its segments are enqueued again.",
    )

    admission_realtime_wait_s: float = Field(
        30.0, gt=0, description="Refuse realtime jobs (503) when their estimated queue wait is longer."
    )
    admission_batch_wait_s: float = Field(
        3600.0, gt=0, description="Refuse batch jobs (503) when their estimated queue wait is longer."
    )
    breaker_failure_rate: float = Field(0.5, gt=0, le=1, description="Open the breaker at this share of failures.")
    breaker_min_failures: int = Field(5, ge=1, description="...but only after this many failures in a minute.")
    breaker_cooldown_s: float = Field(30.0, gt=0, description="How long an open breaker refuses jobs.")
    api_keys: str = Field(
        "",
        description="Comma-separated `key=submissions_per_minute` (or just `key`, at least 16 characters); empty "
        "turns auth off (local use). With keys on, each job belongs to the key that submitted it. Checked at start: "
        "a malformed entry stops the service.",
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
    log_level: str = Field("INFO", description="Python logging level.")

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
    def worker_dead_after_s(self) -> float:
        """Return how old a worker's last heartbeat is when the worker counts as dead."""
        return self.heartbeat_misses * self.heartbeat_s

    @property
    def stream_slot_ttl_s(self) -> float:
        """Return how long an open stream's slot counts without being renewed (a crashed process's slots lapse)."""
        # A stream renews its slot at each keep-alive; a long-poll holds it for up to max_wait_s unrenewed.
        return 2 * max(self.stream_keepalive_s, self.max_wait_s) + 10


def deadline_policy(settings: Settings) -> DeadlinePolicy:
    """Return the deadline policy the settings describe."""
    return DeadlinePolicy(
        first_audio_s=settings.deadline_first_audio_s,
        batch_delay_s=settings.deadline_batch_delay_s,
        batch_stretch=settings.deadline_batch_stretch,
    )


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with explicit overrides on top."""
    return Settings(**overrides)  # type: ignore[arg-type]

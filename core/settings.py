"""The one typed settings object, read from the environment at start-up.

Its fields are declared in groups, one module each: jobs (settings_jobs), the API (settings_api) and
workers (settings_worker); the places the service finds its parts are declared here.

Declared boilerplate: the fields, here and in the groups, are declarations of one shape (name, type, a Field with
its default and description), which the duplicate finder pairs; that is what a settings object is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from core.errors import SettingsInvalid
from core.schedule import DeadlinePolicy
from core.settings_api import ApiSettings
from core.settings_jobs import JobSettings
from core.settings_worker import WorkerSettings
from core.store_url import check_store_url, is_sentinel

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(JobSettings, ApiSettings, WorkerSettings):
    """Every knob of the service; each field reads ``TTS_<NAME>`` unless noted."""

    # Inputs stay out of error messages: TTS_API_KEYS holds secrets.
    model_config = SettingsConfigDict(env_prefix="TTS_", extra="ignore", hide_input_in_errors=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "TTS_REDIS_URL"),
        description="Broker and job store; needs maxmemory-policy noeviction. rediss:// and passwords work; "
        "a Sentinel group is redis+sentinel://host:26379[,host:26379...]/<service>[/<db>].",
    )
    cache_redis_url: str | None = Field(
        None,
        description="Redis for the sentence cache (may use allkeys-lru); unset shares REDIS_URL.",
    )
    redis_wait_replicas: Annotated[int, Field(ge=0, le=16)] | Literal["auto"] = Field(
        "auto",
        description="Replicas that must hold (Redis WAIT) a job before the API answers 202, a worker's segment "
        "before it counts as written, and, under Sentinel, what the API read before it answers. `auto`: 1 when "
        "REDIS_URL is a Sentinel group, else 0 (one Redis has no replica to wait for).",
    )
    redis_wait_timeout_ms: int = Field(
        1000,
        ge=10,
        le=60_000,
        description="How long to wait for those replicas; past it the API answers 503 with Retry-After (the job "
        "may still run: a retry with the same Idempotency-Key returns it) and a worker tries the segment again.",
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
    device: str = Field(
        "auto",
        pattern=r"^\s*(auto|cpu|cuda(:\d+)?)\s*(,\s*(auto|cpu|cuda(:\d+)?)\s*)*$",
        description="Worker device: auto, cpu, cuda, cuda:N, or a comma-separated list of them, whose devices a "
        "worker's model hosts take in turn (replica 0 the first).",
    )
    engine_plugins: str = Field(
        "",
        description="Comma-separated modules imported when the model registry loads, in the API and the workers; "
        "each registers engines with core.registry.register_engine.",
    )
    log_level: str = Field("INFO", description="Python logging level.")

    @field_validator("redis_url", "cache_redis_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        return check_store_url(value) if value else value

    @property
    def replicas_to_wait_for(self) -> int:
        """Return how many replicas must confirm a job before it is accepted (``auto`` resolved)."""
        if self.redis_wait_replicas == "auto":
            return 1 if is_sentinel(self.redis_url) else 0
        return self.redis_wait_replicas


def deadline_policy(settings: Settings) -> DeadlinePolicy:
    """Return the deadline policy the settings describe."""
    return DeadlinePolicy(
        first_audio_s=settings.deadline_first_audio_s,
        batch_delay_s=settings.deadline_batch_delay_s,
        batch_stretch=settings.deadline_batch_stretch,
    )


def env_name(field: str) -> str:
    """Return the environment variable a settings field is read from."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0]
    return f"TTS_{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with explicit overrides on top; a bad value raises SettingsInvalid."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        problems = [
            f"{env_name(str(error['loc'][0])) if error['loc'] else 'settings'}: {error['msg']}" for error in e.errors()
        ]
        raise SettingsInvalid("invalid settings (fix or unset them):\n  " + "\n  ".join(problems)) from None

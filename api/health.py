"""Liveness, readiness and the model list."""

from __future__ import annotations

from typing import Any

import redis
from flask import Blueprint

from api.services import services
from core.errors import ServiceUnavailable
from core.registry import DEVICE_KINDS, MODES, ModelSpec

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> dict[str, str]:
    """Say the API process is alive (no dependencies checked)."""
    return {"status": "ok"}


@bp.get("/readyz")
def readyz() -> dict[str, Any]:
    """Say whether Redis answers and at least one worker is alive (it may still be loading its models)."""
    svc = services()
    try:
        svc.redis.ping()
        workers = svc.workers.alive()
    except redis.RedisError as e:
        raise ServiceUnavailable("Redis is unreachable", retry_after=5) from e
    if not workers:
        raise ServiceUnavailable(
            "no worker is alive: under `make run`, see its output; otherwise start one with `make worker` and the "
            "API's REDIS_URL",
            retry_after=5,
        )
    return {"status": "ready", "workers": [_worker_view(w) for w in workers]}


def _worker_view(beat: dict[str, Any]) -> dict[str, Any]:
    """Say what a worker holds: its models, those loading, and how each model's decode step runs."""
    return {
        "hostname": beat["hostname"],
        "models": beat.get("models", []),
        "loading": beat.get("loading", []),
        "decode": {host["model"]: host["decode"] for host in beat.get("pool", []) if "decode" in host},
    }


def mode_view(variant: ModelSpec) -> dict[str, Any]:
    """Say what a mode of a model runs: which variant, in what precision, on which devices, cut how."""
    return {
        "model": variant.name,
        "precision": variant.precision,
        "devices": list(variant.devices or DEVICE_KINDS),
        "fragment_ms": variant.fragment_ms,  # None: the service's TTS_FRAGMENT_MS
    }


@bp.get("/v1/models")
def list_models() -> dict[str, Any]:
    """List the registry's models, their voices and whether their weights are present."""
    registry = services().registry
    return {
        "default": registry.default,
        "data": [
            {
                "id": spec.name,
                "object": "model",
                "engine": spec.engine,
                "language": spec.language,
                "available": spec.available,
                "random_weights": spec.random_weights,
                "voices": sorted(spec.voices),
                "default_voice": spec.default_voice,
                "modes": {mode: mode_view(spec.in_mode(mode)) for mode in MODES},
            }
            for spec in registry.models.values()
        ],
    }

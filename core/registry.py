"""The model registry: the only way a request's model and voice name reach an engine."""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from core.errors import NotFound
from core.settings import PROJECT_ROOT, Settings

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class EngineEntry:
    """One engine models.json may name: what builds it, and what besides its weights makes its audio."""

    name: str
    #: "module:function" taking (spec, *, device) and returning an unloaded Engine; imported only in model hosts.
    builder: str
    #: The distribution whose version joins each model's version (None: no package of its own).
    package: str | None = None
    #: Our own code's part in the engine's audio: bump it when that changes.
    revision: str | None = None
    #: "module:function" taking a weights folder and returning an Availability; the API calls it at every
    #: submission, so it must import neither torch nor the engine. None: a folder that exists will do.
    weights_check: str | None = None


@dataclass(frozen=True)
class Availability:
    """Whether a model can be served now and, if not, what is wrong."""

    ok: bool
    reason: str = ""


AVAILABLE = Availability(ok=True)

_ENGINES: dict[str, EngineEntry] = {}


def register_engine(
    name: str,
    *,
    builder: str,
    package: str | None = None,
    revision: str | None = None,
    weights_check: str | None = None,
) -> None:
    """Make engine ``name`` known to the registry; an engine plugin module (TTS_ENGINE_PLUGINS) calls this."""
    for what, path in (("builder", builder), ("weights_check", weights_check)):
        if path is not None and ":" not in path:
            raise ValueError(f"engine {name!r}: {what} must be 'module:function', not {path!r}")
    _ENGINES[name] = EngineEntry(
        name=name, builder=builder, package=package, revision=revision, weights_check=weights_check
    )


@functools.cache
def _weights_check(path: str) -> Callable[[Path], Availability]:
    module, _, function = path.partition(":")
    check: Callable[[Path], Availability] = getattr(importlib.import_module(module), function)
    return check


def engine_entry(name: str) -> EngineEntry:
    """Return the registered engine ``name``, or raise ValueError naming the known ones."""
    entry = _ENGINES.get(name)
    if entry is None:
        raise ValueError(
            f"unknown engine {name!r}; known engines: {sorted(_ENGINES)} "
            "(an engine of a plugin needs its module in TTS_ENGINE_PLUGINS)"
        )
    return entry


def load_engine_plugins(modules: str) -> None:
    """Import each comma-separated module of ``modules``; each registers its engines as it is imported."""
    for module in (m.strip() for m in modules.split(",")):
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"TTS_ENGINE_PLUGINS: cannot import engine plugin {module!r}: {e}") from e


# The revision is our per-item sampler's (workers/engines/sampling.py): it changes ChatTTS's audio.
register_engine(
    "chattts",
    builder="workers.engines.factory:build_chattts",
    package="chattts",
    revision="fused-sampler-1",
    weights_check="workers.engines.chattts_files:check_weights",
)
register_engine("espeak", builder="workers.engines.factory:build_espeak", package="espeakng-loader")


@dataclass(frozen=True)
class ModelSpec:
    """One servable model as the registry describes it."""

    name: str
    engine: str
    language: str = "auto"
    weights: Path | None = None
    precision: str = "fp32"
    pinned: bool = False
    memory_mb: int = 0
    default_voice: str = "default"
    voices: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: A hash of what makes this model's audio: engine, its package version, weights, precision, options.
    version: str = ""
    #: Built with random weights (for benchmarks and tests): its audio is noise, its cost is real.
    random_weights: bool = False

    def availability(self) -> Availability:
        """Say whether the model's weights are whole, as its engine checks them (engines without weights always are)."""
        if self.weights is None:
            return AVAILABLE
        check = engine_entry(self.engine).weights_check
        if check is None:
            return AVAILABLE if self.weights.is_dir() else Availability(ok=False, reason=f"no folder {self.weights}")
        return _weights_check(check)(self.weights)

    @property
    def available(self) -> bool:
        """Say whether the model's weights are whole (engines without weights always are)."""
        return self.availability().ok

    def resolve_voice(self, voice: str | None) -> str:
        """Return the registered voice name for ``voice``, or raise NotFound."""
        name = voice or self.default_voice
        if name not in self.voices:
            raise NotFound(
                f"model {self.name!r} has no voice {name!r}; known voices: {sorted(self.voices)}",
                field="voice",
            )
        return name


#: The make target that builds each random-weight model of models.json.
RANDOM_WEIGHT_BUILDS = {"chattts-tiny": "make tiny-model", "chattts-random": "make full-model"}


class Registry:
    """Name → ModelSpec, loaded from a JSON file and checked once."""

    def __init__(self, models: dict[str, ModelSpec], *, default: str) -> None:
        if default not in models:
            raise ValueError(f"default model {default!r} is not in the registry")
        self.models = models
        self.default = default

    def get(self, name: str | None) -> ModelSpec:
        """Return the spec for ``name`` (the default when None), or raise NotFound."""
        key = name or self.default
        spec = self.models.get(key)
        if spec is None:
            raise NotFound(f"unknown model {key!r}; known models: {sorted(self.models)}", field="model")
        availability = spec.availability()
        if not availability.ok:
            remedy = (
                f"it is a random-weight model: `{RANDOM_WEIGHT_BUILDS.get(key, 'make full-model')}` builds it"
                if spec.random_weights
                else "see README 'Real ChatTTS weights'"
            )
            raise NotFound(f"model {key!r} is not available: {availability.reason} ({remedy})", field="model")
        return spec


def _parse_spec(name: str, raw: dict[str, Any], variables: dict[str, str]) -> ModelSpec:
    engine = raw.get("engine")
    if engine not in _ENGINES:
        raise ValueError(
            f"model {name!r}: engine must be one of {sorted(_ENGINES)}, not {engine!r} "
            "(an engine of a plugin needs its module in TTS_ENGINE_PLUGINS)"
        )
    precision = raw.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise ValueError(f"model {name!r}: precision must be one of {PRECISIONS}")
    weights = raw.get("weights")
    weights_path = None
    if weights is not None:
        weights_path = Path(str(weights).format(**variables))
        if not weights_path.is_absolute():
            weights_path = PROJECT_ROOT / weights_path
    spec = ModelSpec(
        name=name,
        engine=engine,
        language=raw.get("language", "auto"),
        weights=weights_path,
        precision=precision,
        pinned=bool(raw.get("pinned", False)),
        memory_mb=int(raw.get("memory_mb", 0)),
        default_voice=raw.get("default_voice", "default"),
        voices=dict(raw.get("voices", {"default": None})),
        options=dict(raw.get("options", {})),
        random_weights=bool(raw.get("random_weights", False)),
    )
    if spec.default_voice not in spec.voices:
        raise ValueError(f"model {name!r}: default_voice {spec.default_voice!r} is not among its voices")
    return replace(spec, version=model_version(spec, raw.get("version")))


#: Files up to this size are hashed; larger ones (weights) are named by path and size, to start fast.
_HASHED_FILE_BYTES = 1 << 20


def _weights_fingerprint(weights: Path | None) -> list[tuple[str, int, str]]:
    # No mtimes: the same weights copied to another machine must give the same version (shared cache).
    if weights is None or not weights.is_dir():
        return []
    found = []
    for path in sorted(p for p in weights.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if size <= _HASHED_FILE_BYTES else ""
        found.append((str(path.relative_to(weights)), size, digest))
    return found


def model_version(spec: ModelSpec, declared: str | None = None) -> str:
    """Hash everything that changes a model's audio, so cached audio never outlives its model.

    A ``version`` declared in models.json joins the hash: bump it when weights change but keep their sizes.
    """
    entry = engine_entry(spec.engine)
    try:
        package = metadata.version(entry.package) if entry.package else "absent"
    except metadata.PackageNotFoundError:
        package = "absent"
    material = json.dumps(
        [
            spec.engine,
            package,
            entry.revision,
            spec.precision,
            spec.options,
            spec.voices,
            declared,
            _weights_fingerprint(spec.weights),
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def load_registry(settings: Settings) -> Registry:
    """Import the engine plugins, load and check the registry named by the settings, and pick the default model."""
    load_engine_plugins(settings.engine_plugins)
    variables = {
        "chattts_weights_dir": str(settings.chattts_weights_dir),
        "tiny_model_dir": str(settings.tiny_model_dir),
    }
    raw = json.loads(settings.models_file.read_text(encoding="utf-8"))
    models = {name: _parse_spec(name, spec, variables) for name, spec in raw["models"].items()}
    for spec in models.values():
        # The first check of real weights hashes them (seconds): here at start, never inside a request.
        spec.availability()
    default = settings.default_model
    if default is None:
        chattts = models.get("chattts")
        default = "chattts" if chattts is not None and chattts.available else "espeak-cmn"
    return Registry(models, default=default)

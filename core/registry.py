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

from core.errors import NotFound, ValidationFailed
from core.fragments import FragmentSchedule
from core.settings import PROJECT_ROOT, Settings

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: What a request may ask of a model: speed, the model as declared, or fidelity (api/contract.py's Mode).
MODES = ("fast", "balanced", "quality")
#: The mode that is the model as models.json declares it; a mode a model does not declare is served by it too.
BALANCED = "balanced"
#: The kinds of device a model may be limited to (``devices``); a worker tells the API its kind in its heartbeat.
DEVICE_KINDS = ("cpu", "cuda")


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
    #: The device kinds (DEVICE_KINDS) it runs on; empty: any.
    devices: tuple[str, ...] = ()
    #: Its own fragment schedule ("first,steady" ms, core/fragments.py); None: TTS_FRAGMENT_MS's.
    fragment_ms: str | None = None
    #: The model it is a mode of ("" for a model of models.json itself) and the mode it serves.
    base: str = ""
    mode: str = BALANCED
    #: Each declared mode's variant, by mode (a variant has none of its own).
    modes: dict[str, ModelSpec] = field(default_factory=dict)

    @property
    def model(self) -> str:
        """Return the name a caller knows it by: the model of models.json it is a mode of, or its own."""
        return self.base or self.name

    def runs_on(self, kind: str) -> bool:
        """Say whether it runs on a device of ``kind`` ("cpu" or "cuda")."""
        return not self.devices or kind in self.devices

    def in_mode(self, mode: str | None, *, device_kinds: frozenset[str] = frozenset()) -> ModelSpec:
        """Return the variant that serves ``mode`` (itself for balanced and for a mode it does not declare).

        ``device_kinds`` are the kinds of device the workers run on, when known: a variant that runs on none of
        them is refused (ValidationFailed, 422) with the modes that do.
        """
        mode = mode or BALANCED
        variant = self.modes.get(mode, self)
        if device_kinds and not any(variant.runs_on(kind) for kind in device_kinds):
            usable = [m for m in MODES if any(self.modes.get(m, self).runs_on(k) for k in device_kinds)]
            where = f"the workers run on {'/'.join(sorted(device_kinds))}"
            raise ValidationFailed(
                "mode",
                f"{mode!r} of model {self.name!r} runs in {variant.precision} on {'/'.join(variant.devices)} only, "
                + (f"and {where}; use one of {usable}" if usable else f"and {where}: no mode of it runs there"),
            )
        return variant

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

    def get(
        self, name: str | None, mode: str | None = None, *, device_kinds: frozenset[str] = frozenset()
    ) -> ModelSpec:
        """Return the spec for ``name`` (the default when None) in ``mode``, or raise NotFound.

        A variant's own name (``model@mode``) finds it too. ``device_kinds``: see ``ModelSpec.in_mode``.
        """
        name, mode = self.named_mode(name, mode)
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
        return spec.in_mode(mode, device_kinds=device_kinds)

    @staticmethod
    def named_mode(name: str | None, mode: str | None) -> tuple[str | None, str]:
        """Split a variant's name (``model@mode``, as /v1/models lists it) into its model and mode; a plain name
        keeps ``mode`` (balanced when None). A name whose mode contradicts ``mode`` is refused (422)."""
        if name is None or "@" not in name:
            return name, mode or BALANCED
        model, _, named = name.partition("@")
        if named not in MODES:
            raise NotFound(f"unknown model {name!r}: what follows '@' is a mode, one of {list(MODES)}", field="model")
        if mode not in (None, BALANCED, named):
            raise ValidationFailed("mode", f"is {mode!r}, but model {name!r} names mode {named!r}: send one of them")
        return model, named


def _parse_spec(name: str, raw: dict[str, Any], variables: dict[str, str]) -> ModelSpec:
    engine = raw.get("engine")
    if engine not in _ENGINES:
        raise ValueError(
            f"model {name!r}: engine must be one of {sorted(_ENGINES)}, not {engine!r} "
            "(an engine of a plugin needs its module in TTS_ENGINE_PLUGINS)"
        )
    precision, devices = _runs_in(f"model {name!r}", raw.get("precision", "fp32"), raw.get("devices", ()))
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
        devices=devices,
        fragment_ms=_fragment_ms(f"model {name!r}", raw.get("fragment_ms")),
    )
    if spec.default_voice not in spec.voices:
        raise ValueError(f"model {name!r}: default_voice {spec.default_voice!r} is not among its voices")
    spec = replace(spec, version=model_version(spec, raw.get("version")))
    return replace(spec, modes={mode: _variant(spec, mode, fields) for mode, fields in raw.get("modes", {}).items()})


#: What a mode of models.json may change of its model.
_MODE_FIELDS = {"precision", "options", "devices", "fragment_ms", "memory_mb", "version"}


def _variant(spec: ModelSpec, mode: str, fields: dict[str, Any]) -> ModelSpec:
    """Return ``spec`` in ``mode``: a model of its own (its own host, pace and cache entries) named ``model@mode``."""
    where = f"model {spec.name!r}, mode {mode!r}"
    if mode not in MODES or mode == BALANCED:
        raise ValueError(f"{where}: a mode is one of {[m for m in MODES if m != BALANCED]} (balanced is the model)")
    unknown = set(fields) - _MODE_FIELDS
    if unknown:
        raise ValueError(f"{where}: a mode may set only {sorted(_MODE_FIELDS)}, not {sorted(unknown)}")
    precision, devices = _runs_in(where, fields.get("precision", spec.precision), fields.get("devices", spec.devices))
    variant = replace(
        spec,
        name=f"{spec.name}@{mode}",
        base=spec.name,
        mode=mode,
        precision=precision,
        options={**spec.options, **fields.get("options", {})},
        devices=devices,
        fragment_ms=_fragment_ms(where, fields.get("fragment_ms", spec.fragment_ms)),
        memory_mb=int(fields.get("memory_mb", spec.memory_mb)),
        pinned=False,  # loaded when a request asks for it, evicted like any other
        modes={},
    )
    return replace(variant, version=model_version(variant, fields.get("version")))


def _runs_in(where: str, precision: str, devices: Any) -> tuple[str, tuple[str, ...]]:
    """Return a precision and device list of models.json, checked."""
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: precision must be one of {PRECISIONS}")
    if not set(devices) <= set(DEVICE_KINDS):
        raise ValueError(f"{where}: devices must be among {DEVICE_KINDS}, not {list(devices)}")
    return precision, tuple(devices)


def _fragment_ms(where: str, text: str | None) -> str | None:
    if text is not None:
        try:
            FragmentSchedule.parse(str(text))
        except ValueError as e:
            raise ValueError(f"{where}: fragment_ms: {e}") from e
    return None if text is None else str(text)


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

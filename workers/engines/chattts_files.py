"""Whether a ChatTTS model folder is whole: every file present, sizes sane, real weights matching ChatTTS's hashes.

The API asks at every submission and the worker at every segment (a missing or corrupt model answers 404 there,
not as a failed job later), so this imports neither torch nor ChatTTS, and reads or hashes a file only once per
(path, size, mtime): a check costs one ``stat`` per file while the folder is unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path

from core.registry import AVAILABLE, Availability
from workers.engines.chattts_assets import (
    ASSET_FILES,
    DESCRIPTOR_NAME,
    LEGACY_DESCRIPTOR_NAME,
    find_weights,
    read_descriptor,
    where_weights_go,
)
from workers.engines.errors import EngineLoadError

#: A safetensors header larger than this is not one (real ChatTTS headers are a few KB).
_MAX_HEADER_BYTES = 64 << 20


@functools.lru_cache(maxsize=1)
def chattts_sha256_map() -> dict[str, str] | None:
    """Return ChatTTS's own SHA-256 map of its real weights, found without importing ChatTTS (None: not installed)."""
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "res" / "sha256_map.json"
    try:
        data: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hash a file; the size and mtime are the cache key, so a replaced file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def _shape_problem(path: str, size: int, mtime_ns: int) -> str | None:
    """Say what is wrong with a file's own structure: a safetensors file's length against its header, JSON parsing."""
    try:
        with open(path, "rb") as f:
            if not path.endswith(".safetensors"):
                json.loads(f.read())
                return None
            header_bytes = int.from_bytes(f.read(8), "little")
            if size < 8 or header_bytes > min(size - 8, _MAX_HEADER_BYTES):
                return "is truncated or not a safetensors file"
            header = json.loads(f.read(header_bytes))
    except (OSError, ValueError) as e:
        return f"cannot be read ({e})"
    try:
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return "has a corrupt safetensors header"
    expected = 8 + header_bytes + max(ends, default=0)
    if size != expected:
        return f"is {size} bytes where its own header says {expected} (truncated or padded)"
    return None


def _size_problem(path: Path, size: int, expected_bytes: int | None) -> str | None:
    if not path.is_file():
        return "is not a file"
    if size == 0:
        return "is empty"
    if expected_bytes is not None and size != expected_bytes:
        return f"is {size} bytes, not the {expected_bytes} its model's descriptor records"
    return None


def _file_problem(path: Path, *, expected_bytes: int | None, expected_sha256: str | None) -> str | None:
    try:
        stat = path.stat()
    except OSError:
        return "is missing"
    problem = _size_problem(path, stat.st_size, expected_bytes) or _shape_problem(
        str(path), stat.st_size, stat.st_mtime_ns
    )
    if problem is not None or expected_sha256 is None:
        return problem
    if _sha256(str(path), stat.st_size, stat.st_mtime_ns) != expected_sha256:
        return "does not match ChatTTS's SHA-256 map (corrupt, or not ChatTTS's weights)"
    return None


def check_weights(
    weights_dir: Path, *, hashes: bool = True, real_sha256: Mapping[str, str] | None = None
) -> Availability:
    """Say whether ``weights_dir`` holds a whole ChatTTS model, and if not, what is wrong and where weights go.

    Random-weight models (a descriptor) are checked against their descriptor's file sizes; real weights in
    ChatTTS's asset layout against ``real_sha256`` (default: ChatTTS's own map), as its loader checks them
    (``hashes=False`` leaves that to the loader). A Hugging Face cache is not hash-checked, by ChatTTS
    either: its revision may differ from the map's.
    """
    weights_dir = Path(weights_dir)
    try:
        source, root = find_weights(weights_dir)
    except EngineLoadError as e:
        return Availability(ok=False, reason=str(e))
    except OSError as e:
        return Availability(ok=False, reason=f"cannot read {weights_dir}: {e}")
    if real_sha256 is not None:  # a map of the caller's own: not worth remembering
        return _check_root(weights_dir, source, root, hashes=hashes, real_sha256=real_sha256)
    return _remembered_check(weights_dir, source, root, hashes, _fingerprint(root))


#: The files whose state decides a folder's check: its descriptor (either name) and every asset file.
_CHECKED_FILES = (DESCRIPTOR_NAME, LEGACY_DESCRIPTOR_NAME, *ASSET_FILES.values())


def _fingerprint(root: Path) -> tuple[tuple[int, ...] | None, ...]:
    """Return what ``stat`` says of each checked file (None where absent): a change to any of them changes it."""
    found: list[tuple[int, ...] | None] = []
    for rel in _CHECKED_FILES:
        try:
            st = os.stat(f"{root}/{rel}")
        except OSError:
            found.append(None)
            continue
        found.append((st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _remembered_check(
    weights_dir: Path, source: str, root: Path, hashes: bool, fingerprint: tuple[object, ...]
) -> Availability:
    """Check a folder once per state of its files (``fingerprint`` is only the cache key)."""
    return _check_root(weights_dir, source, root, hashes=hashes, real_sha256=None)


def _check_root(
    weights_dir: Path, source: str, root: Path, *, hashes: bool, real_sha256: Mapping[str, str] | None
) -> Availability:
    try:
        descriptor = read_descriptor(root)
    except (OSError, ValueError) as e:
        return Availability(ok=False, reason=f"{root} has an unreadable random-weight descriptor: {e}")
    sizes: dict[str, int] = descriptor.get("bytes", {}) if descriptor is not None else {}
    real_hashes = None
    if descriptor is None and source == "custom" and hashes:
        real_hashes = real_sha256 if real_sha256 is not None else chattts_sha256_map()
    for key, rel in ASSET_FILES.items():
        problem = _file_problem(
            root / rel,
            expected_bytes=sizes.get(key),
            expected_sha256=real_hashes.get(key) if real_hashes is not None else None,
        )
        if problem is not None:
            return Availability(ok=False, reason=f"{root / rel} {problem}; {where_weights_go(weights_dir)}")
    return AVAILABLE

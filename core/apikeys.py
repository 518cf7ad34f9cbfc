"""API keys: parsed and checked once, at start-up; matched without timing that depends on the presented value.

``TTS_API_KEYS`` is ``key=per_minute,key2``: comma-separated entries, each a key and an optional quota of
submissions per minute (absent or 0: no limit). A malformed entry, an empty or short key, a placeholder
such as ``changeme``, or a key given twice is refused with a message naming the entry, so that a typo
stops the service at start instead of answering 500 (or letting an empty bearer token in) on every request.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

#: Shorter keys are guessable; ``openssl rand -hex 16`` makes a 32-character one.
MIN_KEY_CHARS = 16
#: Values copied from an example and never replaced (compared case-insensitively, ignoring - and _).
PLACEHOLDERS = frozenset(
    {"changeme", "changemenow", "replaceme", "yourkey", "yourapikey", "apikey", "secret", "password", "example",
     "examplekey", "key", "todo", "xxxxxxxxxxxxxxxx", "0000000000000000", "1234567890123456", "placeholder"}
)  # fmt: skip


class KeyConfigError(ValueError):
    """Raised when ``TTS_API_KEYS`` holds an entry the service refuses to start with."""


def caller_id(key: str) -> str:
    """Name a caller by a hash of its key, so no key is ever written to Redis or logs."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class ApiKey:
    """One accepted key, kept only as its digest."""

    digest: bytes
    caller: str
    per_minute: int


def _masked(key: str) -> str:
    return f"a key of {len(key)} characters"  # never any of the key itself: logs outlive it


def _placeholder(key: str) -> bool:
    folded = key.lower().replace("-", "").replace("_", "")
    return folded in PLACEHOLDERS or (key.startswith("<") and key.endswith(">")) or key.startswith("${")


def _parse_entry(position: int, item: str) -> tuple[str, int]:
    key, sep, quota = (part.strip() for part in item.partition("="))
    where = f"TTS_API_KEYS entry {position}"
    if not key:
        raise KeyConfigError(f"{where} ({item!r}) has an empty key: write 'key' or 'key=per_minute'")
    if _placeholder(key):
        raise KeyConfigError(f"{where} ({_masked(key)}) is a placeholder: generate a key (openssl rand -hex 16)")
    if len(key) < MIN_KEY_CHARS or not key.isprintable() or " " in key:
        raise KeyConfigError(
            f"{where} ({_masked(key)}) must be at least {MIN_KEY_CHARS} printable characters without spaces "
            "(openssl rand -hex 16 makes one)"
        )
    if not sep:
        return key, 0
    if not quota.isdigit() or len(quota) > 9:
        raise KeyConfigError(
            f"{where} ({_masked(key)}) has quota {quota!r}: after '=' write whole submissions per minute (0: no limit)"
        )
    return key, int(quota)


class KeyRing:
    """The configured keys; empty means authentication is off."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = keys

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, presented: str) -> ApiKey | None:
        """Return the key ``presented`` matches, comparing its digest with every key's in constant time."""
        digest = _digest(presented)
        found = None
        for key in self._keys:  # no early exit: the time taken does not say which key, or how much, matched
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found


def parse_api_keys(spec: str) -> KeyRing:
    """Parse ``key=per_minute,key2``; raise KeyConfigError naming the first entry that is wrong."""
    found: list[ApiKey] = []
    seen: set[bytes] = set()
    for position, item in enumerate((part.strip() for part in spec.split(",")), start=1):
        if not item:
            if spec.strip():
                raise KeyConfigError(f"TTS_API_KEYS entry {position} is empty: remove the extra comma")
            continue
        key, per_minute = _parse_entry(position, item)
        digest = _digest(key)
        if digest in seen:
            raise KeyConfigError(f"TTS_API_KEYS entry {position} ({_masked(key)}) repeats an earlier key")
        seen.add(digest)
        found.append(ApiKey(digest=digest, caller=caller_id(key), per_minute=per_minute))
    return KeyRing(found)
